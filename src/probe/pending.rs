//! A lane's timed calls held for the histograms and the history, recorded in batches.
//!
//! Recording each call where it ends touched the lane's histogram buckets and history
//! ring every cycle: at 64 targets those cache lines are cold again by the next cycle,
//! and fetching them was most of the agent's cost above the system calls themselves
//! (BENCHMARKS.md, "CPU at the syscall floor"). A lane holds its calls here instead and
//! records them all at once when the buffer is full, before its own stall's exemplar is
//! recorded, and whenever a reader is about to look: a scrape and `/api/history` fold
//! every lane first, so what they read is never behind.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::metrics::LaneSeries;
use crate::base::labels::{Mode, Op};
use crate::base::sync::lock;
use crate::history::TargetHistory;

/// Calls held before the lane records them itself: 16 cycles of a `direct` lane, 8 of
/// an overwrite or append lane, 4 to 5 of a create lane.
const CAPACITY: usize = 16;

/// One successful call, as the histograms and the history record it.
struct Call {
    op: Op,
    elapsed: Duration,
    /// The wall clock when it returned.
    at: SystemTime,
}

/// Where a lane's calls are recorded: its duration series and its target's history.
struct Sink {
    mode: Mode,
    series: LaneSeries,
    history: Option<Arc<TargetHistory>>,
}

#[derive(Default)]
struct Held {
    sink: Option<Sink>,
    /// At most [`CAPACITY`], allocated once by [`Pending::set_sink`].
    calls: Vec<Call>,
}

impl Held {
    fn fold(&mut self) {
        match &self.sink {
            Some(sink) => self.calls.drain(..).for_each(|c| sink.record(&c, None)),
            None => self.calls.clear(),
        }
    }
}

impl Sink {
    fn record(&self, c: &Call, stall_id: Option<String>) {
        self.series
            .observe(c.op, c.elapsed, stall_id.map(|id| (id, c.at)));
        if let Some(h) = &self.history {
            h.record(self.mode, c.op, c.elapsed, c.at);
        }
    }
}

/// The calls a lane has timed and not yet recorded.
#[derive(Default)]
pub struct Pending(Mutex<Held>);

impl Pending {
    /// Where the lane's calls go; calls pushed before are dropped.
    pub(super) fn set_sink(
        &self,
        mode: Mode,
        series: LaneSeries,
        history: Option<Arc<TargetHistory>>,
    ) {
        let mut held = lock(&self.0);
        held.calls.clear();
        held.calls.reserve_exact(CAPACITY);
        held.sink = Some(Sink {
            mode,
            series,
            history,
        });
    }

    /// Holds a successful call of `op` that returned at `at` after `elapsed`; records
    /// every held call when the buffer is full.
    pub(super) fn push(&self, op: Op, elapsed: Duration, at: SystemTime) {
        let mut held = lock(&self.0);
        if held.calls.len() == CAPACITY {
            held.fold();
        }
        held.calls.push(Call { op, elapsed, at });
    }

    /// Records the held calls, then this one, a call that became stall `stall_id`, with
    /// its exemplar.
    pub(super) fn push_stall(&self, op: Op, elapsed: Duration, at: SystemTime, stall_id: String) {
        let mut held = lock(&self.0);
        held.fold();
        if let Some(sink) = &held.sink {
            sink.record(&Call { op, elapsed, at }, Some(stall_id));
        }
    }

    /// Records every held call.
    pub fn fold(&self) {
        lock(&self.0).fold();
    }

    /// Drops the held calls unrecorded: the lane's target was removed or the agent is
    /// stopping, and its series must not be written again.
    pub(super) fn discard(&self) {
        lock(&self.0).calls.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exposition::registry::Registry;
    use crate::probe::metrics::ProbeMetrics;

    #[test]
    fn calls_are_recorded_when_full_when_a_stall_comes_and_when_folded() {
        let m = ProbeMetrics::new(&Registry::new());
        let series = m.lane_series("t", Mode::Overwrite, &[Op::Write, Op::Fsync]);
        let p = Pending::default();
        p.set_sink(Mode::Overwrite, series, None);
        let count = || m.observed("t", Mode::Overwrite, Op::Fsync);
        let now = SystemTime::now();
        let ms = Duration::from_millis(1);

        for _ in 0..CAPACITY {
            p.push(Op::Fsync, ms, now);
        }
        assert_eq!(count(), 0, "held until the buffer overflows");
        p.push(Op::Fsync, ms, now);
        assert_eq!(count(), CAPACITY as u64, "a full buffer is recorded");

        p.push_stall(Op::Fsync, Duration::from_secs(2), now, "s1".into());
        assert_eq!(
            count(),
            CAPACITY as u64 + 2,
            "a stall records the held call first"
        );

        p.push(Op::Fsync, ms, now);
        p.fold();
        assert_eq!(count(), CAPACITY as u64 + 3);
        p.fold();
        assert_eq!(count(), CAPACITY as u64 + 3, "a call is recorded once");

        p.push(Op::Fsync, ms, now);
        p.discard();
        p.fold();
        assert_eq!(
            count(),
            CAPACITY as u64 + 3,
            "discarded calls are not recorded"
        );
    }
}
