//! The two synchronisation pieces every thread of the agent shares: a mutex lock that
//! survives poisoning, and the shutdown flag that wakes sleeping threads at once.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use rustix::io::Errno;
use rustix::thread::futex;
use rustix::time::{clock_gettime, ClockId, Timespec};

/// Locks a mutex, ignoring poisoning: the data behind our locks stays consistent
/// even if a holder panicked, and the agent must keep answering.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Stop flag that sleeping threads wait on directly: the flag is the futex word, so a
/// sleep is one `futex` call with an absolute deadline (no lock, no clock read; the
/// lanes sleep once a cycle), and a stop set just before the wait is seen by the
/// kernel's check of the word.
#[derive(Default)]
pub struct Shutdown {
    /// 0 running, 1 stopping.
    stop: AtomicU32,
}

impl Shutdown {
    pub fn trigger(&self) {
        self.stop.store(1, Ordering::Release);
        let _ = futex::wake(&self.stop, futex::Flags::PRIVATE, i32::MAX as u32);
    }

    pub fn is_set(&self) -> bool {
        self.stop.load(Ordering::Acquire) != 0
    }

    /// Sleeps until `deadline` or shutdown; returns true when shutting down.
    pub fn sleep_until(&self, deadline: Instant) -> bool {
        let Some(at) = monotonic(deadline) else {
            return self.is_set();
        };
        // Bounded: a wake-up that is neither the stop nor the deadline is spurious
        // (a signal), and a deadline passed makes the kernel return at once.
        loop {
            if self.is_set() {
                return true;
            }
            let r = futex::wait_bitset(
                &self.stop,
                futex::Flags::PRIVATE,
                0,
                Some(&at),
                // FUTEX_BITSET_MATCH_ANY: any waker.
                NonZeroU32::MAX,
            );
            match r {
                Err(Errno::TIMEDOUT) => return self.is_set(),
                // Woken (by `trigger`), the word was no longer 0, or a signal: look again.
                Ok(()) | Err(Errno::AGAIN) | Err(Errno::INTR) => {}
                // Not expected of a private futex; sleep the rest as a plain sleep would.
                Err(_) => {
                    std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
                    return self.is_set();
                }
            }
        }
    }
}

/// `t` as a CLOCK_MONOTONIC time (the clock of `Instant` on Linux), for an absolute
/// futex deadline; None when it is before the first call (so already past). The two
/// clocks are read once, the `Instant` first: the time returned is at or after `t`.
fn monotonic(t: Instant) -> Option<Timespec> {
    static BASE: OnceLock<(Instant, Timespec)> = OnceLock::new();
    let (i0, ts0) = BASE.get_or_init(|| {
        let i0 = Instant::now();
        (i0, clock_gettime(ClockId::Monotonic))
    });
    let d = t.checked_duration_since(*i0)?;
    let ns = ts0.tv_nsec as u64 + d.subsec_nanos() as u64;
    Some(Timespec {
        tv_sec: ts0.tv_sec + d.as_secs() as i64 + (ns / 1_000_000_000) as i64,
        tv_nsec: (ns % 1_000_000_000) as _,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_sleep_ends_at_its_deadline_or_at_once_on_shutdown() {
        let s = Arc::new(Shutdown::default());
        let deadline = Instant::now() + Duration::from_millis(20);
        assert!(!s.sleep_until(deadline));
        assert!(Instant::now() >= deadline, "not before the deadline");
        assert!(!s.is_set());
        let t = {
            let s = Arc::clone(&s);
            std::thread::spawn(move || s.sleep_until(Instant::now() + Duration::from_secs(60)))
        };
        std::thread::sleep(Duration::from_millis(20));
        s.trigger();
        assert!(t.join().unwrap(), "woken by the shutdown");
        assert!(s.is_set());
        assert!(s.sleep_until(Instant::now() + Duration::from_secs(60)));
    }
    #[test]
    fn a_deadline_already_past_returns_at_once() {
        let s = Shutdown::default();
        let long_ago = Instant::now() - Duration::from_millis(1);
        let t0 = Instant::now();
        assert!(!s.sleep_until(long_ago));
        assert!(!s.sleep_until(Instant::now()));
        assert!(t0.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn an_instant_maps_to_the_monotonic_clock_at_or_just_after_it() {
        let _ = monotonic(Instant::now());
        let ns = |t: Timespec| t.tv_sec as i128 * 1_000_000_000 + t.tv_nsec as i128;
        let before = ns(clock_gettime(ClockId::Monotonic));
        let at = ns(monotonic(Instant::now()).unwrap());
        let after = ns(clock_gettime(ClockId::Monotonic));
        assert!(at >= before, "{at} before {before}");
        assert!(at < after + 1_000_000, "{at} more than 1 ms after {after}");
    }
}
