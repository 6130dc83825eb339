//! One OS thread per target: schedule, mount check, the in-flight slot that the scrape
//! and the stall watchdog read, and the results of each cycle. This module owns the
//! probe metric families (`metrics.rs` here) and fills them; nothing else writes them.
//!
//! A probe blocked in the kernel blocks only its own thread. Everything other threads
//! need from it is in atomics or behind short-held locks that are never held across a
//! system call on the probed filesystem.

mod metrics;
pub mod ops;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use prometheus::IntCounter;
use tracing::{info, warn};

use crate::blockdev;
use crate::config::{Mode, Target};
use crate::inflight::InflightSlot;
use crate::kernfs::Roots;
use crate::mounts::{self, Mount};
use crate::op::{ops_of, Failure, Op};
use crate::stalls::{StallLog, TargetDevices};
use crate::sync::{lock, Shutdown};
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
    /// The last cycle failed; the errors, one per failed mode.
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
    pub cycles: u64,
}

struct Sched {
    next_due: Instant,
    running: bool,
}

/// Everything other threads share with one target's probe thread.
pub struct TargetShared {
    pub index: usize,
    pub target: Target,
    /// The (mode, op) pairs this target times, for pre-created series.
    pub ops: Vec<(Mode, Op)>,
    pub inflight: InflightSlot,
    sched: Mutex<Sched>,
    status: Mutex<Status>,
    /// This target's `stallwatch_probes_skipped_total{reason="in_flight"}`.
    skipped_in_flight: IntCounter,
}

impl TargetShared {
    /// Target number `index` of the configuration; its series are created in `metrics`.
    pub fn new(index: usize, target: Target, metrics: &ProbeMetrics) -> TargetShared {
        let mut pairs = Vec::new();
        for &m in &target.modes {
            for &o in ops_of(m, target.sync) {
                pairs.push((m, o));
            }
        }
        metrics.add_target(&target, &pairs);
        TargetShared {
            index,
            skipped_in_flight: metrics.skipped(&target.name, SkipReason::InFlight),
            ops: pairs,
            inflight: InflightSlot::default(),
            sched: Mutex::new(Sched {
                next_due: Instant::now(),
                running: false,
            }),
            status: Mutex::new(Status {
                state: State::Starting,
                since: SystemTime::now(),
                mount: None,
                read_only: false,
                last_success: None,
                cycles: 0,
            }),
            target,
        }
    }

    pub fn status(&self) -> Status {
        lock(&self.status).clone()
    }

    /// Counts the cycles that came due while the previous one is still running. Called by
    /// the watchdog (live, while a call is blocked) and by the probe thread after a cycle;
    /// the lock makes each due time counted once.
    /// Returns the next due time while a cycle is running (when the next skip would
    /// be counted), None when idle.
    pub fn count_overdue(&self) -> Option<Instant> {
        let now = Instant::now();
        let mut s = lock(&self.sched);
        if !s.running {
            return None;
        }
        while s.next_due <= now {
            s.next_due += self.target.interval;
            self.skipped_in_flight.inc();
        }
        Some(s.next_due)
    }
}

/// What the probe threads need from the rest of the agent.
pub struct Context {
    pub metrics: Arc<ProbeMetrics>,
    pub stalls: Arc<StallLog>,
    pub shutdown: Arc<Shutdown>,
    /// Where /proc and /sys are (`--path.procfs`, `--path.sysfs`).
    pub roots: Roots,
}

/// Reports each timed call to the in-flight slot, the histogram and the stall log.
struct Recorder<'a> {
    shared: &'a TargetShared,
    ctx: &'a Context,
    seq: std::cell::Cell<u64>,
}

impl Observer for Recorder<'_> {
    fn begin(&self, mode: Mode, op: Op) {
        self.seq.set(self.shared.inflight.begin(mode, op));
    }

    fn end(&self, mode: Mode, op: Op, elapsed: Duration, failure: Option<Failure>) {
        self.shared.inflight.end();
        let t = &self.shared.target;
        if failure.is_none() && op != Op::Prepare {
            self.ctx.metrics.observe(&t.name, mode, op, elapsed);
        }
        if elapsed >= t.stall_threshold {
            let seq = self.seq.get();
            let (index, name) = (self.shared.index, t.name.as_str());
            self.ctx
                .stalls
                .finished(index, name, mode, op, seq, elapsed, failure);
        }
    }
}

/// The probe thread of one target.
pub struct Worker {
    shared: Arc<TargetShared>,
    ctx: Arc<Context>,
    /// The filesystem first seen at a mount-point target; another one later is refused.
    expected: Option<Mount>,
    cleaned_leftovers: bool,
    mounts: mounts::MountTable,
    /// The resolved target path and the mount table generation it was resolved in.
    canon: Option<(u64, PathBuf)>,
    /// The probe directory was opened once: finding it missing later is news.
    had_dir: bool,
    seq: u64,
}

impl Worker {
    pub fn new(shared: Arc<TargetShared>, ctx: Arc<Context>) -> Worker {
        ctx.stalls.add_target(&shared.target.name, &shared.ops);
        Worker {
            mounts: mounts::MountTable::new(&ctx.roots.proc_root),
            canon: None,
            shared,
            ctx,
            expected: None,
            cleaned_leftovers: false,
            had_dir: false,
            seq: 0,
        }
    }

    /// Runs cycles at the target's interval until shutdown, then removes its files.
    pub fn run(mut self) {
        let interval = self.shared.target.interval;
        loop {
            let due = lock(&self.shared.sched).next_due;
            if self.ctx.shutdown.sleep_until(due) {
                break;
            }
            {
                let mut s = lock(&self.shared.sched);
                s.running = true;
                s.next_due += interval;
            }
            self.cycle();
            self.shared.count_overdue();
            lock(&self.shared.sched).running = false;
        }
        self.cleanup();
    }

    fn set_state(&self, state: State) {
        let t = &self.shared.target;
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
            // Failing is logged by the cycle with the full error context.
            State::Failing(_) | State::Starting => {}
        }
    }

    /// Decides whether the target may be probed now. Returns the mount it is on, and
    /// the mount id the probe directory must be on (None when not required).
    fn check_mount(&mut self) -> Result<(Option<Mount>, Option<u64>), SkipReason> {
        let require = self.shared.target.require_mountpoint;
        let refreshed = self.mounts.current().map(|_| ());
        let canon = self.canonical_path();
        // Only the one mount we need is copied out of the cached table.
        let found = match (&canon, refreshed.map(|()| self.mounts.cached())) {
            (Ok(c), Ok(table)) if require => Ok(mounts::mount_at(table, c).cloned()),
            (Ok(c), Ok(table)) => Ok(mounts::mount_of(table, c).cloned()),
            (Err(_), _) => Ok(None),
            (_, Err(e)) => Err(e.to_string()),
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
                self.set_state(State::NotMounted);
                return Err(SkipReason::NotMounted);
            }
            Err(e) => {
                // Without a mount table the mount cannot be verified: do not write.
                warn!(error = %e, "cannot read the mount table");
                return Err(SkipReason::NotMounted);
            }
        };
        match &self.expected {
            Some(e) if !e.same_filesystem(&m) => {
                self.set_state(State::MountChanged(format!(
                    "expected {} ({}, {}), found {} ({}, {})",
                    e.source, e.fstype, e.maj_min, m.source, m.fstype, m.maj_min
                )));
                return Err(SkipReason::MountChanged);
            }
            Some(_) => {}
            None => self.expected = Some(m.clone()),
        }
        let id = m.mount_id;
        Ok((Some(m), Some(id)))
    }

    /// The target path with symlinks resolved, kept until the mount table changes (a
    /// path that does not resolve is tried again each cycle).
    fn canonical_path(&mut self) -> std::io::Result<PathBuf> {
        let generation = self.mounts.generation();
        if let Some((g, p)) = &self.canon {
            if *g == generation {
                return Ok(p.clone());
            }
        }
        let p = std::fs::canonicalize(&self.shared.target.path)?;
        self.canon = Some((generation, p.clone()));
        Ok(p)
    }

    fn update_mount_info(&self, mount: &Option<Mount>) {
        let t = &self.shared.target;
        let mut st = lock(&self.shared.status);
        if st.mount == *mount {
            return;
        }
        self.ctx
            .metrics
            .set_mount(t, st.mount.as_ref(), mount.as_ref());
        if let Some(m) = mount {
            self.ctx
                .stalls
                .set_devices(self.shared.index, devices_of(&self.ctx.roots.sys_root, m));
            if st.mount.is_none() {
                info!(target = %t.name, path = %t.path.display(),
                    mountpoint = %m.mount_point.display(), device = %m.source,
                    fstype = %m.fstype, options = %m.options(), "probing");
            }
        }
        st.mount = mount.clone();
    }

    fn cycle(&mut self) {
        let name = self.shared.target.name.clone();
        let m = Arc::clone(&self.ctx.metrics);
        let (mount, want_id) = match self.check_mount() {
            Ok(x) => x,
            Err(reason) => {
                m.skipped(&name, reason).inc();
                m.set_up(&name, false);
                return;
            }
        };
        self.update_mount_info(&mount);
        let mut read_only = mount.as_ref().map(|m| m.read_only()).unwrap_or(false);
        self.seq += 1;
        let spec = ops::CycleSpec {
            size: self.shared.target.size,
            sync: self.shared.target.sync,
            seq: self.seq,
        };
        let rec = Recorder {
            shared: &self.shared,
            ctx: &self.ctx,
            seq: std::cell::Cell::new(0),
        };
        let mut errors: Vec<OpError> = Vec::new();
        match self.open_dir(want_id, &rec) {
            Ok(dir) => {
                // Removed between two cycles: nothing failed, so nothing is counted,
                // but someone is deleting our directory and should hear of it.
                if dir.created && self.had_dir {
                    warn!(target = %name, path = %probe_dir_of(&self.shared.target.path).display(),
                        "the probe directory had vanished since the last cycle; created it again");
                }
                self.had_dir = true;
                if !self.cleaned_leftovers {
                    let n = dir.remove_own_files();
                    if n > 0 {
                        info!(target = %name, files = n, "removed leftover probe files of an earlier run");
                    }
                    self.cleaned_leftovers = true;
                }
                for &mode in &self.shared.target.modes {
                    if let Err(e) = ops::run_mode(mode, &dir, &spec, &rec) {
                        errors.push(e);
                    }
                    m.cycle_done(&name, mode);
                }
            }
            Err(e) => {
                for &mode in &self.shared.target.modes {
                    errors.push(OpError {
                        mode,
                        op: Op::Prepare,
                        failure: e.failure,
                        context: e.context.clone(),
                    });
                    m.cycle_done(&name, mode);
                }
            }
        }
        for e in &errors {
            m.failed(&name, e.mode, e.op, e.failure);
            if e.failure == Failure::Errno(nix::errno::Errno::EROFS) {
                read_only = true;
            }
        }
        m.set_read_only(&name, read_only);
        let mut st = lock(&self.shared.status);
        st.cycles += 1;
        let was_read_only = std::mem::replace(&mut st.read_only, read_only);
        drop(st);
        // Once per change, like the state: a read-only filesystem stays so for hours.
        if read_only && !was_read_only {
            warn!(target = %name, path = %self.shared.target.path.display(),
                "the filesystem is read-only (ro or emergency_ro in its options, or EROFS)");
        } else if was_read_only && !read_only {
            info!(target = %name, path = %self.shared.target.path.display(),
                "the filesystem is writable again");
        }
        if errors.is_empty() {
            let now = SystemTime::now();
            m.set_up(&name, true);
            m.succeeded_at(&name, now);
            lock(&self.shared.status).last_success = Some(now);
            self.set_state(State::Up);
        } else {
            m.set_up(&name, false);
            // Keyed without the per-cycle context (file names change every cycle), so a
            // persisting fault is logged once, not every cycle.
            let key: Vec<String> = errors
                .iter()
                .map(|e| format!("{} {}: {}", e.mode, e.op, e.failure))
                .collect();
            if self.set_state_quiet(State::Failing(key.join("; "))) {
                let why: Vec<String> = errors.iter().map(ToString::to_string).collect();
                warn!(target = %name, errors = %why.join("; "), "probe cycle failed");
            }
        }
    }

    /// Sets the state without logging; true when it changed.
    fn set_state_quiet(&self, state: State) -> bool {
        let mut st = lock(&self.shared.status);
        if st.state == state {
            return false;
        }
        st.state = state;
        st.since = SystemTime::now();
        true
    }

    /// Opens the probe directory, timed as op `prepare` so a blocked open shows in flight.
    fn open_dir(
        &self,
        want_id: Option<u64>,
        rec: &Recorder<'_>,
    ) -> Result<ops::ProbeDir, ops::PrepareError> {
        let mode = self.shared.target.modes[0];
        rec.begin(mode, Op::Prepare);
        let t0 = Instant::now();
        let r = ops::open_probe_dir(&self.shared.target.path, want_id);
        rec.end(
            mode,
            Op::Prepare,
            t0.elapsed(),
            r.as_ref().err().map(|e| e.failure),
        );
        r
    }

    /// Removes the agent's files at shutdown, when the target is still the mount it was.
    fn cleanup(&mut self) {
        let Ok((_, want)) = self.check_mount() else {
            return;
        };
        let t = &self.shared.target;
        if let Ok(dir) = ops::open_probe_dir_existing(&t.path, want) {
            dir.remove_all(&t.path);
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
    use prometheus::Registry;

    fn target(path: &Path, require_mountpoint: bool) -> Target {
        Target {
            name: "t".into(),
            path: path.to_owned(),
            interval: Duration::from_secs(3600),
            modes: vec![Mode::Create, Mode::Overwrite, Mode::Replace],
            size: 4096,
            sync: SyncKind::Fdatasync,
            require_mountpoint,
            stall_threshold: Duration::from_secs(60),
        }
    }

    /// A worker on `t` with its own registry, as the agent wires it.
    fn worker(t: Target) -> (Worker, Arc<Context>) {
        let registry = Registry::new();
        let metrics = Arc::new(ProbeMetrics::new(&registry));
        let shared = Arc::new(TargetShared::new(0, t, &metrics));
        let ctx = Arc::new(Context {
            metrics,
            stalls: Arc::new(StallLog::new(4, &registry)),
            shutdown: Arc::new(Shutdown::default()),
            roots: Roots::default(),
        });
        (Worker::new(shared, Arc::clone(&ctx)), ctx)
    }

    #[test]
    fn a_cycle_times_every_op_of_every_mode_and_marks_the_target_up() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, ctx) = worker(target(dir.path(), false));
        let m = &ctx.metrics;
        assert_eq!(m.up_of("t"), 0, "down until a cycle succeeded");
        w.cycle();
        for mode in [Mode::Create, Mode::Overwrite, Mode::Replace] {
            assert_eq!(m.cycles_of("t", mode), 1, "{mode}");
        }
        for (mode, op) in [
            (Mode::Create, Op::Create),
            (Mode::Create, Op::Unlink),
            (Mode::Overwrite, Op::Write),
            (Mode::Overwrite, Op::Fdatasync),
            (Mode::Replace, Op::Rename),
            (Mode::Replace, Op::Dirsync),
        ] {
            assert_eq!(m.observed("t", mode, op), 1, "{mode} {op}");
        }
        assert_eq!(m.up_of("t"), 1);
        let st = w.shared.status();
        assert_eq!((st.state, st.cycles), (State::Up, 1));
        assert!(st.last_success.is_some());
        assert!(
            w.shared.inflight.current().is_none(),
            "nothing left in flight"
        );
        w.cleanup();
        assert!(
            !probe_dir_of(dir.path()).exists(),
            "cleanup removes the probe dir"
        );
    }

    #[test]
    fn a_directory_that_is_not_a_mount_point_is_skipped_and_left_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let (mut w, ctx) = worker(target(dir.path(), true));
        w.cycle();
        assert_eq!(ctx.metrics.skipped_of("t", SkipReason::NotMounted), 1);
        assert_eq!(ctx.metrics.cycles_of("t", Mode::Create), 0);
        assert_eq!(ctx.metrics.up_of("t"), 0);
        assert_eq!(w.shared.status().state, State::NotMounted);
        assert!(!probe_dir_of(dir.path()).exists(), "nothing written");
    }

    #[test]
    fn cycles_due_while_one_runs_are_counted_once_each() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = target(dir.path(), false);
        t.interval = Duration::from_millis(10);
        let (w, ctx) = worker(t);
        let shared = &w.shared;
        assert_eq!(shared.count_overdue(), None, "idle: nothing to count");
        {
            let mut s = lock(&shared.sched);
            s.running = true;
            s.next_due = Instant::now() - Duration::from_millis(25);
        }
        let next = shared.count_overdue().expect("running");
        assert!(next > Instant::now());
        // 25 ms overdue at a 10 ms interval: the due times at -25, -15 and -5 ms.
        assert_eq!(ctx.metrics.skipped_of("t", SkipReason::InFlight), 3);
        shared.count_overdue();
        assert_eq!(
            ctx.metrics.skipped_of("t", SkipReason::InFlight),
            3,
            "once each"
        );
    }
}
