//! One OS thread per target: schedule, mount check, the in-flight slot that the scrape
//! and the stall watchdog read, and the results of each cycle.
//!
//! A probe blocked in the kernel blocks only its own thread. Everything other threads
//! need from it is in atomics or behind short-held locks that are never held across a
//! system call on the probed filesystem.

pub mod ops;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use tracing::{info, warn};

use crate::blockdev;
use crate::config::{Mode, Target};
use crate::metrics::Metrics;
use crate::mounts::{self, Mount};
use crate::stalls::{StallLog, TargetDevices};
use ops::{Failure, Observer, Op, OpError};

/// Locks a mutex, ignoring poisoning: the data behind our locks stays consistent
/// even if a holder panicked, and the agent must keep answering.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds since the process epoch, plus one so that 0 can mean "nothing".
fn now_ns() -> u64 {
    epoch().elapsed().as_nanos() as u64 + 1
}

const MODES: [Mode; 4] = [Mode::Create, Mode::Overwrite, Mode::Direct, Mode::Replace];

/// The operation a target has in flight, as other threads see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlightOp {
    pub mode: Mode,
    pub op: Op,
    /// Increments with every operation; identifies one call across threads.
    pub seq: u64,
    pub started: Instant,
    pub age: Duration,
}

/// Lock-free record of the operation in flight, written only by the target's thread.
#[derive(Default)]
pub struct InflightSlot {
    started: AtomicU64,
    what: AtomicU64,
    seq: AtomicU64,
}

impl InflightSlot {
    pub(crate) fn begin(&self, mode: Mode, op: Op) -> u64 {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let m = MODES.iter().position(|x| *x == mode).unwrap_or(0) as u64;
        self.what
            .store((m << 8) | op.index() as u64, Ordering::Relaxed);
        self.started.store(now_ns(), Ordering::Release);
        seq
    }

    pub(crate) fn end(&self) {
        self.started.store(0, Ordering::Release);
    }

    /// The operation in flight right now, if any.
    pub fn current(&self) -> Option<InFlightOp> {
        let started = self.started.load(Ordering::Acquire);
        if started == 0 {
            return None;
        }
        let what = self.what.load(Ordering::Relaxed);
        let seq = self.seq.load(Ordering::Relaxed);
        // A new op may have begun between the loads; then this reading is stale.
        if self.started.load(Ordering::Acquire) != started {
            return None;
        }
        let started = epoch() + Duration::from_nanos(started - 1);
        Some(InFlightOp {
            mode: MODES[((what >> 8) as usize).min(3)],
            op: Op::ALL[((what & 0xff) as usize).min(Op::ALL.len() - 1)],
            seq,
            started,
            age: started.elapsed(),
        })
    }
}

/// A target's state as the landing page and the logs show it.
#[derive(Debug, Clone, PartialEq, Eq)]
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
        match self {
            State::Starting => "starting",
            State::Up => "up",
            State::NotMounted => "not_mounted",
            State::MountChanged(_) => "mount_changed",
            State::Failing(_) => "failing",
        }
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
}

impl TargetShared {
    pub fn new(index: usize, target: Target) -> TargetShared {
        let mut pairs = Vec::new();
        for &m in &target.modes {
            for &o in ops::ops_of(m, target.sync) {
                pairs.push((m, o));
            }
        }
        TargetShared {
            index,
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
    pub fn count_overdue(&self, metrics: &Metrics) -> Option<Instant> {
        let now = Instant::now();
        let mut s = lock(&self.sched);
        if !s.running {
            return None;
        }
        while s.next_due <= now {
            s.next_due += self.target.interval;
            metrics
                .skipped
                .with_label_values(&[&self.target.name, "in_flight"])
                .inc();
        }
        Some(s.next_due)
    }
}

/// Stop flag with a condition variable, so sleeping threads wake at once.
#[derive(Default)]
pub struct Shutdown {
    stop: Mutex<bool>,
    cv: Condvar,
}

impl Shutdown {
    pub fn trigger(&self) {
        *lock(&self.stop) = true;
        self.cv.notify_all();
    }

    pub fn is_set(&self) -> bool {
        *lock(&self.stop)
    }

    /// Sleeps until `deadline` or shutdown; returns true when shutting down.
    pub fn sleep_until(&self, deadline: Instant) -> bool {
        let mut stop = lock(&self.stop);
        loop {
            if *stop {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            stop = self
                .cv
                .wait_timeout(stop, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// What the probe threads need from the rest of the agent.
pub struct Context {
    pub metrics: Arc<Metrics>,
    pub stalls: Arc<StallLog>,
    pub shutdown: Arc<Shutdown>,
    pub proc_root: PathBuf,
    pub sys_root: PathBuf,
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
            self.ctx
                .metrics
                .probe_duration
                .with_label_values(&[&t.name, mode.as_str(), op.as_str()])
                .observe(elapsed.as_secs_f64());
        }
        if elapsed >= t.stall_threshold {
            self.ctx
                .stalls
                .finished(self.shared, mode, op, self.seq.get(), elapsed, failure);
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
        let m = &ctx.metrics;
        let name = shared.target.name.as_str();
        // Pre-create the series that alerts and rate() need from the first scrape.
        for &(mode, op) in &shared.ops {
            m.probe_duration
                .with_label_values(&[name, mode.as_str(), op.as_str()]);
            m.stalls
                .with_label_values(&[name, mode.as_str(), op.as_str()]);
        }
        for &mode in &shared.target.modes {
            m.probes.with_label_values(&[name, mode.as_str()]);
        }
        for reason in ["in_flight", "not_mounted", "mount_changed"] {
            m.skipped.with_label_values(&[name, reason]);
        }
        m.target_up.with_label_values(&[name]).set(0);
        m.target_read_only.with_label_values(&[name]).set(0);
        m.last_success.with_label_values(&[name]).set(0.0);
        Worker {
            mounts: mounts::MountTable::new(&ctx.proc_root),
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
            self.shared.count_overdue(&self.ctx.metrics);
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
    fn check_mount(&mut self) -> Result<(Option<Mount>, Option<u64>), &'static str> {
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
                return Err("not_mounted");
            }
            Err(e) => {
                // Without a mount table the mount cannot be verified: do not write.
                warn!(error = %e, "cannot read the mount table");
                return Err("not_mounted");
            }
        };
        match &self.expected {
            Some(e) if !e.same_filesystem(&m) => {
                self.set_state(State::MountChanged(format!(
                    "expected {} ({}, {}), found {} ({}, {})",
                    e.source, e.fstype, e.maj_min, m.source, m.fstype, m.maj_min
                )));
                return Err("mount_changed");
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
        let metric = &self.ctx.metrics.target_info;
        if let Some(old) = &st.mount {
            let _ = metric.remove_label_values(&info_labels(t, old).each_ref().map(|s| s.as_str()));
        }
        if let Some(m) = mount {
            metric
                .with_label_values(&info_labels(t, m).each_ref().map(|s| s.as_str()))
                .set(1);
            self.ctx
                .stalls
                .set_devices(self.shared.index, devices_of(&self.ctx.sys_root, m));
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
                m.skipped.with_label_values(&[&name, reason]).inc();
                m.target_up.with_label_values(&[&name]).set(0);
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
                    m.probes.with_label_values(&[&name, mode.as_str()]).inc();
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
                    m.probes.with_label_values(&[&name, mode.as_str()]).inc();
                }
            }
        }
        for e in &errors {
            m.probe_errors
                .with_label_values(&[&name, e.mode.as_str(), e.op.as_str(), e.failure.label()])
                .inc();
            if e.failure == Failure::Errno(nix::errno::Errno::EROFS) {
                read_only = true;
            }
        }
        m.target_read_only
            .with_label_values(&[&name])
            .set(read_only as i64);
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
            m.target_up.with_label_values(&[&name]).set(1);
            m.last_success.with_label_values(&[&name]).set(
                now.duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs_f64(),
            );
            lock(&self.shared.status).last_success = Some(now);
            self.set_state(State::Up);
        } else {
            m.target_up.with_label_values(&[&name]).set(0);
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

fn info_labels(t: &Target, m: &Mount) -> [String; 6] {
    [
        t.name.clone(),
        t.path.display().to_string(),
        m.mount_point.display().to_string(),
        m.source.clone(),
        m.fstype.clone(),
        m.options(),
    ]
}

/// Where each target's probe files live.
pub fn probe_dir_of(path: &Path) -> PathBuf {
    path.join(ops::PROBE_DIR)
}
