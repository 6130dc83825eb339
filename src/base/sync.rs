//! The two synchronisation pieces every thread of the agent shares: a mutex lock that
//! survives poisoning, and the shutdown flag that wakes sleeping threads at once.

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
    cv: Condvar,
}

impl Shutdown {
    pub fn trigger(&self) {
        *lock(&self.stop) = true;
        self.cv.notify_all();
    }

    pub fn is_set(&self) -> bool {
        *lock(&self.stop)
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
            stop = self
                .cv
                .wait_timeout(stop, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}
