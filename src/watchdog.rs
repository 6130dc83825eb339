//! The watchdog thread: looks at every lane's in-flight slot and counts, live, the
//! cycles that came due while one is blocked and the operations that cross their stall
//! threshold, while the call may still be in the kernel; for each stall it gathers the
//! other lanes of the target blocked at the same time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::probe::Targets;
use crate::stalls::{LaneKey, StallLog};
use crate::sync::Shutdown;

/// The shortest pause between two looks of the watchdog at the in-flight slots.
pub const MIN_SLEEP: Duration = Duration::from_millis(1);

/// The longest pause between two looks, whatever the thresholds.
pub const MAX_SLEEP: Duration = Duration::from_secs(1);

/// Runs until shutdown.
pub fn run(targets: Arc<Targets>, stalls: Arc<StallLog>, shutdown: Arc<Shutdown>) {
    // When to look next: at the exact moment an operation in flight would cross its
    // threshold, at a running cycle's next due time (to count the skip live), and
    // otherwise after the smallest threshold: an operation that starts just after a
    // look is then seen in flight before it can cross, and its crossing is scheduled
    // exactly. Idle, the agent wakes once per threshold, not many times a second.
    loop {
        // Read again at every look: a reload may have changed the targets.
        let targets = targets.current();
        let idle = targets
            .iter()
            .map(|t| t.target.stall_threshold)
            .min()
            .unwrap_or(MAX_SLEEP)
            .clamp(MIN_SLEEP, MAX_SLEEP);
        let now = Instant::now();
        let mut wake = now + idle;
        for t in targets.iter() {
            let threshold = t.target.stall_threshold;
            for lane in &t.lanes {
                if let Some(due) = lane.count_overdue(t.target.interval) {
                    wake = wake.min(due);
                }
                let Some(op) = lane.inflight.current() else {
                    continue;
                };
                if op.age >= threshold {
                    let key = LaneKey {
                        target: t.index,
                        lane: lane.id,
                        name: &t.target.name,
                    };
                    stalls.crossed(key, op, &t.blocked_besides(lane));
                } else {
                    wake = wake.min(op.started + threshold);
                }
            }
        }
        if shutdown.sleep_until(wake.max(now + MIN_SLEEP)) {
            return;
        }
    }
}
