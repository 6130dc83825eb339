//! The thread of one lane: runs its cycles at the target's interval, times each call
//! (`ops.rs`) and reports it to the in-flight slot, the stall log and its pending calls,
//! which go to the histograms and the history in batches (`pending.rs`).

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tracing::{info, warn};

use super::metrics::LaneSeries;
use super::ops::{self, probe_dir_of, Observer, OpError};
use super::target::{Context, Lane, Outcome, TargetShared};
use crate::base::errno::Errno;
use crate::base::labels::{Failure, Mode, Op};
use crate::base::sync::lock;
use crate::kernel::mounts::MountWatch;
use crate::stall::log::{FinishedCall, LaneKey};

/// Reports each timed call to the in-flight slot, the lane's pending calls (for the
/// histogram and the history) and the stall log.
struct Recorder<'a> {
    target: &'a TargetShared,
    lane: &'a Lane,
    ctx: &'a Context,
    seq: Cell<u64>,
    /// A wall-clock time and the monotonic time it was read at, once per cycle: the
    /// wall time of each call's end is derived from it, not read again per call.
    wall: Cell<Option<(Instant, SystemTime)>>,
}

impl Recorder<'_> {
    /// The wall-clock time at monotonic time `at`, from the cycle's one reading of the
    /// wall clock (the first call that asks reads it). `fresh` reads it again, after a
    /// call that took long enough for the wall clock to have been set meanwhile.
    fn wall_at(&self, at: Instant, fresh: bool) -> SystemTime {
        match self.wall.get() {
            Some((t0, w0)) if !fresh && at >= t0 => w0 + (at - t0),
            _ => {
                let now = SystemTime::now();
                self.wall.set(Some((at, now)));
                now
            }
        }
    }
}

impl Observer for Recorder<'_> {
    fn begin(&self, mode: Mode, op: Op, started: Instant) {
        self.seq.set(self.lane.inflight.begin_at(mode, op, started));
    }

    fn end(&self, mode: Mode, op: Op, elapsed: Duration, failure: Option<Failure>, ended: Instant) {
        self.lane.inflight.end();
        if self.target.stop.is_set() {
            // Removed by a reload (its series are gone) or shutting down: record nothing.
            return;
        }
        let t = &self.target.target;
        // A call that became a stall: counted first, so its observation carries the
        // event's id as an exemplar.
        let stall_id = (elapsed >= t.stall_threshold)
            .then(|| {
                let devices = self.ctx.devices.of(self.target.index);
                let key = LaneKey {
                    devices: &devices,
                    lane: self.lane.id,
                    name: &t.name,
                };
                let others = self.target.blocked_besides(self.lane);
                let seq = self.seq.get();
                let call = FinishedCall {
                    mode,
                    op,
                    seq,
                    elapsed,
                    failure,
                    waits: self.lane.waits.of(seq),
                };
                self.ctx.stalls.finished(key, call, &others)
            })
            .flatten();
        if failure.is_none() && op != Op::Prepare {
            // A stall's exemplar carries the wall clock read when it returned.
            let now = self.wall_at(ended, stall_id.is_some() || elapsed >= t.stall_threshold);
            // Held and recorded in batches (`pending.rs`); a stall at once, with its
            // exemplar.
            match stall_id {
                None => self.lane.pending.push(op, elapsed, now),
                Some(id) => self.lane.pending.push_stall(op, elapsed, now, id),
            }
        }
    }
}

/// The thread of one lane.
pub struct Worker {
    target: Arc<TargetShared>,
    /// Index of the lane in `target.lanes`.
    lane: usize,
    ctx: Arc<Context>,
    cleaned_leftovers: bool,
    /// The probe directory was opened once: finding it missing later is news.
    had_dir: bool,
    seq: u64,
    /// The series this lane writes each cycle, looked up once.
    series: LaneSeries,
    /// The last mount check that passed: the mount table's generation it was made in,
    /// whether the mount is read-only, and the mount id the probe directory must be on.
    mount_ok: Option<(u64, bool, Option<u64>)>,
    /// The lane's own watch on the mounts, polled each cycle without a lock; the shared
    /// table is asked only when it says they changed.
    mount_watch: MountWatch,
    /// The mount table's generation as of the last change the watch reported.
    generation: Option<u64>,
    /// The latencies of the cycle, kept from cycle to cycle (no allocation per cycle).
    latencies: ops::Latencies,
}

impl Worker {
    /// The worker of lane number `lane` of `target`.
    pub fn new(target: Arc<TargetShared>, lane: usize, ctx: Arc<Context>) -> Worker {
        if lane == 0 {
            ctx.stalls.add_target(&target.target.name, &target.ops);
            ctx.history.add_target(
                target.index,
                &target.target.name,
                &target.ops,
                target.target.interval,
            );
        }
        let l = &target.lanes[lane];
        let series = ctx.metrics.lane_series(&target.target.name, l.mode, l.ops);
        // The target's history: lane 0 created it, before the others.
        l.pending
            .set_sink(l.mode, series.clone(), ctx.history.target(target.index));
        let mount_watch = MountWatch::new(&ctx.roots.proc_root);
        Worker {
            target,
            lane,
            ctx,
            cleaned_leftovers: false,
            had_dir: false,
            seq: 0,
            series,
            mount_ok: None,
            mount_watch,
            generation: None,
            latencies: Vec::with_capacity(5),
        }
    }

    fn lane(&self) -> &Lane {
        &self.target.lanes[self.lane]
    }

    /// Runs cycles at the target's interval until shutdown, then removes its files.
    pub fn run(mut self) {
        // Other threads sample this thread's wait point while a call is blocked.
        self.lane().waits.set_tid_here();
        let interval = self.target.target.interval;
        let mut due = lock(&self.lane().sched).next_due;
        loop {
            if self.target.stop.sleep_until(due) {
                break;
            }
            {
                let mut s = lock(&self.lane().sched);
                s.running = true;
                s.next_due += interval;
            }
            self.cycle();
            due = self.lane().end_cycle(interval);
        }
        self.cleanup();
    }

    fn cycle(&mut self) {
        let target = Arc::clone(&self.target);
        let lane = &target.lanes[self.lane];
        let (name, mode) = (target.target.name.as_str(), lane.mode);
        // Borrowed, not cloned: one reference count shared by every lane, which all
        // wake together, would move between the CPUs' caches at every cycle.
        let m = &self.ctx.metrics;
        // While the mount table is the one the last check passed in, the check would
        // find the same mount again (its path, mount and expected filesystem are kept
        // per generation): reuse its result rather than copy the mount out each cycle.
        // The lanes wake together: polling the shared table's descriptor under its lock
        // made them queue for it (a futex wait and a context switch each time two
        // met). The lane's own descriptor tells it without a lock whether the table
        // has to be asked; it is opened before the first ask, so no change is missed.
        if self.mount_watch.changed() || self.generation.is_none() {
            self.generation = self.ctx.mount_generation();
        }
        let generation = self.generation;
        let (mount_read_only, want_id) = match self.mount_ok {
            Some((g, ro, id)) if Some(g) == generation => (ro, id),
            _ => match target.check_mount(&self.ctx.mounts) {
                Ok((mount, want_id)) => {
                    target.update_mount_info(&self.ctx, &mount);
                    let ro = mount.as_ref().is_some_and(|m| m.read_only());
                    // A check that found no mount (a path that does not resolve yet,
                    // allowed without require_mountpoint) is made again each cycle.
                    self.mount_ok = generation
                        .filter(|_| mount.is_some())
                        .map(|g| (g, ro, want_id));
                    (ro, want_id)
                }
                Err(reason) => {
                    self.mount_ok = None;
                    // Retired while the check was held (a hung filesystem): its series
                    // are gone and must not come back.
                    if target.stop.is_set() {
                        return;
                    }
                    m.skipped(name, reason).inc();
                    m.lane_skipped(name, mode, reason).inc();
                    self.series.set_up(false);
                    lock(&lane.state).outcome = Outcome::None;
                    m.set_up(name, false);
                    return;
                }
            },
        };
        self.seq += 1;
        let spec = ops::CycleSpec {
            size: target.target.size,
            sync: target.target.sync,
            rotate_size: target.target.rotate_size,
            seq: self.seq,
        };
        let rec = Recorder {
            target: &target,
            lane,
            ctx: &self.ctx,
            seq: Cell::new(0),
            wall: Cell::new(None),
        };
        let result = match self.open_dir(want_id, &rec) {
            Ok(dir) => {
                // Removed between two cycles: nothing failed, so nothing is counted,
                // but someone is deleting our directory and should hear of it.
                if dir.created && self.had_dir {
                    warn!(target = %name, mode = %mode, path = %probe_dir_of(&target.target.path).display(),
                        "the probe directory had vanished since the last cycle; created it again");
                }
                self.had_dir = true;
                if !self.cleaned_leftovers {
                    // Each lane removes its own mode's leftovers; the first lane also
                    // those of modes the target no longer runs.
                    let modes = &target.target.modes;
                    let first = self.lane == 0;
                    let n = dir.remove_files_of(|m| m == mode || (first && !modes.contains(&m)));
                    if n > 0 {
                        info!(target = %name, mode = %mode, files = n,
                            "removed leftover probe files of an earlier run");
                    }
                    self.cleaned_leftovers = true;
                }
                ops::run_mode_into(mode, &dir, &spec, &rec, &mut self.latencies)
            }
            Err(e) => Err(OpError {
                mode,
                op: Op::Prepare,
                failure: e.failure,
                context: e.context,
            }),
        };
        if target.stop.is_set() {
            // Removed by a reload while this cycle ran: its series are gone.
            return;
        }
        self.series.cycle_done();
        let outcome = match &result {
            Ok(()) => Outcome::Ok,
            Err(e) => {
                m.failed(name, e.mode, e.op, e.failure);
                // Keyed without the per-cycle context (file names change every cycle).
                Outcome::Failed(format!("{} {}: {}", e.mode, e.op, e.failure))
            }
        };
        self.series.set_up(outcome == Outcome::Ok);
        let erofs = matches!(&result, Err(e) if e.failure == Failure::Errno(Errno::ROFS));
        let changed = {
            let mut s = lock(&lane.state);
            s.erofs = erofs;
            std::mem::replace(&mut s.outcome, outcome.clone()) != outcome
        };
        // One line when the lane starts failing or fails differently, not every cycle.
        if let (Err(e), true) = (&result, changed) {
            warn!(target = %name, mode = %mode, errors = %e, "probe cycle failed");
        }
        target.settle(mount_read_only);
    }

    /// Opens the probe directory, timed as op `prepare` so a blocked open shows in flight.
    fn open_dir(
        &self,
        want_id: Option<u64>,
        rec: &Recorder<'_>,
    ) -> Result<ops::ProbeDir, ops::PrepareError> {
        let mode = self.lane().mode;
        let t0 = Instant::now();
        rec.begin(mode, Op::Prepare, t0);
        let r = ops::open_probe_dir(&self.target.target.path, want_id);
        let t1 = Instant::now();
        rec.end(
            mode,
            Op::Prepare,
            t1.saturating_duration_since(t0),
            r.as_ref().err().map(|e| e.failure),
            t1,
        );
        r
    }

    /// Removes the lane's files at shutdown, when the target is still the mount it was;
    /// the last lane to stop removes the directory.
    fn cleanup(&mut self) {
        let Ok((_, want)) = self.target.check_mount(&self.ctx.mounts) else {
            return;
        };
        let t = &self.target.target;
        let mode = self.lane().mode;
        let first = self.lane == 0;
        if let Ok(dir) = ops::open_probe_dir_existing(&t.path, want) {
            dir.remove_mode(&t.path, |m| m == mode || (first && !t.modes.contains(&m)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::labels::SyncKind;
    use crate::config::Target;
    use crate::exposition::registry::Registry;
    use crate::kernel::kernfs::Roots;
    use crate::probe::{ProbeMetrics, SkipReason, State};
    use crate::stall::log::StallLog;
    use std::path::Path;

    fn target(path: &Path, require_mountpoint: bool) -> Target {
        Target {
            name: "t".into(),
            path: path.to_owned(),
            interval: Duration::from_secs(3600),
            modes: vec![Mode::Create, Mode::Overwrite, Mode::Replace, Mode::Append],
            size: 4096,
            sync: SyncKind::Fdatasync,
            require_mountpoint,
            stall_threshold: Duration::from_secs(60),
            rotate_size: 64 << 10,
        }
    }

    /// The workers of every lane of `t`, wired as the agent wires them.
    fn workers(t: Target) -> (Vec<Worker>, Arc<TargetShared>, Arc<Context>) {
        let registry = Registry::new();
        let metrics = Arc::new(ProbeMetrics::new(&registry));
        let shared = Arc::new(TargetShared::new(0, t, 0, &metrics));
        let ctx = Arc::new(Context::new(
            metrics,
            Arc::new(StallLog::new(4, &registry, Arc::default())),
            Arc::default(),
            Roots::default(),
        ));
        let w = (0..shared.lanes.len())
            .map(|i| Worker::new(Arc::clone(&shared), i, Arc::clone(&ctx)))
            .collect();
        (w, shared, ctx)
    }

    #[test]
    fn each_lane_times_its_own_ops_and_the_target_is_up_once_all_succeeded() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, shared, ctx) = workers(target(dir.path(), false));
        let m = &ctx.metrics;
        assert_eq!(m.up_of("t"), 0, "down until a cycle succeeded");
        let (last, first) = w.split_last_mut().unwrap();
        for lane in first.iter_mut() {
            lane.cycle();
        }
        assert_eq!(m.up_of("t"), 0, "not up while one lane has not run");
        assert_eq!(shared.status().state, State::Starting);
        last.cycle();
        // The lanes hold their calls until a reader looks (`pending.rs`): none yet.
        assert_eq!(
            m.observed("t", Mode::Create, Op::Create),
            0,
            "held, not recorded"
        );
        shared.fold_pending();
        for mode in [Mode::Create, Mode::Overwrite, Mode::Replace, Mode::Append] {
            assert_eq!(m.cycles_of("t", mode), 1, "{mode}");
            assert_eq!(m.lane_up_of("t", mode), 1, "{mode}");
        }
        for (mode, op) in [
            (Mode::Create, Op::Create),
            (Mode::Create, Op::Unlink),
            (Mode::Overwrite, Op::Write),
            (Mode::Overwrite, Op::Fdatasync),
            (Mode::Replace, Op::Rename),
            (Mode::Replace, Op::Dirsync),
            (Mode::Append, Op::Write),
            (Mode::Append, Op::Fdatasync),
        ] {
            assert_eq!(m.observed("t", mode, op), 1, "{mode} {op}");
        }
        // Every op timed is in the live page's history too, once, with its latency.
        let h = ctx.history.target(shared.index).unwrap();
        assert_eq!(h.series.len(), shared.ops.len());
        for s in &h.series {
            let p = s.since(0);
            assert_eq!(p.len(), 1, "{} {}", s.mode, s.op);
            assert_eq!(p[0].count, 1, "{} {}", s.mode, s.op);
            assert!(p[0].max > 0.0, "{} {}", s.mode, s.op);
        }
        assert_eq!(m.up_of("t"), 1);
        let st = shared.status();
        assert_eq!((st.state, st.cycles), (State::Up, 4));
        assert!(st.last_success.is_some());
        assert!(shared.in_flight().is_empty(), "nothing left in flight");
        for lane in w.iter_mut() {
            lane.cleanup();
        }
        assert!(
            !probe_dir_of(dir.path()).exists(),
            "the last lane's cleanup removes the probe dir"
        );
    }

    #[test]
    fn a_failing_lane_takes_the_target_down_and_only_its_own_lane() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, shared, ctx) = workers(target(dir.path(), false));
        for lane in w.iter_mut() {
            lane.cycle();
        }
        assert_eq!(ctx.metrics.up_of("t"), 1);
        // A directory where the replace lane renames its file to: the rename fails
        // (EISDIR), the other lanes are untouched.
        let probe_dir = probe_dir_of(dir.path());
        std::fs::remove_file(probe_dir.join(ops::REPLACE_FILE)).unwrap();
        std::fs::create_dir(probe_dir.join(ops::REPLACE_FILE)).unwrap();
        for lane in w.iter_mut() {
            lane.cycle();
        }
        assert_eq!(ctx.metrics.up_of("t"), 0);
        assert_eq!(ctx.metrics.lane_up_of("t", Mode::Replace), 0);
        assert_eq!(ctx.metrics.lane_up_of("t", Mode::Create), 1);
        let State::Failing(why) = shared.status().state else {
            panic!("not failing: {:?}", shared.status().state)
        };
        assert!(why.starts_with("replace rename:"), "{why}");
        std::fs::remove_dir(probe_dir.join(ops::REPLACE_FILE)).unwrap();
        w[2].cycle();
        assert_eq!(ctx.metrics.up_of("t"), 1, "up again once the lane succeeds");
        assert_eq!(shared.status().state, State::Up);
    }

    #[test]
    fn a_directory_that_is_not_a_mount_point_is_skipped_and_left_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, shared, ctx) = workers(target(dir.path(), true));
        for lane in w.iter_mut() {
            lane.cycle();
        }
        assert_eq!(ctx.metrics.skipped_of("t", SkipReason::NotMounted), 4);
        assert_eq!(ctx.metrics.cycles_of("t", Mode::Create), 0);
        assert_eq!(ctx.metrics.up_of("t"), 0);
        assert_eq!(shared.status().state, State::NotMounted);
        assert!(!probe_dir_of(dir.path()).exists(), "nothing written");
    }

    #[test]
    fn lanes_start_staggered_across_the_interval() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = target(dir.path(), false);
        t.interval = Duration::from_secs(8);
        let (_w, shared, _ctx) = workers(t);
        let due: Vec<Instant> = shared
            .lanes
            .iter()
            .map(|l| lock(&l.sched).next_due)
            .collect();
        for pair in due.windows(2) {
            assert_eq!(pair[1] - pair[0], Duration::from_secs(2));
        }
        let ids: Vec<usize> = shared.lanes.iter().map(|l| l.id).collect();
        assert_eq!(ids, [0, 1, 2, 3]);
    }

    #[test]
    fn a_cycle_reads_the_wall_clock_once_unless_told_to_read_it_again() {
        let dir = tempfile::tempdir().unwrap();
        let (_w, shared, ctx) = workers(target(dir.path(), false));
        let rec = Recorder {
            target: &shared,
            lane: &shared.lanes[0],
            ctx: &ctx,
            seq: Cell::new(0),
            wall: Cell::new(None),
        };
        let t0 = Instant::now();
        let before = SystemTime::now();
        let w0 = rec.wall_at(t0, false);
        assert!(w0 >= before && w0 <= SystemTime::now());
        let later = t0 + Duration::from_millis(5);
        assert_eq!(rec.wall_at(later, false), w0 + Duration::from_millis(5));
        // Read again: the wall clock itself, and the new anchor.
        let w1 = rec.wall_at(later, true);
        assert!(w1 >= w0 && w1 <= SystemTime::now());
        assert_eq!(rec.wall.get(), Some((later, w1)));
    }

    #[test]
    fn a_lanes_slot_and_schedule_share_one_cache_line() {
        use std::mem::{align_of, offset_of, size_of};
        assert_eq!(align_of::<Lane>(), 64);
        let sched_end =
            offset_of!(Lane, sched) + size_of::<std::sync::Mutex<super::super::target::Sched>>();
        assert!(sched_end <= offset_of!(Lane, mode) && offset_of!(Lane, mode) < 64);
        assert_eq!(offset_of!(Lane, inflight), 0);
    }

    #[test]
    fn targets_with_the_same_interval_wake_together() {
        let dir = tempfile::tempdir().unwrap();
        let (_w, a, _ctx) = workers(target(dir.path(), false));
        std::thread::sleep(Duration::from_millis(3));
        let (_w, b, _ctx) = workers(target(dir.path(), false));
        let due = |t: &TargetShared| lock(&t.lanes[0].sched).next_due;
        let (da, db) = (due(&a), due(&b));
        assert!(db <= Instant::now(), "the first cycle is due at once");
        let interval = a.target.interval.as_nanos();
        let apart = (db.max(da) - db.min(da)).as_nanos();
        assert_eq!(apart % interval, 0, "{apart} ns apart, not on one grid");
    }

    #[test]
    fn cycles_due_while_one_runs_are_counted_once_each() {
        let dir = tempfile::tempdir().unwrap();
        let (_w, shared, ctx) = workers(target(dir.path(), false));
        let lane = &shared.lanes[1];
        let interval = Duration::from_millis(10);
        assert_eq!(
            lane.count_overdue(Instant::now(), interval),
            None,
            "idle: nothing to count"
        );
        {
            let mut s = lock(&lane.sched);
            s.running = true;
            s.next_due = Instant::now() - Duration::from_millis(25);
        }
        let next = lane
            .count_overdue(Instant::now(), interval)
            .expect("running");
        assert!(next > Instant::now());
        // 25 ms overdue at a 10 ms interval: the due times at -25, -15 and -5 ms.
        assert_eq!(ctx.metrics.skipped_of("t", SkipReason::InFlight), 3);
        let own = ctx
            .metrics
            .lane_skipped("t", Mode::Overwrite, SkipReason::InFlight);
        assert_eq!(own.get(), 3, "and on the lane's own counter");
        lane.count_overdue(Instant::now(), interval);
        assert_eq!(
            ctx.metrics.skipped_of("t", SkipReason::InFlight),
            3,
            "once each"
        );
    }
}
