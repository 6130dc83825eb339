//! The stall watchdog and the bounded log of stall events, each with the kernel's state
//! over the stall's window.
//!
//! A stall is counted when its operation crosses the threshold, while the call may still
//! be blocked, by the watchdog (`watchdog.rs`) that polls every target's in-flight slot.
//! If the call returns between two polls, the probe thread counts it on return instead.
//! Both paths go through one lock, so each stall is counted once. The log owns
//! `stallwatch_stalls_total`: nothing else writes it.
//!
//! Its `cause` label is the cause settled from the wait-point samples taken before the
//! crossing (sampling starts at a quarter of the threshold, `waits.rs`), `unknown` when
//! none was taken. The event's own `cause` goes on being refined from every sample until
//! the call returns, so for a call whose wait moves (writeback, then the journal) the
//! event may name another cause than the one it was counted under.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use strum::VariantArray;
use tracing::{info, warn};

use crate::base::labels::{Cause, Failure, Mode, Op};
use crate::base::sync::lock;
use crate::exposition::family::CounterVec;
use crate::exposition::registry::Registry;
use crate::kernel::blockdev::SyncAction;
use crate::kernel::vm::VmSample;
use crate::stall::evidence::{self, Evidence, Scope};
use crate::stall::inflight::InFlightOp;
use crate::stall::verdict::{self, Facts};
use crate::stall::waits::{SymbolCount, WaitSamples};

/// VM samples kept for the start of a stall's window (a stall is seen only once it has
/// lasted the threshold, so its first part is read back from here).
const HISTORY: usize = 1024;

/// What the sampler read of the block devices beneath the targets.
#[derive(Debug, Clone, Default)]
pub struct DeviceReading {
    /// Requests in flight (reads + writes) per whole disk.
    pub inflight: HashMap<String, u64>,
    /// Sync action per md array.
    pub md_action: HashMap<String, SyncAction>,
}

/// One sample of the kernel's state as the stall log keeps it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub vm: VmSample,
    pub devices: DeviceReading,
}

/// The kernel's state over a stall's window. Field names are contract (SPEC).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct VmContext {
    pub dirty_bytes_start: u64,
    pub dirty_bytes_max: u64,
    pub writeback_bytes_max: u64,
    pub dirty_threshold_bytes: u64,
    pub dirty_background_threshold_bytes: u64,
    /// PSI io time accrued during the stall; null without PSI.
    pub io_pressure_some_seconds: Option<f64>,
    pub io_pressure_full_seconds: Option<f64>,
}

/// An md array beneath the target and its sync action during the stall (the busiest
/// one seen: a check that ran for part of the window is reported).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MdContext {
    pub device: String,
    /// `unknown` until the sampler has read the array.
    #[serde(serialize_with = "action_or_unknown")]
    pub sync_action: Option<SyncAction>,
}

impl MdContext {
    pub fn action_label(&self) -> &'static str {
        self.sync_action.map_or("unknown", SyncAction::as_str)
    }
}

fn action_or_unknown<S: serde::Serializer>(
    a: &Option<SyncAction>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_str(a.map_or("unknown", SyncAction::as_str))
}

/// The backing device and its peak in-flight requests during the stall.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DeviceContext {
    pub device: String,
    pub inflight_requests_max: u64,
}

/// One stall, as `/api/stalls` serves it.
#[derive(Debug, Clone, Serialize)]
pub struct StallEvent {
    pub target: String,
    pub mode: &'static str,
    pub op: &'static str,
    #[serde(serialize_with = "rfc3339")]
    pub started_at: SystemTime,
    /// Time blocked so far while ongoing; the call's duration once it returned.
    pub duration_seconds: f64,
    pub ongoing: bool,
    pub error: Option<String>,
    pub vm: VmContext,
    pub md: Vec<MdContext>,
    pub device: Option<DeviceContext>,
    /// The other lanes of the target blocked past the threshold during the stall: all
    /// of them on a frozen filesystem, none when only this call is held.
    pub also_blocked: Vec<BlockedLane>,
    /// The kernel wait points sampled while the call was blocked, most frequent first.
    pub wchan: Vec<SymbolCount>,
    /// The kernel stack at the deciding wait point, innermost frame first; null when
    /// `/proc/self/task/TID/stack` is not readable (without CAP_SYS_ADMIN).
    pub stack: Option<Vec<String>>,
    /// Why the call was held (`causes.rs`), from the samples so far.
    pub cause: Cause,
    /// The cause `stallwatch_stalls_total` counted this stall under: the cause settled
    /// at the crossing.
    pub counted_cause: Cause,
    /// One sentence from the evidence above (`verdict.rs`).
    pub verdict: String,
    /// Who was dirtying, what the devices did, the journal: read by the evidence worker
    /// from the crossing on, once a second, and once more after the call returned.
    pub evidence: Evidence,
    #[serde(skip)]
    started: Instant,
    /// The lane and the call's sequence number in it.
    #[serde(skip)]
    key: (usize, u64),
    #[serde(skip)]
    pressure_start: Option<(f64, f64)>,
    #[serde(skip)]
    disk: Option<String>,
    #[serde(skip)]
    arrays: Vec<String>,
    /// The wait point that decided `cause`.
    #[serde(skip)]
    symbol: Option<String>,
    #[serde(skip)]
    scope: Scope,
}

/// Which event the evidence worker is reading for: its lane and call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventId(usize, u64);

/// Another lane's call, blocked at the same time as the stalled one.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BlockedLane {
    pub mode: &'static str,
    pub op: &'static str,
    /// The longest it was seen blocked while the stall lasted.
    pub blocked_seconds: f64,
}

/// Which lane a call belongs to.
#[derive(Debug, Clone, Copy)]
pub struct LaneKey<'a> {
    /// The target's number in the configuration.
    pub target: usize,
    /// The lane's number, unique in the agent.
    pub lane: usize,
    /// The target's name.
    pub name: &'a str,
}

/// A call slower than the threshold that returned.
#[derive(Debug, Clone)]
pub struct FinishedCall {
    pub mode: Mode,
    pub op: Op,
    /// The call's sequence number in its lane's in-flight slot.
    pub seq: u64,
    pub elapsed: Duration,
    pub failure: Option<Failure>,
    /// The wait-point samples of the call, if it was sampled.
    pub waits: Option<WaitSamples>,
}

/// Adds the calls of `others` to `into`, keeping each one's longest time blocked.
fn merge_blocked(into: &mut Vec<BlockedLane>, others: &[InFlightOp]) {
    for o in others {
        let age = o.age.as_secs_f64();
        match into
            .iter_mut()
            .find(|b| b.mode == o.mode.as_str() && b.op == o.op.as_str())
        {
            Some(b) => b.blocked_seconds = b.blocked_seconds.max(age),
            None => into.push(BlockedLane {
                mode: o.mode.as_str(),
                op: o.op.as_str(),
                blocked_seconds: age,
            }),
        }
    }
}

fn rfc3339<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&humantime::format_rfc3339_millis(*t).to_string())
}

/// Names of the devices beneath a target, set by its probe thread once resolved.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TargetDevices {
    pub disk: Option<String>,
    pub arrays: Vec<String>,
    /// The filesystem's own device (`sda1`; the disk itself when unpartitioned).
    pub device: Option<String>,
    /// The leaf devices beneath md arrays or other stacked devices (`sdb1`, `sdc`).
    pub members: Vec<String>,
}

impl TargetDevices {
    fn scope(&self) -> Scope {
        Scope {
            disk: self.disk.clone(),
            device: self.device.clone(),
            members: self.members.clone(),
        }
    }
}

/// Wakes the evidence worker when a stall starts or ends; closed at shutdown.
#[derive(Default)]
struct Signal {
    /// (changes so far, closed)
    state: Mutex<(u64, bool)>,
    cv: Condvar,
}

struct Inner {
    /// Newest first.
    events: VecDeque<StallEvent>,
    history: VecDeque<Snapshot>,
    /// Per target, the seq of the last operation counted as a stall.
    counted: HashMap<usize, u64>,
    devices: HashMap<usize, TargetDevices>,
    /// Bumped at every change of an event, so a reader can tell nothing changed.
    changes: u64,
}

/// The newest `limit` events, ongoing ones with their age so far.
fn copy_events(inner: &Inner, limit: usize) -> Vec<StallEvent> {
    inner
        .events
        .iter()
        .take(limit)
        .map(|e| {
            let mut e = e.clone();
            if e.ongoing {
                e.duration_seconds = e.started.elapsed().as_secs_f64();
                set_verdict(&mut e);
            }
            e
        })
        .collect()
}

/// The stall counter's single writer path and the ring of recent events.
pub struct StallLog {
    inner: Mutex<Inner>,
    capacity: usize,
    stalls: Arc<CounterVec>,
    signal: Signal,
}

impl StallLog {
    /// An empty log of `capacity` events; registers `stallwatch_stalls_total`.
    pub fn new(capacity: usize, registry: &Registry) -> StallLog {
        let stalls = Arc::new(CounterVec::new(
            "stallwatch_stalls_total",
            "Operations slower than the stall threshold, counted when the threshold is crossed, while the call may still be blocked; cause: where the kernel held the call, as sampled before the crossing.",
            &["target", "mode", "op", "cause"],
        ));
        registry.register_family(Arc::clone(&stalls) as _);
        StallLog {
            inner: Mutex::new(Inner {
                events: VecDeque::with_capacity(capacity.min(1024)),
                history: VecDeque::with_capacity(HISTORY),
                counted: HashMap::new(),
                devices: HashMap::new(),
                changes: 0,
            }),
            capacity,
            stalls,
            signal: Signal::default(),
        }
    }

    /// Creates a target's stall series at 0, so alerts and `rate()` see them from the
    /// first scrape.
    pub fn add_target(&self, name: &str, ops: &[(Mode, Op)]) {
        for &(mode, op) in ops {
            for cause in Cause::VARIANTS {
                self.stalls
                    .with_label_values(&[name, mode.as_str(), op.as_str(), cause.as_str()]);
            }
        }
    }

    /// Forgets a target no longer probed: its stall series and its devices. Its events
    /// stay in the ring, as history; one still ongoing ends now, since nothing will
    /// report its call's return.
    pub fn remove_target(&self, target: usize, name: &str, ops: &[(Mode, Op)]) {
        for &(mode, op) in ops {
            for cause in Cause::VARIANTS {
                let _ = self.stalls.remove_label_values(&[
                    name,
                    mode.as_str(),
                    op.as_str(),
                    cause.as_str(),
                ]);
            }
        }
        let mut inner = lock(&self.inner);
        inner.devices.remove(&target);
        inner.changes += 1;
        for ev in inner
            .events
            .iter_mut()
            .filter(|e| e.ongoing && e.target == name)
        {
            ev.ongoing = false;
            ev.duration_seconds = ev.started.elapsed().as_secs_f64();
            ev.error = Some("target removed by a reload while the call was blocked".into());
            set_verdict(ev);
        }
        drop(inner);
        self.wake_evidence();
    }

    /// How many stalls of `name`'s `mode` `op` were counted, whatever their cause.
    pub fn count_of(&self, name: &str, mode: Mode, op: Op) -> u64 {
        Cause::VARIANTS
            .iter()
            .map(|c| self.cause_count_of(name, mode, op, *c))
            .sum()
    }

    /// How many stalls of `name`'s `mode` `op` were counted under `cause`.
    pub fn cause_count_of(&self, name: &str, mode: Mode, op: Op, cause: Cause) -> u64 {
        self.stalls
            .with_label_values(&[name, mode.as_str(), op.as_str(), cause.as_str()])
            .get()
    }

    /// Records which devices lie beneath a target, for the context of its stalls.
    pub fn set_devices(&self, target: usize, devices: TargetDevices) {
        lock(&self.inner).devices.insert(target, devices);
    }

    /// The whole disks and md arrays beneath all targets, for the sampler to read.
    pub fn watched_devices(&self) -> (BTreeSet<String>, BTreeSet<String>) {
        let inner = lock(&self.inner);
        let disks = inner
            .devices
            .values()
            .filter_map(|d| d.disk.clone())
            .collect();
        let arrays = inner
            .devices
            .values()
            .flat_map(|d| d.arrays.iter().cloned())
            .collect();
        (disks, arrays)
    }

    /// The whole disks beneath all targets and the leaf devices beneath them, for the
    /// device facts.
    pub fn backing_devices(&self) -> BTreeSet<String> {
        let inner = lock(&self.inner);
        inner
            .devices
            .values()
            .flat_map(|d| d.disk.iter().chain(d.members.iter()).cloned())
            .collect()
    }

    /// The ongoing stalls and the devices of each, for the evidence worker.
    pub fn ongoing_scopes(&self) -> Vec<(EventId, Scope)> {
        let inner = lock(&self.inner);
        inner
            .events
            .iter()
            .filter(|e| e.ongoing)
            .map(|e| (EventId(e.key.0, e.key.1), e.scope.clone()))
            .collect()
    }

    /// The evidence worker's latest view of an event's window; `last`: the call has
    /// returned and this was the reading after it, logged with the evidence phrases.
    pub fn set_evidence(&self, id: EventId, evidence: Evidence, last: bool) {
        let mut inner = lock(&self.inner);
        let Some(ev) = inner.events.iter_mut().find(|e| e.key == (id.0, id.1)) else {
            return;
        };
        ev.evidence = evidence;
        ev.evidence.complete = last;
        set_verdict(ev);
        if last {
            let (phrases, idle) = evidence::phrases(&ev.evidence);
            info!(target = %ev.target, mode = ev.mode, op = ev.op,
                duration_seconds = ev.duration_seconds,
                reads = ev.evidence.reads,
                device_idle = idle.map_or("unknown", |i| if i { "yes" } else { "no" }),
                evidence = %phrases.join("; "),
                verdict = %ev.verdict,
                "stall evidence");
        }
    }

    /// Blocks the evidence worker until a stall starts or ends after change `seen`, or
    /// until `until`; returns the latest change number, None once closed.
    pub fn wait_evidence(&self, seen: u64, until: Option<Instant>) -> Option<u64> {
        let mut st = lock(&self.signal.state);
        loop {
            if st.1 {
                return None;
            }
            if st.0 != seen {
                return Some(st.0);
            }
            st = match until {
                None => self.signal.cv.wait(st).unwrap_or_else(|e| e.into_inner()),
                Some(t) => {
                    let now = Instant::now();
                    if now >= t {
                        return Some(st.0);
                    }
                    self.signal
                        .cv
                        .wait_timeout(st, t - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
    }

    /// Ends the evidence worker's wait for good (shutdown).
    pub fn close_evidence(&self) {
        lock(&self.signal.state).1 = true;
        self.signal.cv.notify_all();
    }

    fn wake_evidence(&self) {
        lock(&self.signal.state).0 += 1;
        self.signal.cv.notify_all();
    }

    /// The recent events, newest first, ongoing ones with their age so far.
    pub fn events(&self) -> Vec<StallEvent> {
        self.recent(usize::MAX)
    }

    /// The log's change count, and its events as [`StallLog::events`] unless the count
    /// is still `known` and no event is ongoing (an ongoing one changes as it lasts):
    /// what `/api/history` needs to skip the events a page already has.
    pub fn events_if_changed(&self, known: Option<u64>) -> (u64, Option<Vec<StallEvent>>) {
        let inner = lock(&self.inner);
        if known == Some(inner.changes) && !inner.events.iter().any(|e| e.ongoing) {
            return (inner.changes, None);
        }
        (inner.changes, Some(copy_events(&inner, usize::MAX)))
    }

    /// The newest `limit` events, as [`StallLog::events`]; copies only those.
    pub fn recent(&self, limit: usize) -> Vec<StallEvent> {
        copy_events(&lock(&self.inner), limit)
    }

    /// The watchdog saw `op` of lane `key` in flight past its threshold, and `others`,
    /// the other lanes of the target blocked past it too; `waits`, the call's wait-point
    /// samples so far. Called at every look while the call lasts: counted the first time
    /// (under the cause the samples give then), the other lanes and the samples gathered
    /// every time.
    pub fn crossed(
        &self,
        key: LaneKey<'_>,
        op: InFlightOp,
        others: &[InFlightOp],
        waits: Option<&WaitSamples>,
    ) {
        let mut inner = lock(&self.inner);
        inner.changes += 1;
        if inner.counted.get(&key.lane) == Some(&op.seq) {
            if let Some(ev) = inner
                .events
                .iter_mut()
                .find(|e| e.ongoing && e.key == (key.lane, op.seq))
            {
                merge_blocked(&mut ev.also_blocked, others);
                set_waits(ev, waits);
                ev.duration_seconds = op.age.as_secs_f64();
                set_verdict(ev);
            }
            return;
        }
        inner.counted.insert(key.lane, op.seq);
        let name = key.name;
        let mut ev = self.new_event(&inner, key, op.mode, op.op, op.seq, op.started, true);
        merge_blocked(&mut ev.also_blocked, others);
        set_waits(&mut ev, waits);
        ev.counted_cause = ev.cause;
        set_verdict(&mut ev);
        self.count(name, op.mode, op.op, ev.cause);
        let (md, device, inflight) = log_fields(&ev);
        warn!(target = %name, mode = %op.mode, op = %op.op,
            blocked_seconds = op.age.as_secs_f64(),
            cause = %ev.cause,
            wchan = ev.symbol.as_deref().unwrap_or("none"),
            dirty_bytes_start = ev.vm.dirty_bytes_start,
            dirty_bytes_max = ev.vm.dirty_bytes_max,
            writeback_bytes_max = ev.vm.writeback_bytes_max,
            dirty_threshold_bytes = ev.vm.dirty_threshold_bytes,
            md = %md, device = %device, device_inflight_max = inflight,
            also_blocked = %blocked_field(&ev.also_blocked),
            verdict = %ev.verdict,
            "stall started: operation blocked past the threshold");
        self.push(&mut inner, ev);
        drop(inner);
        self.wake_evidence();
    }

    /// A call of lane `key` slower than the threshold returned; `others` are the other
    /// lanes of the target blocked past the threshold right now.
    pub fn finished(&self, key: LaneKey<'_>, call: FinishedCall, others: &[InFlightOp]) {
        let FinishedCall {
            mode,
            op,
            seq,
            elapsed,
            failure,
            waits,
        } = call;
        let mut inner = lock(&self.inner);
        inner.changes += 1;
        let started = Instant::now() - elapsed;
        if inner.counted.get(&key.lane) != Some(&seq) {
            // Returned between two watchdog ticks: count it now.
            inner.counted.insert(key.lane, seq);
            let mut ev = self.new_event(&inner, key, mode, op, seq, started, false);
            set_waits(&mut ev, waits.as_ref());
            ev.counted_cause = ev.cause;
            self.count(key.name, mode, op, ev.cause);
            self.push(&mut inner, ev);
        }
        let latest = inner.history.back().cloned();
        let Some(ev) = inner.events.iter_mut().find(|e| e.key == (key.lane, seq)) else {
            return;
        };
        if let Some(s) = &latest {
            update(ev, s);
        }
        merge_blocked(&mut ev.also_blocked, others);
        set_waits(ev, waits.as_ref());
        ev.ongoing = false;
        ev.duration_seconds = elapsed.as_secs_f64();
        ev.error = failure.map(|f| f.to_string());
        set_verdict(ev);
        let (md, device, inflight) = log_fields(ev);
        warn!(target = %ev.target, mode = ev.mode, op = ev.op,
            duration_seconds = ev.duration_seconds,
            cause = %ev.cause,
            wchan = ev.symbol.as_deref().unwrap_or("none"),
            error = ev.error.as_deref().unwrap_or("none"),
            dirty_bytes_start = ev.vm.dirty_bytes_start,
            dirty_bytes_max = ev.vm.dirty_bytes_max,
            writeback_bytes_max = ev.vm.writeback_bytes_max,
            dirty_threshold_bytes = ev.vm.dirty_threshold_bytes,
            io_pressure_full_seconds = ev.vm.io_pressure_full_seconds.unwrap_or(0.0),
            md = %md, device = %device, device_inflight_max = inflight,
            also_blocked = %blocked_field(&ev.also_blocked),
            verdict = %ev.verdict,
            "stall ended");
        drop(inner);
        // The evidence worker reads once more, for the end of the window.
        self.wake_evidence();
    }

    /// A new sample from the VM sampler: kept for later windows, and folded into every
    /// ongoing stall's maxima.
    pub fn observe(&self, snap: Snapshot) {
        let mut inner = lock(&self.inner);
        for ev in inner.events.iter_mut().filter(|e| e.ongoing) {
            update(ev, &snap);
        }
        if inner.events.iter().any(|e| e.ongoing) {
            inner.changes += 1;
        }
        if inner.history.len() == HISTORY {
            inner.history.pop_front();
        }
        inner.history.push_back(snap);
    }

    /// The latest sample, for the landing page.
    pub fn latest(&self) -> Option<Snapshot> {
        lock(&self.inner).history.back().cloned()
    }

    fn count(&self, name: &str, mode: Mode, op: Op, cause: Cause) {
        self.stalls
            .with_label_values(&[name, mode.as_str(), op.as_str(), cause.as_str()])
            .inc();
    }

    fn push(&self, inner: &mut Inner, ev: StallEvent) {
        if inner.events.len() == self.capacity {
            inner.events.pop_back();
        }
        inner.events.push_front(ev);
    }

    #[allow(clippy::too_many_arguments)]
    fn new_event(
        &self,
        inner: &Inner,
        key: LaneKey<'_>,
        mode: Mode,
        op: Op,
        seq: u64,
        started: Instant,
        ongoing: bool,
    ) -> StallEvent {
        let devs = inner.devices.get(&key.target).cloned().unwrap_or_default();
        // The last sample at or before the start gives the state the call met; the
        // samples since then give the window so far.
        let before = inner.history.iter().rev().find(|s| s.vm.at <= started);
        let first = before.or_else(|| inner.history.iter().find(|s| s.vm.at > started));
        let mut ev = StallEvent {
            target: key.name.to_owned(),
            mode: mode.as_str(),
            op: op.as_str(),
            started_at: SystemTime::now() - started.elapsed(),
            duration_seconds: started.elapsed().as_secs_f64(),
            ongoing,
            error: None,
            vm: VmContext::default(),
            md: devs
                .arrays
                .iter()
                .map(|a| MdContext {
                    device: a.clone(),
                    sync_action: None,
                })
                .collect(),
            device: devs.disk.as_ref().map(|d| DeviceContext {
                device: d.clone(),
                inflight_requests_max: 0,
            }),
            also_blocked: Vec::new(),
            wchan: Vec::new(),
            stack: None,
            cause: Cause::Unknown,
            counted_cause: Cause::Unknown,
            verdict: String::new(),
            evidence: Evidence::default(),
            started,
            key: (key.lane, seq),
            pressure_start: None,
            disk: devs.disk.clone(),
            arrays: devs.arrays.clone(),
            symbol: None,
            scope: devs.scope(),
        };
        if let Some(s) = first {
            ev.vm.dirty_bytes_start = s.vm.counters.dirty_bytes;
            ev.pressure_start = s.vm.pressure.map(|p| (p.some_seconds, p.full_seconds));
            update(&mut ev, s);
        }
        for s in inner.history.iter().filter(|s| s.vm.at > started) {
            update(&mut ev, s);
        }
        set_verdict(&mut ev);
        ev
    }
}

/// Takes the call's wait-point samples into the event; samples absent (the call was
/// not sampled, or a look found none yet) leave what the event has.
fn set_waits(ev: &mut StallEvent, waits: Option<&WaitSamples>) {
    let Some(w) = waits else {
        return;
    };
    ev.wchan = w.wchan();
    ev.stack = w.stack().map(<[String]>::to_vec);
    ev.cause = w.cause();
    ev.symbol = w.symbol().map(str::to_owned);
}

/// Builds the event's verdict from its fields, the evidence worker's phrases (top
/// dirtiers, writers, device figures, the journal) and whether the device was idle. Built
/// anew whenever any of them changes: the evidence arrives after the crossing and its
/// final reading after the call returned.
fn set_verdict(ev: &mut StallEvent) {
    let facts = Facts {
        op: ev.op,
        seconds: ev.duration_seconds,
        ongoing: ev.ongoing,
        cause: Some(ev.cause),
        symbol: ev.symbol.as_deref(),
        dirty_bytes_max: ev.vm.dirty_bytes_max,
        writeback_bytes_max: ev.vm.writeback_bytes_max,
        dirty_threshold_bytes: ev.vm.dirty_threshold_bytes,
        md: ev
            .md
            .iter()
            .map(|m| (m.device.as_str(), m.action_label()))
            .collect(),
    };
    let (phrases, idle) = evidence::phrases(&ev.evidence);
    ev.verdict = verdict::verdict(&facts, &phrases, idle);
}

/// The md and device context as flat log values: `md0=check`, `sda`, peak in flight.
fn log_fields(ev: &StallEvent) -> (String, String, u64) {
    let md: Vec<String> = ev
        .md
        .iter()
        .map(|m| format!("{}={}", m.device, m.action_label()))
        .collect();
    let (device, inflight) = ev
        .device
        .as_ref()
        .map(|d| (d.device.clone(), d.inflight_requests_max))
        .unwrap_or_else(|| ("none".into(), 0));
    (md.join(","), device, inflight)
}

/// The other blocked lanes as one log value: `create:create,overwrite:fsync`, or `none`.
fn blocked_field(b: &[BlockedLane]) -> String {
    if b.is_empty() {
        return "none".into();
    }
    let v: Vec<String> = b.iter().map(|b| format!("{}:{}", b.mode, b.op)).collect();
    v.join(",")
}

/// Folds one sample into an event's window.
fn update(ev: &mut StallEvent, s: &Snapshot) {
    let c = &s.vm.counters;
    ev.vm.dirty_bytes_max = ev.vm.dirty_bytes_max.max(c.dirty_bytes);
    ev.vm.writeback_bytes_max = ev.vm.writeback_bytes_max.max(c.writeback_bytes);
    ev.vm.dirty_threshold_bytes = c.dirty_threshold_bytes;
    ev.vm.dirty_background_threshold_bytes = c.dirty_background_threshold_bytes;
    match (ev.pressure_start, s.vm.pressure) {
        (Some((some0, full0)), Some(p)) => {
            ev.vm.io_pressure_some_seconds = Some((p.some_seconds - some0).max(0.0));
            ev.vm.io_pressure_full_seconds = Some((p.full_seconds - full0).max(0.0));
        }
        (None, Some(p)) => ev.pressure_start = Some((p.some_seconds, p.full_seconds)),
        _ => {}
    }
    if let (Some(disk), Some(dev)) = (&ev.disk, ev.device.as_mut()) {
        if let Some(&n) = s.devices.inflight.get(disk) {
            dev.inflight_requests_max = dev.inflight_requests_max.max(n);
        }
    }
    for (name, md) in ev.arrays.iter().zip(ev.md.iter_mut()) {
        if let Some(&action) = s.devices.md_action.get(name) {
            // Keep the busiest action seen: "idle" never hides a check seen earlier.
            let idle = Some(SyncAction::Idle);
            if md.sync_action.is_none() || (md.sync_action == idle && Some(action) != idle) {
                md.sync_action = Some(action);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::vm::{IoPressureTotals, VmCounters};

    fn snap(
        at: Instant,
        dirty: u64,
        wb: u64,
        full: f64,
        md: SyncAction,
        inflight: u64,
    ) -> Snapshot {
        let mut devices = DeviceReading::default();
        devices.md_action.insert("md0".into(), md);
        devices.inflight.insert("sdb".into(), inflight);
        Snapshot {
            vm: VmSample {
                at,
                counters: VmCounters {
                    dirty_bytes: dirty,
                    writeback_bytes: wb,
                    dirty_threshold_bytes: 1000,
                    dirty_background_threshold_bytes: 500,
                    dirtied_bytes: 0,
                    written_bytes: 0,
                },
                pressure: Some(IoPressureTotals {
                    some_seconds: full * 2.0,
                    full_seconds: full,
                }),
                sysctls: None,
            },
            devices,
        }
    }

    const KEY: LaneKey<'static> = LaneKey {
        target: 0,
        lane: 1,
        name: "t",
    };

    fn call(seq: u64, elapsed: Duration, failure: Option<Failure>) -> FinishedCall {
        FinishedCall {
            mode: Mode::Overwrite,
            op: Op::Fsync,
            seq,
            elapsed,
            failure,
            waits: None,
        }
    }

    fn in_flight(mode: Mode, op: Op, seq: u64, age: Duration) -> InFlightOp {
        InFlightOp {
            mode,
            op,
            seq,
            started: Instant::now() - age,
            age,
        }
    }

    #[test]
    fn other_blocked_lanes_are_gathered_while_the_stall_lasts() {
        let log = setup();
        let fsync = in_flight(Mode::Overwrite, Op::Fsync, 4, Duration::from_secs(2));
        log.crossed(KEY, fsync, &[], None);
        assert!(log.events()[0].also_blocked.is_empty(), "only fsync so far");
        let create = in_flight(Mode::Create, Op::Create, 7, Duration::from_secs(1));
        log.crossed(KEY, fsync, &[create], None);
        let longer = in_flight(Mode::Create, Op::Create, 7, Duration::from_secs(3));
        log.crossed(KEY, fsync, &[longer], None);
        assert_eq!(counted(&log), 1, "looking again does not count again");
        let write = in_flight(Mode::Append, Op::Write, 2, Duration::from_secs(1));
        log.finished(KEY, call(4, Duration::from_secs(5), None), &[write]);
        let ev = &log.events()[0];
        assert_eq!(
            ev.also_blocked,
            vec![
                BlockedLane {
                    mode: "create",
                    op: "create",
                    blocked_seconds: 3.0
                },
                BlockedLane {
                    mode: "append",
                    op: "write",
                    blocked_seconds: 1.0
                },
            ]
        );
        let json = serde_json::to_value(ev).unwrap();
        assert_eq!(json["also_blocked"][0]["mode"], "create");
        // Another lane's call with the same sequence number is another call.
        let other = LaneKey { lane: 2, ..KEY };
        log.crossed(other, fsync, &[], None);
        assert_eq!(counted(&log), 2);
    }

    fn setup() -> StallLog {
        let log = StallLog::new(2, &Registry::new());
        log.set_devices(
            0,
            TargetDevices {
                disk: Some("sdb".into()),
                arrays: vec!["md0".into()],
                ..TargetDevices::default()
            },
        );
        log
    }

    fn counted(log: &StallLog) -> u64 {
        log.count_of("t", Mode::Overwrite, Op::Fsync)
    }

    #[test]
    fn window_context_from_history_and_later_samples() {
        let log = setup();
        let start = Instant::now() - Duration::from_millis(600);
        log.observe(snap(
            start - Duration::from_millis(50),
            100,
            0,
            1.0,
            SyncAction::Idle,
            1,
        ));
        log.observe(snap(
            start + Duration::from_millis(100),
            300,
            50,
            1.5,
            SyncAction::Check,
            7,
        ));
        let op = InFlightOp {
            mode: Mode::Overwrite,
            op: Op::Fsync,
            seq: 9,
            started: start,
            age: start.elapsed(),
        };
        log.crossed(KEY, op, &[], None);
        log.crossed(KEY, op, &[], None);
        assert_eq!(counted(&log), 1, "a crossing is counted once");
        let ev = &log.events()[0];
        assert!(ev.ongoing);
        assert_eq!(ev.vm.dirty_bytes_start, 100);
        assert_eq!(ev.vm.dirty_bytes_max, 300);
        assert_eq!(ev.md[0].sync_action, Some(SyncAction::Check));
        // Later samples while ongoing raise the maxima; idle does not hide the check.
        log.observe(snap(Instant::now(), 200, 90, 4.0, SyncAction::Idle, 3));
        log.finished(KEY, call(9, start.elapsed(), None), &[]);
        assert_eq!(counted(&log), 1, "finishing does not count again");
        let ev = &log.events()[0];
        assert!(!ev.ongoing);
        assert_eq!(
            (ev.vm.dirty_bytes_max, ev.vm.writeback_bytes_max),
            (300, 90)
        );
        assert_eq!(ev.vm.io_pressure_full_seconds, Some(3.0));
        assert_eq!(ev.vm.dirty_threshold_bytes, 1000);
        assert_eq!(ev.md[0].sync_action, Some(SyncAction::Check));
        assert_eq!(ev.device.as_ref().unwrap().inflight_requests_max, 7);
        let json = serde_json::to_value(ev).unwrap();
        assert_eq!(json["md"][0]["device"], "md0");
        assert_eq!(json["md"][0]["sync_action"], "check");
        assert_eq!(json["ongoing"], false);
        assert!(json["started_at"].as_str().unwrap().ends_with('Z'));
    }

    fn sampled(symbols: &[&str]) -> WaitSamples {
        let mut w = WaitSamples::default();
        for s in symbols {
            w.add(&crate::stall::waits::Sample {
                wchan: Some(s.to_string()),
                stack: None,
            });
        }
        w
    }

    #[test]
    fn counted_under_the_cause_at_the_crossing_while_the_event_follows_later_samples() {
        let log = setup();
        let op = in_flight(Mode::Overwrite, Op::Fsync, 3, Duration::from_secs(1));
        let before = sampled(&["folio_wait_writeback", "folio_wait_writeback"]);
        log.crossed(KEY, op, &[], Some(&before));
        let by = |c| log.cause_count_of("t", Mode::Overwrite, Op::Fsync, c);
        assert_eq!(by(Cause::WritebackWait), 1);
        let ev = &log.events()[0];
        assert_eq!(
            (ev.cause, ev.counted_cause),
            (Cause::WritebackWait, Cause::WritebackWait)
        );
        assert!(ev
            .verdict
            .contains("in folio_wait_writeback (waiting for writeback)"));
        // The wait moves to the journal after the crossing: the event says so, the
        // counter keeps the cause it was counted under.
        let later = sampled(&[
            "folio_wait_writeback",
            "folio_wait_writeback",
            "jbd2_log_wait_commit",
            "jbd2_log_wait_commit",
            "jbd2_log_wait_commit",
        ]);
        log.crossed(KEY, op, &[], Some(&later));
        let mut done = call(3, Duration::from_secs(4), None);
        done.waits = Some(later);
        log.finished(KEY, done, &[]);
        let ev = &log.events()[0];
        assert_eq!(
            (ev.cause, ev.counted_cause),
            (Cause::Journal, Cause::WritebackWait)
        );
        assert_eq!(ev.wchan[0].symbol, "jbd2_log_wait_commit");
        assert!(
            ev.verdict
                .starts_with("fsync blocked 4.0 s in jbd2_log_wait_commit"),
            "{}",
            ev.verdict
        );
        assert_eq!((by(Cause::WritebackWait), by(Cause::Journal)), (1, 0));
        let json = serde_json::to_value(ev).unwrap();
        assert_eq!(json["cause"], "journal");
        assert_eq!(json["wchan"][0]["count"], 3);
        assert_eq!(json["stack"], serde_json::Value::Null);
        // Returned between two looks, never sampled: unknown.
        log.finished(KEY, call(4, Duration::from_secs(2), None), &[]);
        assert_eq!(by(Cause::Unknown), 1);
        assert_eq!(
            log.events()[0].verdict,
            "fsync blocked 2.0 s (no wait point sampled)"
        );
    }

    #[test]
    fn the_evidence_worker_is_woken_by_starts_and_ends_and_fills_the_event() {
        let log = setup();
        assert!(log.ongoing_scopes().is_empty());
        let seen = log.wait_evidence(0, Some(Instant::now())).unwrap();
        let fsync = in_flight(Mode::Overwrite, Op::Fsync, 4, Duration::from_secs(2));
        log.crossed(KEY, fsync, &[], None);
        let started = log
            .wait_evidence(seen, None)
            .expect("a start wakes the worker");
        let ongoing = log.ongoing_scopes();
        assert_eq!(ongoing.len(), 1);
        assert_eq!(ongoing[0].1.disk.as_deref(), Some("sdb"));
        let mut e = Evidence {
            reads: 1,
            ..Evidence::default()
        };
        log.set_evidence(ongoing[0].0, e.clone(), false);
        assert_eq!(log.events()[0].evidence.reads, 1);
        // Looking again is no change; the end is.
        log.crossed(KEY, fsync, &[], None);
        assert_eq!(
            log.wait_evidence(started, Some(Instant::now())),
            Some(started)
        );
        log.finished(KEY, call(4, Duration::from_secs(3), None), &[]);
        assert!(log.wait_evidence(started, None).unwrap() > started);
        assert!(log.ongoing_scopes().is_empty());
        e.reads = 2;
        log.set_evidence(ongoing[0].0, e, true);
        let json = serde_json::to_value(&log.events()[0]).unwrap();
        assert_eq!(json["evidence"]["reads"], 2);
        assert_eq!(json["evidence"]["complete"], true);
        log.close_evidence();
        assert_eq!(log.wait_evidence(0, None), None);
    }

    #[test]
    fn returned_between_ticks_is_counted_on_return_and_ring_is_bounded() {
        let log = setup();
        for seq in 1..=3 {
            let eio = Some(Failure::Errno(nix::errno::Errno::EIO));
            log.finished(KEY, call(seq, Duration::from_millis(700), eio), &[]);
        }
        assert_eq!(counted(&log), 3);
        let ev = log.events();
        assert_eq!(ev.len(), 2, "ring bounded at stall_log_size");
        assert!(ev[0].started_at >= ev[1].started_at, "newest first");
        assert!(ev[0].error.as_deref().unwrap().contains("EIO"));
        assert_eq!(ev[0].duration_seconds, 0.7);
    }
}
