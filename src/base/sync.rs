//! The two synchronisation pieces every thread of the agent shares: a mutex lock that
//! survives poisoning, and the shutdown flag that wakes sleeping threads at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// Locks a mutex, ignoring poisoning: the data behind our locks stays consistent
/// even if a holder panicked, and the agent must keep answering.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Stop flag with a condition variable, so sleeping threads wake at once.
#[derive(Default)]
pub struct Shutdown {
    stop: Mutex<bool>,
    /// The same flag, for `is_set` without the lock: the lanes ask after every call.
    set: AtomicBool,
    cv: Condvar,
}

impl Shutdown {
    pub fn trigger(&self) {
        let mut stop = lock(&self.stop);
        *stop = true;
        self.set.store(true, Ordering::Release);
        drop(stop);
        self.cv.notify_all();
    }

    pub fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }

    /// Sleeps until `deadline` or shutdown; returns true when shutting down.
    pub fn sleep_until(&self, deadline: Instant) -> bool {
        let mut stop = lock(&self.stop);
        loop {
            if *stop {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            let (guard, waited) = self
                .cv
                .wait_timeout(stop, deadline - now)
                .unwrap_or_else(|e| e.into_inner());
            stop = guard;
            // Timed out: the deadline has passed (the wait's own clock said so), no
            // need to read the clock again. Woken early: look again.
            if waited.timed_out() && !*stop {
                return false;
            }
        }
    }
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
}
