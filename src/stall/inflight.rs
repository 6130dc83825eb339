//! The in-flight slot: which operation a probe thread has in the kernel right now and
//! since when, written lock-free by that thread and read by the scrape, the watchdog and
//! the landing page, none of which may ever wait on it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use strum::VariantArray;

use crate::base::labels::{Mode, Op};

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds from the process epoch to `t`, plus one so that 0 can mean "nothing".
fn ns_of(t: Instant) -> u64 {
    t.saturating_duration_since(epoch()).as_nanos() as u64 + 1
}

/// The operation a probe thread has in flight, as other threads see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlightOp {
    pub mode: Mode,
    pub op: Op,
    /// Increments with every operation; identifies one call across threads.
    pub seq: u64,
    pub started: Instant,
    pub age: Duration,
}

/// Lock-free record of the operation in flight, written only by its probe thread.
#[derive(Default)]
pub struct InflightSlot {
    started: AtomicU64,
    what: AtomicU64,
    seq: AtomicU64,
}

impl InflightSlot {
    /// Marks `op` of `mode` as entering the kernel now; returns its sequence number.
    pub fn begin(&self, mode: Mode, op: Op) -> u64 {
        self.begin_at(mode, op, Instant::now())
    }

    /// Marks `op` of `mode` as entering the kernel at `started` (the caller's timer
    /// read the clock already); returns its sequence number.
    pub fn begin_at(&self, mode: Mode, op: Op, started: Instant) -> u64 {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        // Discriminants are the positions in VARIANTS (declaration order): no search.
        let what = ((mode as u64) << 8) | op as u64;
        self.what.store(what, Ordering::Relaxed);
        self.started.store(ns_of(started), Ordering::Release);
        seq
    }

    /// The operation returned.
    pub fn end(&self) {
        self.started.store(0, Ordering::Release);
    }

    /// The operation in flight right now, if any.
    pub fn current(&self) -> Option<InFlightOp> {
        let started = self.started.load(Ordering::Acquire);
        if started == 0 {
            return None;
        }
        let what = self.what.load(Ordering::Relaxed);
        let seq = self.seq.load(Ordering::Relaxed);
        // A new op may have begun between the loads; then this reading is stale.
        if self.started.load(Ordering::Acquire) != started {
            return None;
        }
        let started = epoch() + Duration::from_nanos(started - 1);
        Some(InFlightOp {
            mode: *Mode::VARIANTS.get((what >> 8) as usize)?,
            op: *Op::VARIANTS.get((what & 0xff) as usize)?,
            seq,
            started,
            age: started.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_and_op_round_trips_through_the_slot() {
        let slot = InflightSlot::default();
        assert_eq!(slot.current(), None);
        let mut last = 0;
        for &mode in Mode::VARIANTS {
            for &op in Op::VARIANTS {
                let seq = slot.begin(mode, op);
                assert!(seq > last, "sequence numbers increase");
                last = seq;
                let now = slot.current().expect("in flight");
                assert_eq!((now.mode, now.op, now.seq), (mode, op, seq));
                slot.end();
                assert_eq!(slot.current(), None);
            }
        }
    }

    #[test]
    fn age_grows_while_in_flight() {
        let slot = InflightSlot::default();
        slot.begin(Mode::Overwrite, Op::Fsync);
        let a = slot.current().unwrap().age;
        std::thread::sleep(Duration::from_millis(5));
        let b = slot.current().unwrap().age;
        assert!(b >= a + Duration::from_millis(5), "{a:?} then {b:?}");
    }
}
