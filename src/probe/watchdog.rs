//! The watchdog thread: looks at every lane's in-flight slot and counts, live, the
//! cycles that came due while one is blocked and the operations that cross their stall
//! threshold, while the call may still be in the kernel; for each stall it gathers the
//! other lanes of the target blocked at the same time, and hands the stall log the
//! devices beneath the target (`devices.rs`). It also samples the wait point of
//! every call blocked past its sampling point (`stall/waits.rs`), so the cause is known when the
//! threshold is crossed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::devices::Devices;
use super::target::Targets;
use crate::base::sync::Shutdown;
use crate::stall::log::{LaneKey, StallLog};
use crate::stall::waits::{self, Reader};

/// The shortest pause between two looks of the watchdog at the in-flight slots.
pub const MIN_SLEEP: Duration = Duration::from_millis(1);

/// The longest pause between two looks, whatever the thresholds.
pub const MAX_SLEEP: Duration = Duration::from_secs(1);

/// Runs until shutdown.
pub fn run(
    targets: Arc<Targets>,
    devices: Arc<Devices>,
    stalls: Arc<StallLog>,
    shutdown: Arc<Shutdown>,
) {
    // When to look next: at the exact moment an operation in flight would cross its
    // threshold, at a running cycle's next due time (to count the skip live), and
    // otherwise after the smallest threshold: an operation that starts just after a
    // look is then seen in flight before it can cross, and its crossing is scheduled
    // exactly. Idle, the agent wakes once per threshold, not many times a second.
    //
    // A call seen in flight before its sampling point (a quarter of the threshold) gets
    // a wake at that point instead of at its crossing; from there it is sampled every
    // `waits::SAMPLE_PERIOD` while it lasts. The idle period stays one threshold, so a
    // quiet agent (whose calls take microseconds and are almost never in flight at a
    // look) wakes and reads exactly as without sampling: no read of procfs unless a call
    // is blocked past its sampling point (BENCHMARKS.md, "Diagnosis (issue 12)"). The
    // price: a call that starts just after a look is first seen up to one idle period
    // later, so its first sample may come late in its first threshold (at the crossing at
    // the latest, taken before the crossing is counted).
    let reader = Reader::default();
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
                let sample_at = waits::sampling_point(threshold);
                if op.age >= sample_at {
                    let next =
                        lane.waits
                            .sample_if_due(&reader, op.seq, op.started, Instant::now());
                    wake = wake.min(next);
                }
                if op.age >= threshold {
                    let devices = devices.of(t.index);
                    let key = LaneKey {
                        devices: &devices,
                        lane: lane.id,
                        name: &t.target.name,
                    };
                    let samples = lane.waits.of(op.seq);
                    stalls.crossed(key, op, &t.blocked_besides(lane), samples.as_ref());
                } else if op.age >= sample_at {
                    wake = wake.min(op.started + threshold);
                } else {
                    wake = wake.min(op.started + sample_at);
                }
            }
        }
        if shutdown.sleep_until(wake.max(now + MIN_SLEEP)) {
            return;
        }
    }
}
