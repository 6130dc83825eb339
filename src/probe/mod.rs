//! Probe lanes: one OS thread per (target, mode), each with its own schedule, in-flight
//! slot, skips and outcome, sharing the target's mount check; the target's state is
//! folded from its lanes. This module owns the probe metric families (`metrics.rs` here)
//! and fills them; nothing else writes them.
//!
//! A call blocked in the kernel blocks only its own lane: the other lanes of the target
//! keep probing, so "only fsync is stuck" and "everything on this filesystem is stuck"
//! read differently. Everything other threads need from a lane is in atomics or behind
//! short-held locks that are never held across a system call on the probed filesystem.

mod metrics;
pub mod ops;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use nix::errno::Errno;
use prometheus::IntCounter;
use tracing::{info, warn};

use crate::blockdev;
use crate::config::{Mode, Target};
use crate::history::History;
use crate::inflight::{InFlightOp, InflightSlot};
use crate::kernfs::Roots;
use crate::mounts::{self, Mount};
use crate::op::{ops_of, Failure, Op};
use crate::stalls::{FinishedCall, LaneKey, StallLog, TargetDevices};
use crate::sync::{lock, Shutdown};
use crate::waits::LaneWaits;
pub use metrics::{register_inflight, ProbeMetrics, SkipReason, BUCKETS};
use ops::{Observer, OpError};

/// A target's state as the landing page and the logs show it.
#[derive(Debug, Clone, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum State {
    Starting,
    Up,
    /// The path is not the root of a mount (require_mountpoint).
    NotMounted,
    /// A different filesystem is now mounted at the path.
    MountChanged(String),
    /// A lane's last cycle failed; the errors, one per failed lane.
    Failing(String),
}

impl State {
    pub fn label(&self) -> &'static str {
        self.into()
    }
}

/// What the landing page shows of a target.
#[derive(Debug, Clone)]
pub struct Status {
    pub state: State,
    pub since: SystemTime,
    pub mount: Option<Mount>,
    pub read_only: bool,
    pub last_success: Option<SystemTime>,
    /// Cycles run, over all lanes.
    pub cycles: u64,
}

struct Sched {
    next_due: Instant,
    running: bool,
}

/// How a lane's last cycle ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// No cycle yet, or the last one was not started (not mounted, mount changed).
    None,
    Ok,
    /// Failed; the errors without their per-cycle detail, so a persisting fault keeps
    /// the same key and is logged once.
    Failed(String),
}

struct LaneState {
    outcome: Outcome,
    /// The last cycle answered EROFS.
    erofs: bool,
}

/// One (target, mode): its own thread, schedule, in-flight slot, skips and outcome. A
/// lane blocked in the kernel holds nothing the other lanes of its target need.
pub struct Lane {
    /// Unique among all lanes of the agent.
    pub id: usize,
    pub mode: Mode,
    /// The ops this lane times, in order.
    pub ops: &'static [Op],
    pub inflight: InflightSlot,
    /// The lane thread's id and the wait-point samples of its blocked call.
    pub waits: LaneWaits,
    sched: Mutex<Sched>,
    state: Mutex<LaneState>,
    /// `stallwatch_probes_skipped_total{reason="in_flight"}` of the target, and the
    /// lane's own counter of the same.
    skipped_in_flight: [IntCounter; 2],
}

/// The mount check of a target, shared by its lanes: one expected filesystem, checked
/// in the agent's one mount table (`Context::mounts`).
struct MountCheck {
    /// The resolved target path and the mount table generation it was resolved in.
    canon: Option<(u64, PathBuf)>,
    /// The mount found for `canon` in that generation's table (`mount_at` when a mount
    /// point is required, else `mount_of`): the table is searched once per change of the
    /// mounts, not once per lane cycle (64 targets on a host with 200 mounts).
    found: Option<(u64, Option<Mount>)>,
    /// The filesystem first seen at a mount-point target; another one later is refused.
    expected: Option<Mount>,
}

/// Everything other threads share with a target's lanes.
pub struct TargetShared {
    pub index: usize,
    pub target: Target,
    /// The (mode, op) pairs this target times, for pre-created series.
    pub ops: Vec<(Mode, Op)>,
    /// One per mode, in the configured order.
    pub lanes: Vec<Lane>,
    status: Mutex<Status>,
    mount: Mutex<MountCheck>,
    /// Stops this target's lanes: at shutdown, or when a reload removes or changes it.
    stop: Shutdown,
}

/// The targets probed now, replaced whole when a reload changes them. Readers (the
/// watchdog, a scrape, the landing page) take a snapshot under a lock held for a clone
/// of one `Arc`, never across a system call.
#[derive(Default)]
pub struct Targets {
    now: RwLock<Arc<Vec<Arc<TargetShared>>>>,
}

impl Targets {
    pub fn new(targets: Vec<Arc<TargetShared>>) -> Targets {
        Targets {
            now: RwLock::new(Arc::new(targets)),
        }
    }

    /// The targets probed right now.
    pub fn current(&self) -> Arc<Vec<Arc<TargetShared>>> {
        Arc::clone(&self.now.read().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn replace(&self, targets: Vec<Arc<TargetShared>>) {
        *self.now.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(targets);
    }
}

impl TargetShared {
    /// Target number `index` of the configuration, its lanes numbered from `first_lane`;
    /// its series are created in `metrics`. Lanes start staggered across the interval,
    /// so the agent does not time its own probes against each other.
    pub fn new(
        index: usize,
        target: Target,
        first_lane: usize,
        metrics: &ProbeMetrics,
    ) -> TargetShared {
        let ops: Vec<(Mode, Op)> = target
            .modes
            .iter()
            .flat_map(|&m| ops_of(m, target.sync).iter().map(move |&o| (m, o)))
            .collect();
        metrics.add_target(&target, &ops);
        let start = Instant::now();
        let n = target.modes.len() as u32;
        let lanes = target
            .modes
            .iter()
            .enumerate()
            .map(|(i, &mode)| Lane {
                id: first_lane + i,
                mode,
                ops: ops_of(mode, target.sync),
                inflight: InflightSlot::default(),
                waits: LaneWaits::default(),
                sched: Mutex::new(Sched {
                    next_due: start + target.interval * i as u32 / n,
                    running: false,
                }),
                state: Mutex::new(LaneState {
                    outcome: Outcome::None,
                    erofs: false,
                }),
                skipped_in_flight: [
                    metrics.skipped(&target.name, SkipReason::InFlight),
                    metrics.lane_skipped(&target.name, mode, SkipReason::InFlight),
                ],
            })
            .collect();
        TargetShared {
            index,
            ops,
            lanes,
            status: Mutex::new(Status {
                state: State::Starting,
                since: SystemTime::now(),
                mount: None,
                read_only: false,
                last_success: None,
                cycles: 0,
            }),
            mount: Mutex::new(MountCheck {
                canon: None,
                found: None,
                expected: None,
            }),
            stop: Shutdown::default(),
            target,
        }
    }

    /// Tells the lanes to stop: each finishes the cycle it is in (a call blocked in the
    /// kernel cannot be interrupted), removes its files and ends.
    pub fn stop(&self) {
        self.stop.trigger();
    }

    /// Removes the target's series, once it is no longer probed.
    pub fn retire(&self, ctx: &Context) {
        let mount = lock(&self.status).mount.clone();
        ctx.metrics
            .remove_target(&self.target, &self.ops, mount.as_ref());
        ctx.stalls
            .remove_target(self.index, &self.target.name, &self.ops);
        ctx.history.remove_target(self.index);
    }

    pub fn status(&self) -> Status {
        lock(&self.status).clone()
    }

    /// The operations of this target's lanes in flight right now.
    pub fn in_flight(&self) -> Vec<InFlightOp> {
        self.lanes
            .iter()
            .filter_map(|l| l.inflight.current())
            .collect()
    }

    /// The operations of the other lanes blocked past the stall threshold right now.
    pub fn blocked_besides(&self, lane: &Lane) -> Vec<InFlightOp> {
        self.lanes
            .iter()
            .filter(|l| l.id != lane.id)
            .filter_map(|l| l.inflight.current())
            .filter(|op| op.age >= self.target.stall_threshold)
            .collect()
    }

    /// Decides whether the target may be probed now. Returns the mount it is on, and
    /// the mount id the probe directory must be on (None when not required).
    fn check_mount(
        &self,
        table: &Mutex<mounts::MountTable>,
    ) -> Result<(Option<Mount>, Option<u64>), SkipReason> {
        let require = self.target.require_mountpoint;
        let (refreshed, generation) = {
            let mut t = lock(table);
            let refreshed = t.current().map(|_| ()).map_err(|e| e.to_string());
            (refreshed, t.generation())
        };
        let cached = lock(&self.mount)
            .canon
            .clone()
            .filter(|(g, _)| *g == generation);
        // Resolved outside the lock: a stat on a hung filesystem must not hold up the
        // other lanes' checks. Kept until the mount table changes; a path that does not
        // resolve is tried again each cycle.
        let canon = match cached {
            Some((_, p)) => Ok(p),
            None => std::fs::canonicalize(&self.target.path),
        };
        let mut mc = lock(&self.mount);
        if let Ok(p) = &canon {
            if mc.canon.as_ref().is_none_or(|(g, _)| *g != generation) {
                mc.canon = Some((generation, p.clone()));
            }
        }
        let known = mc
            .found
            .as_ref()
            .filter(|(g, _)| *g == generation)
            .map(|(_, m)| m.clone());
        // Only the one mount we need is copied out of the cached table.
        let found = match (&canon, refreshed, known) {
            (Ok(_), Ok(()), Some(m)) => Ok(m),
            (Ok(c), Ok(()), None) => {
                let t = lock(table);
                // Looked up in the table of `generation`, or a newer one: then the next
                // cycle looks again, under its generation.
                let m = if require {
                    mounts::mount_at(t.cached(), c)
                } else {
                    mounts::mount_of(t.cached(), c)
                };
                let m = m.cloned();
                if t.generation() == generation {
                    mc.found = Some((generation, m.clone()));
                }
                Ok(m)
            }
            (Err(_), _, _) => Ok(None),
            (_, Err(e), _) => Err(e),
        };
        if !require {
            if let Err(e) = &found {
                warn!(error = %e, "cannot read the mount table");
            }
            return Ok((found.ok().flatten(), None));
        }
        let m = match found {
            Ok(Some(m)) => m,
            Ok(None) => {
                drop(mc);
                self.set_state(State::NotMounted);
                return Err(SkipReason::NotMounted);
            }
            Err(e) => {
                // Without a mount table the mount cannot be verified: do not write.
                warn!(error = %e, "cannot read the mount table");
                return Err(SkipReason::NotMounted);
            }
        };
        match &mc.expected {
            Some(e) if !e.same_filesystem(&m) => {
                let why = format!(
                    "expected {} ({}, {}), found {} ({}, {})",
                    e.source, e.fstype, e.maj_min, m.source, m.fstype, m.maj_min
                );
                drop(mc);
                self.set_state(State::MountChanged(why));
                return Err(SkipReason::MountChanged);
            }
            Some(_) => {}
            None => mc.expected = Some(m.clone()),
        }
        let id = m.mount_id;
        Ok((Some(m), Some(id)))
    }

    fn set_state(&self, state: State) {
        let t = &self.target;
        if !self.set_state_quiet(state.clone()) {
            return;
        }
        // One log line per transition, not per cycle.
        match &state {
            State::Up => info!(target = %t.name, path = %t.path.display(), "target up"),
            State::NotMounted => warn!(target = %t.name, path = %t.path.display(),
                "target is not a mount point: not probing, nothing is written there"),
            State::MountChanged(why) => warn!(target = %t.name, path = %t.path.display(),
                detail = %why, "another filesystem is mounted at the target: not probing"),
            // A failing lane logs its own errors with their full context.
            State::Failing(_) | State::Starting => {}
        }
    }

    /// Sets the state without logging; true when it changed.
    fn set_state_quiet(&self, state: State) -> bool {
        let mut st = lock(&self.status);
        if st.state == state {
            return false;
        }
        st.state = state;
        st.since = SystemTime::now();
        true
    }

    fn update_mount_info(&self, ctx: &Context, mount: &Option<Mount>) {
        let t = &self.target;
        let mut st = lock(&self.status);
        if st.mount == *mount {
            return;
        }
        ctx.metrics.set_mount(t, st.mount.as_ref(), mount.as_ref());
        if let Some(m) = mount {
            ctx.stalls
                .set_devices(self.index, devices_of(&ctx.roots.sys_root, m));
            if st.mount.is_none() {
                info!(target = %t.name, path = %t.path.display(),
                    mountpoint = %m.mount_point.display(), device = %m.source,
                    fstype = %m.fstype, options = %m.options(), "probing");
            }
        }
        st.mount = mount.clone();
    }

    /// Folds the lanes' last outcomes into the target's state, `target_up`,
    /// `target_read_only` and the last success time, after a lane finished a cycle.
    fn settle(&self, ctx: &Context, mount_read_only: bool) {
        let t = &self.target;
        let (mut all_ok, mut erofs, mut failing) = (true, false, Vec::new());
        for lane in &self.lanes {
            let s = lock(&lane.state);
            all_ok &= s.outcome == Outcome::Ok;
            erofs |= s.erofs;
            if let Outcome::Failed(key) = &s.outcome {
                failing.push(key.clone());
            }
        }
        let read_only = mount_read_only || erofs;
        ctx.metrics.set_read_only(&t.name, read_only);
        ctx.metrics.set_up(&t.name, all_ok);
        let mut st = lock(&self.status);
        st.cycles += 1;
        let was_read_only = std::mem::replace(&mut st.read_only, read_only);
        if all_ok {
            let now = SystemTime::now();
            st.last_success = Some(now);
            ctx.metrics.succeeded_at(&t.name, now);
        }
        drop(st);
        // Once per change, like the state: a read-only filesystem stays so for hours.
        if read_only && !was_read_only {
            warn!(target = %t.name, path = %t.path.display(),
                "the filesystem is read-only (ro or emergency_ro in its options, or EROFS)");
        } else if was_read_only && !read_only {
            info!(target = %t.name, path = %t.path.display(),
                "the filesystem is writable again");
        }
        if all_ok {
            self.set_state(State::Up);
        } else if !failing.is_empty() {
            self.set_state_quiet(State::Failing(failing.join("; ")));
        }
    }
}

impl Lane {
    /// Counts the cycles that came due while the previous one is still running. Called by
    /// the watchdog (live, while a call is blocked) and by the lane after a cycle; the
    /// lock makes each due time counted once.
    /// Returns the next due time while a cycle is running (when the next skip would
    /// be counted), None when idle.
    pub fn count_overdue(&self, interval: Duration) -> Option<Instant> {
        let now = Instant::now();
        let mut s = lock(&self.sched);
        if !s.running {
            return None;
        }
        while s.next_due <= now {
            s.next_due += interval;
            for c in &self.skipped_in_flight {
                c.inc();
            }
        }
        Some(s.next_due)
    }
}

/// What the lanes need from the rest of the agent.
pub struct Context {
    pub metrics: Arc<ProbeMetrics>,
    pub stalls: Arc<StallLog>,
    /// The last hour of every op's latencies, for the live page.
    pub history: Arc<History>,
    /// Where /proc and /sys are (`--path.procfs`, `--path.sysfs`).
    pub roots: Roots,
    /// The one mount table of all targets: read anew once per change of the mounts,
    /// not once per target (hosts whose containers mount and unmount all the time).
    /// Only procfs is read under its lock, never a probed filesystem.
    mounts: Mutex<mounts::MountTable>,
}

impl Context {
    pub fn new(
        metrics: Arc<ProbeMetrics>,
        stalls: Arc<StallLog>,
        history: Arc<History>,
        roots: Roots,
    ) -> Context {
        Context {
            metrics,
            stalls,
            history,
            mounts: Mutex::new(mounts::MountTable::new(&roots.proc_root)),
            roots,
        }
    }
}

/// Reports each timed call to the in-flight slot, the histogram and the stall log.
struct Recorder<'a> {
    target: &'a TargetShared,
    lane: &'a Lane,
    ctx: &'a Context,
    seq: std::cell::Cell<u64>,
}

impl Observer for Recorder<'_> {
    fn begin(&self, mode: Mode, op: Op) {
        self.seq.set(self.lane.inflight.begin(mode, op));
    }

    fn end(&self, mode: Mode, op: Op, elapsed: Duration, failure: Option<Failure>) {
        self.lane.inflight.end();
        if self.target.stop.is_set() {
            // Removed by a reload (its series are gone) or shutting down: record nothing.
            return;
        }
        let t = &self.target.target;
        if failure.is_none() && op != Op::Prepare {
            self.ctx.metrics.observe(&t.name, mode, op, elapsed);
            self.ctx
                .history
                .record(self.target.index, mode, op, elapsed, SystemTime::now());
        }
        if elapsed >= t.stall_threshold {
            let key = LaneKey {
                target: self.target.index,
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
            self.ctx.stalls.finished(key, call, &others);
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
        Worker {
            target,
            lane,
            ctx,
            cleaned_leftovers: false,
            had_dir: false,
            seq: 0,
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
        loop {
            let due = lock(&self.lane().sched).next_due;
            if self.target.stop.sleep_until(due) {
                break;
            }
            {
                let mut s = lock(&self.lane().sched);
                s.running = true;
                s.next_due += interval;
            }
            self.cycle();
            self.lane().count_overdue(interval);
            lock(&self.lane().sched).running = false;
        }
        self.cleanup();
    }

    fn cycle(&mut self) {
        let target = Arc::clone(&self.target);
        let lane = &target.lanes[self.lane];
        let (name, mode) = (target.target.name.as_str(), lane.mode);
        let m = Arc::clone(&self.ctx.metrics);
        let (mount, want_id) = match target.check_mount(&self.ctx.mounts) {
            Ok(x) => x,
            Err(reason) => {
                m.skipped(name, reason).inc();
                m.lane_skipped(name, mode, reason).inc();
                m.set_lane_up(name, mode, false);
                lock(&lane.state).outcome = Outcome::None;
                m.set_up(name, false);
                return;
            }
        };
        target.update_mount_info(&self.ctx, &mount);
        let mount_read_only = mount.as_ref().is_some_and(|m| m.read_only());
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
            seq: std::cell::Cell::new(0),
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
                ops::run_mode(mode, &dir, &spec, &rec).map(|_| ())
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
        m.cycle_done(name, mode);
        let outcome = match &result {
            Ok(()) => Outcome::Ok,
            Err(e) => {
                m.failed(name, e.mode, e.op, e.failure);
                // Keyed without the per-cycle context (file names change every cycle).
                Outcome::Failed(format!("{} {}: {}", e.mode, e.op, e.failure))
            }
        };
        m.set_lane_up(name, mode, outcome == Outcome::Ok);
        let erofs = matches!(&result, Err(e) if e.failure == Failure::Errno(Errno::EROFS));
        let changed = {
            let mut s = lock(&lane.state);
            s.erofs = erofs;
            std::mem::replace(&mut s.outcome, outcome.clone()) != outcome
        };
        // One line when the lane starts failing or fails differently, not every cycle.
        if let (Err(e), true) = (&result, changed) {
            warn!(target = %name, mode = %mode, errors = %e, "probe cycle failed");
        }
        target.settle(&self.ctx, mount_read_only);
    }

    /// Opens the probe directory, timed as op `prepare` so a blocked open shows in flight.
    fn open_dir(
        &self,
        want_id: Option<u64>,
        rec: &Recorder<'_>,
    ) -> Result<ops::ProbeDir, ops::PrepareError> {
        let mode = self.lane().mode;
        rec.begin(mode, Op::Prepare);
        let t0 = Instant::now();
        let r = ops::open_probe_dir(&self.target.target.path, want_id);
        rec.end(
            mode,
            Op::Prepare,
            t0.elapsed(),
            r.as_ref().err().map(|e| e.failure),
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

/// The disk and md arrays beneath a mount, for device metrics and stall context.
fn devices_of(sys_root: &Path, m: &Mount) -> TargetDevices {
    let parsed = m
        .maj_min
        .split_once(':')
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
    let Some((major, minor)) = parsed else {
        return TargetDevices::default();
    };
    match blockdev::resolve(sys_root, major, minor) {
        Ok(d) => TargetDevices {
            disk: Some(d.disk),
            arrays: d.md_arrays,
            device: Some(d.name),
            members: d.slaves,
        },
        // tmpfs, btrfs (anonymous device numbers), network filesystems.
        Err(_) => TargetDevices::default(),
    }
}

/// Where each target's probe files live.
pub fn probe_dir_of(path: &Path) -> PathBuf {
    path.join(ops::PROBE_DIR)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SyncKind;
    use crate::metrics::Registry;

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
            Arc::new(StallLog::new(4, &registry)),
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
    fn cycles_due_while_one_runs_are_counted_once_each() {
        let dir = tempfile::tempdir().unwrap();
        let (_w, shared, ctx) = workers(target(dir.path(), false));
        let lane = &shared.lanes[1];
        let interval = Duration::from_millis(10);
        assert_eq!(lane.count_overdue(interval), None, "idle: nothing to count");
        {
            let mut s = lock(&lane.sched);
            s.running = true;
            s.next_due = Instant::now() - Duration::from_millis(25);
        }
        let next = lane.count_overdue(interval).expect("running");
        assert!(next > Instant::now());
        // 25 ms overdue at a 10 ms interval: the due times at -25, -15 and -5 ms.
        assert_eq!(ctx.metrics.skipped_of("t", SkipReason::InFlight), 3);
        let own = ctx
            .metrics
            .lane_skipped("t", Mode::Overwrite, SkipReason::InFlight);
        assert_eq!(own.get(), 3, "and on the lane's own counter");
        lane.count_overdue(interval);
        assert_eq!(
            ctx.metrics.skipped_of("t", SkipReason::InFlight),
            3,
            "once each"
        );
    }
}
