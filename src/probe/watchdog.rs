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
        let lanes: Vec<LaneView> = current
            .iter()
            .flat_map(|t| t.lanes.iter().map(move |lane| LaneView::new(t, lane)))
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
/// beside it: a look at an idle lane reads this entry and the lane's first cache line
/// (its in-flight slot and schedule), and nothing of its target. Reading each target
/// anew at every look, the watchdog took 0.0045–0.0080 % of a core at 64 targets,
/// 0.0033–0.0066 % since (BENCHMARKS.md, "CPU at the syscall floor", r30).
struct LaneView<'a> {
    target: &'a TargetShared,
    lane: &'a Lane,
    threshold: Duration,
    interval: Duration,
}

impl<'a> LaneView<'a> {
    fn new(target: &'a TargetShared, lane: &'a Lane) -> LaneView<'a> {
        LaneView {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::labels::{Mode, Op, SyncKind};
    use crate::config::Target;
    use crate::exposition::registry::Registry;
    use crate::probe::ProbeMetrics;
    use std::path::PathBuf;

    const THRESHOLD: Duration = Duration::from_millis(50);

    fn target(name: &str, index: usize, first_lane: usize, m: &ProbeMetrics) -> Arc<TargetShared> {
        let t = Target {
            name: name.into(),
            path: PathBuf::from("/nonexistent"),
            interval: Duration::from_secs(3600),
            modes: vec![Mode::Create, Mode::Overwrite],
            size: 4096,
            sync: SyncKind::Fdatasync,
            require_mountpoint: false,
            stall_threshold: THRESHOLD,
            rotate_size: 64 << 10,
        };
        Arc::new(TargetShared::new(index, t, first_lane, m))
    }

    fn wait_for(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !done() {
            assert!(Instant::now() < deadline, "not within 5 s: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The watchdog keeps its list of lanes from one reload to the next: a target a
    /// reload adds is looked at, one it removes no longer.
    #[test]
    fn a_target_added_by_a_reload_is_watched_and_a_removed_one_no_longer() {
        let registry = Registry::new();
        let metrics = ProbeMetrics::new(&registry);
        let stalls = Arc::new(StallLog::new(16, &registry, Arc::default()));
        let a = target("a", 0, 0, &metrics);
        let targets = Arc::new(Targets::new(vec![Arc::clone(&a)]));
        let shutdown = Arc::new(Shutdown::default());
        let watchdog = std::thread::spawn({
            let (t, s, sd) = (
                Arc::clone(&targets),
                Arc::clone(&stalls),
                Arc::clone(&shutdown),
            );
            move || run(t, Arc::default(), s, sd)
        });
        let count = |name: &str, mode, op| stalls.count_of(name, mode, op);
        let long_ago = Instant::now() - 2 * THRESHOLD;
        a.lanes[1]
            .inflight
            .begin_at(Mode::Overwrite, Op::Fdatasync, long_ago);
        wait_for("a's blocked fsync counted", || {
            count("a", Mode::Overwrite, Op::Fdatasync) == 1
        });

        // A reload removes a and adds b; b's lane is blocked from now on.
        let b = target("b", 1, 2, &metrics);
        targets.replace(vec![Arc::clone(&b)]);
        b.lanes[0]
            .inflight
            .begin_at(Mode::Create, Op::Create, Instant::now());
        wait_for("b's blocked create counted once it crossed", || {
            count("b", Mode::Create, Op::Create) == 1
        });

        // A new blocked call in a's lane would be a second stall, if a were looked at.
        a.lanes[1].inflight.end();
        a.lanes[1]
            .inflight
            .begin_at(Mode::Overwrite, Op::Fdatasync, long_ago);
        std::thread::sleep(6 * THRESHOLD);
        assert_eq!(
            count("a", Mode::Overwrite, Op::Fdatasync),
            1,
            "a removed target's lanes are not looked at"
        );
        shutdown.trigger();
        watchdog.join().unwrap();
    }
}
