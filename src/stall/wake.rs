//! The evidence worker's wake-up: the stall log notifies it when a stall starts or ends
//! (or a target goes), the worker (`worker.rs`) sleeps on it, and the agent closes it at
//! shutdown. The worker side owns it; the log is only handed it to notify.

use std::sync::{Condvar, Mutex};
use std::time::Instant;

use crate::base::sync::lock;

/// A change counter and a closed flag under one lock, with a condition variable.
#[derive(Default)]
pub struct Wake {
    /// (changes so far, closed)
    state: Mutex<(u64, bool)>,
    cv: Condvar,
}

impl Wake {
    /// A stall started or ended: wakes the worker.
    pub fn notify(&self) {
        lock(&self.state).0 += 1;
        self.cv.notify_all();
    }

    /// Blocks the evidence worker until a change after `seen`, or until `until`; returns
    /// the latest change number, None once closed.
    pub fn wait(&self, seen: u64, until: Option<Instant>) -> Option<u64> {
        let mut st = lock(&self.state);
        loop {
            if st.1 {
                return None;
            }
            if st.0 != seen {
                return Some(st.0);
            }
            st = match until {
                None => self.cv.wait(st).unwrap_or_else(|e| e.into_inner()),
                Some(t) => {
                    let now = Instant::now();
                    if now >= t {
                        return Some(st.0);
                    }
                    self.cv
                        .wait_timeout(st, t - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
    }

    /// Ends the worker's wait for good (shutdown).
    pub fn close(&self) {
        lock(&self.state).1 = true;
        self.cv.notify_all();
    }
}
