//! Bounded polling.

use std::thread;
use std::time::{Duration, Instant};

/// Poll `f` every `poll` until it returns true (→ true) or `timeout` passes (→ false;
/// `f` is evaluated one last time at the deadline).
pub fn wait_until(timeout: Duration, poll: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        thread::sleep(poll.min(deadline - now));
    }
}
