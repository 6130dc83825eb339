//! A target and its lanes as the other threads see them: the target's shared state
//! (status, mount check, stop flag), each lane's schedule, in-flight slot and outcome,
//! the set of targets probed now, and what the lanes need from the rest of the agent.
//! Everything here is in atomics or behind short-held locks, never held across a system
//! call on the probed filesystem.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use tracing::{info, warn};

use super::devices::Devices;
use super::metrics::{ProbeMetrics, SkipReason, TargetSeries};
use super::pending::Pending;
use crate::base::labels::{ops_of, Mode, Op};
use crate::base::sync::{lock, Shutdown};
use crate::config::Target;
use crate::exposition::family::Counter;
use crate::history::History;
use crate::kernel::blockdev::TargetDevices;
use crate::kernel::kernfs::Roots;
use crate::kernel::mounts::{self, Mount};
use crate::stall::inflight::{InFlightOp, InflightSlot};
use crate::stall::log::StallLog;
use crate::stall::waits::LaneWaits;

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

pub(super) struct Sched {
    pub(super) next_due: Instant,
    pub(super) running: bool,
}

/// How a lane's last cycle ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Outcome {
    /// No cycle yet, or the last one was not started (not mounted, mount changed).
    None,
    Ok,
    /// Failed; the errors without their per-cycle detail, so a persisting fault keeps
    /// the same key and is logged once.
    Failed(String),
}

pub(super) struct LaneState {
    pub(super) outcome: Outcome,
    /// The last cycle answered EROFS.
    pub(super) erofs: bool,
}

/// One (target, mode): its own thread, schedule, in-flight slot, skips and outcome. A
/// lane blocked in the kernel holds nothing the other lanes of its target need.
///
/// Laid out by hand, a cache line each: the in-flight slot and the schedule (written by
/// the lane at every call and cycle, read by the watchdog at every look) share the
/// first, the outcome and what the lane reads of itself each cycle the second. After a
/// second asleep these lines are cold; fewer of them is fewer misses. A lane's lines
/// are its own, not shared with the other lanes of the target. Its pending calls
/// (`pending.rs`: a lock here, 16 calls of the lane's own on the heap) are written at
/// every call and by the readers that fold them.
#[repr(C, align(64))]
pub struct Lane {
    pub inflight: InflightSlot,
    pub(super) sched: Mutex<Sched>,
    pub mode: Mode,
    pub(super) state: Mutex<LaneState>,
    /// Unique among all lanes of the agent.
    pub id: usize,
    /// The ops this lane times, in order.
    pub ops: &'static [Op],
    /// The lane thread's id and the wait-point samples of its blocked call.
    pub waits: LaneWaits,
    /// `stallwatch_probes_skipped_total{reason="in_flight"}` of the target, and the
    /// lane's own counter of the same.
    skipped_in_flight: [Arc<Counter>; 2],
    /// The calls the lane has timed and not yet recorded in its histograms and history.
    pub pending: Pending,
}

/// The mount check of a target, shared by its lanes: one expected filesystem, checked
/// in the agent's one mount table (`Context::mounts`).
pub(super) struct MountCheck {
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
    pub(super) status: Mutex<Status>,
    pub(super) mount: Mutex<MountCheck>,
    /// The per-target series every cycle writes, looked up once.
    pub(super) series: TargetSeries,
    /// Stops this target's lanes: at shutdown, or when a reload removes or changes it.
    pub(super) stop: Shutdown,
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

    /// Records the calls every lane holds (`pending.rs`): before a reader of the
    /// histograms or the history looks.
    pub fn fold_pending(&self) {
        for t in self.current().iter() {
            t.fold_pending();
        }
    }

    pub fn replace(&self, targets: Vec<Arc<TargetShared>>) {
        *self.now.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(targets);
    }
}

impl TargetShared {
    /// Records the calls its lanes hold; drops them once the target is stopped (removed
    /// by a reload, or shutting down), whose series must not be written again.
    pub fn fold_pending(&self) {
        let stopped = self.stop.is_set();
        for lane in &self.lanes {
            if stopped {
                lane.pending.discard();
            } else {
                lane.pending.fold();
            }
        }
    }

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
        let series = metrics.target_series(&target.name);
        let start = grid_start(Instant::now(), target.interval);
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
                pending: Pending::default(),
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
            series,
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
        ctx.stalls.remove_target(&self.target.name, &self.ops);
        ctx.devices.remove(self.index);
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
    pub(super) fn check_mount(
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

    pub(super) fn set_state(&self, state: State) {
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
    pub(super) fn set_state_quiet(&self, state: State) -> bool {
        let mut st = lock(&self.status);
        if st.state == state {
            return false;
        }
        st.state = state;
        st.since = SystemTime::now();
        true
    }

    pub(super) fn update_mount_info(&self, ctx: &Context, mount: &Option<Mount>) {
        let t = &self.target;
        let mut st = lock(&self.status);
        if st.mount == *mount {
            return;
        }
        ctx.metrics.set_mount(t, st.mount.as_ref(), mount.as_ref());
        if let Some(m) = mount {
            ctx.devices.set(
                self.index,
                TargetDevices::beneath(&ctx.roots.sys_root, &m.maj_min),
            );
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
    pub(super) fn settle(&self, mount_read_only: bool) {
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
        self.series.set_read_only(read_only);
        self.series.set_up(all_ok);
        let mut st = lock(&self.status);
        st.cycles += 1;
        let was_read_only = std::mem::replace(&mut st.read_only, read_only);
        if all_ok {
            let now = SystemTime::now();
            st.last_success = Some(now);
            self.series.succeeded_at(now);
        }
        // Up already (every cycle of a healthy target): no second lock to find it so.
        let up_already = all_ok && st.state == State::Up;
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
            if !up_already {
                self.set_state(State::Up);
            }
        } else if !failing.is_empty() {
            self.set_state_quiet(State::Failing(failing.join("; ")));
        }
    }
}

/// The start of the lanes' schedule of a target created at `now`: the last point at or
/// before `now` of a grid of `interval` steps shared by every target of the process.
/// Targets with the same interval then wake at the same instants, as one timer expiry,
/// instead of microseconds apart (each wake-up landing while another lane runs and
/// preempting it). A lane whose first due time has passed runs at once, as before.
fn grid_start(now: Instant, interval: Duration) -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(|| now);
    let since = now.saturating_duration_since(epoch).as_nanos();
    let step = interval.as_nanos().max(1);
    // Whole steps: at most a few hundred years of nanoseconds, well within u64.
    epoch + Duration::from_nanos((since - since % step) as u64)
}

impl Lane {
    /// Counts the cycles that came due by `now` while the previous one is still
    /// running. Called by the watchdog (live, while a call is blocked; one `now` per
    /// look); the lock makes each due time counted once, with `end_cycle`.
    /// Returns the next due time while a cycle is running (when the next skip would
    /// be counted), None when idle.
    pub fn count_overdue(&self, now: Instant, interval: Duration) -> Option<Instant> {
        let mut s = lock(&self.sched);
        if !s.running {
            return None;
        }
        self.skip_due(&mut s, now, interval);
        Some(s.next_due)
    }

    /// The lane's cycle ended: counts the cycles that came due while it ran, as
    /// `count_overdue`, and marks the lane idle under the same lock (so no due time
    /// passes in between); returns when the next cycle is due.
    pub(super) fn end_cycle(&self, interval: Duration) -> Instant {
        let now = Instant::now();
        let mut s = lock(&self.sched);
        self.skip_due(&mut s, now, interval);
        s.running = false;
        s.next_due
    }

    fn skip_due(&self, s: &mut Sched, now: Instant, interval: Duration) {
        while s.next_due <= now {
            s.next_due += interval;
            for c in &self.skipped_in_flight {
                c.inc();
            }
        }
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
    /// The devices beneath each target, written by its lanes as they resolve its mount.
    pub devices: Arc<Devices>,
    /// The one mount table of all targets: read anew once per change of the mounts,
    /// not once per target (hosts whose containers mount and unmount all the time).
    /// Only procfs is read under its lock, never a probed filesystem.
    pub(super) mounts: Mutex<mounts::MountTable>,
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
            devices: Arc::default(),
            mounts: Mutex::new(mounts::MountTable::new(&roots.proc_root)),
            roots,
        }
    }

    /// The generation of the mount table, read anew first if the mounts changed; None
    /// when it cannot be read. A lane whose last check passed in this generation may
    /// reuse that check's result (`Worker::cycle`).
    pub(super) fn mount_generation(&self) -> Option<u64> {
        let mut t = lock(&self.mounts);
        t.current().ok()?;
        Some(t.generation())
    }
}
