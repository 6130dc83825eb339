//! The watchdog thread: looks at every target's in-flight slot and counts, live, the
//! cycles that came due while one is blocked and the operations that cross their stall
//! threshold, while the call may still be in the kernel.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::probe::TargetShared;
use crate::stalls::StallLog;
use crate::sync::Shutdown;

/// The shortest pause between two looks of the watchdog at the in-flight slots.
pub const MIN_SLEEP: Duration = Duration::from_millis(1);

/// The longest pause between two looks, whatever the thresholds.
pub const MAX_SLEEP: Duration = Duration::from_secs(1);

/// Runs until shutdown.
pub fn run(targets: Vec<Arc<TargetShared>>, stalls: Arc<StallLog>, shutdown: Arc<Shutdown>) {
    // When to look next: at the exact moment an operation in flight would cross its
    // threshold, at a running cycle's next due time (to count the skip live), and
    // otherwise after the smallest threshold: an operation that starts just after a
    // look is then seen in flight before it can cross, and its crossing is scheduled
    // exactly. Idle, the agent wakes once per threshold, not many times a second.
    let idle = targets
        .iter()
        .map(|t| t.target.stall_threshold)
        .min()
        .unwrap_or(MAX_SLEEP)
        .clamp(MIN_SLEEP, MAX_SLEEP);
    loop {
        let now = Instant::now();
        let mut wake = now + idle;
        for t in &targets {
            if let Some(due) = t.count_overdue() {
                wake = wake.min(due);
            }
            if let Some(op) = t.inflight.current() {
                if op.age >= t.target.stall_threshold {
                    stalls.crossed(t.index, &t.target.name, op);
                } else {
                    wake = wake.min(op.started + t.target.stall_threshold);
                }
            }
        }
        if shutdown.sleep_until(wake.max(now + MIN_SLEEP)) {
            return;
        }
    }
}
