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
use super::target::{Lane, TargetShared, Targets};
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
        // The lanes of the targets probed now, looked at until a reload replaces them.
        let current = targets.current();
        let lanes: Vec<Watched> = current
            .iter()
            .flat_map(|t| t.lanes.iter().map(move |lane| Watched::new(t, lane)))
            .collect();
        let idle = lanes
            .iter()
            .map(|w| w.threshold)
            .min()
            .unwrap_or(MAX_SLEEP)
            .clamp(MIN_SLEEP, MAX_SLEEP);
        loop {
            let now = Instant::now();
            let mut wake = now + idle;
            for w in &lanes {
                wake = wake.min(w.look(now, &reader, &devices, &stalls));
            }
            if shutdown.sleep_until(wake.max(now + MIN_SLEEP)) {
                return;
            }
            if !Arc::ptr_eq(&targets.current(), &current) {
                break;
            }
        }
    }
}

/// A lane as the watchdog looks at it, with its target's threshold and interval
/// beside it: a look at an idle lane reads the lane's first cache line (its in-flight
/// slot and schedule) and nothing of its target (at 64 targets a look read ~250 lines
/// cold after a second, ~65 µs; BENCHMARKS.md, "CPU at the syscall floor").
struct Watched<'a> {
    target: &'a TargetShared,
    lane: &'a Lane,
    threshold: Duration,
    interval: Duration,
}

impl<'a> Watched<'a> {
    fn new(target: &'a TargetShared, lane: &'a Lane) -> Watched<'a> {
        Watched {
            target,
            lane,
            threshold: target.target.stall_threshold,
            interval: target.target.interval,
        }
    }

    /// Looks at the lane at `now`: counts the cycles due while one runs, samples the
    /// wait point of a call blocked past its sampling point, counts a call past its
    /// threshold as a stall. Returns when to look again for this lane's sake.
    fn look(&self, now: Instant, reader: &Reader, devices: &Devices, stalls: &StallLog) -> Instant {
        let (t, lane, threshold) = (self.target, self.lane, self.threshold);
        let mut wake = now + MAX_SLEEP;
        if let Some(due) = lane.count_overdue(now, self.interval) {
            wake = wake.min(due);
        }
        let Some(op) = lane.inflight.current() else {
            return wake;
        };
        let sample_at = waits::sampling_point(threshold);
        if op.age >= sample_at {
            let next = lane
                .waits
                .sample_if_due(reader, op.seq, op.started, Instant::now());
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
        wake
    }
}
