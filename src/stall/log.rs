//! The stall log: the bounded ring of stall events (`event.rs`), each with the kernel's
//! state over the stall's window, and `stallwatch_stalls_total`.
//!
//! A stall is counted when its operation crosses the threshold, while the call may still
//! be blocked: the probe's watchdog, which polls every lane's in-flight slot, reports
//! the crossing here. If the call returns between two polls, the probe thread counts it
//! on return instead. Either hands over the devices beneath the target with the call.
//! Both paths go through one lock, so each stall is counted once. The log owns
//! `stallwatch_stalls_total`: nothing else writes it.
//!
//! Its `cause` label is the cause settled from the wait-point samples taken before the
//! crossing (sampling starts at a quarter of the threshold, `waits.rs`), `unknown` when
//! none was taken. The event's own `cause` goes on being refined from every sample until
//! the call returns, so for a call whose wait moves (writeback, then the journal) the
//! event may name another cause than the one it was counted under.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use strum::VariantArray;
use tracing::{info, warn};

use crate::base::labels::{Cause, Failure, Mode, Op};
use crate::base::sync::lock;
use crate::exposition::family::CounterVec;
use crate::exposition::registry::Registry;
use crate::kernel::blockdev::TargetDevices;
use crate::kernel::snapshot::Snapshot;
use crate::stall::event::{
    blocked_field, log_fields, merge_blocked, set_verdict, set_waits, update, DeviceContext,
    EventId, MdContext, StallEvent, VmContext,
};
use crate::stall::evidence::{self, Evidence, Scope};
use crate::stall::id;
use crate::stall::inflight::InFlightOp;
use crate::stall::waits::WaitSamples;
use crate::stall::wake::Wake;

/// VM samples kept for the start of a stall's window (a stall is seen only once it has
/// lasted the threshold, so its first part is read back from here).
const HISTORY: usize = 1024;

/// Which lane a call belongs to, and the devices beneath its target (the probe's
/// device registry, `probe/devices.rs`), named in the call's event.
#[derive(Debug, Clone, Copy)]
pub struct LaneKey<'a> {
    pub devices: &'a TargetDevices,
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

struct Inner {
    /// Newest first.
    events: VecDeque<StallEvent>,
    history: VecDeque<Snapshot>,
    /// Per target, the seq of the last operation counted as a stall.
    counted: HashMap<usize, u64>,
    /// Bumped at every change of an event, so a reader can tell nothing changed.
    changes: u64,
}

/// The newest `limit` events, ongoing ones with their age so far.
fn copy_events(inner: &Inner, limit: usize) -> Vec<StallEvent> {
    inner.events.iter().take(limit).map(copy_event).collect()
}

/// A copy of `e` as served: while ongoing, with its age so far.
fn copy_event(e: &StallEvent) -> StallEvent {
    let mut e = e.clone();
    if e.ongoing {
        e.duration_seconds = e.started.elapsed().as_secs_f64();
        set_verdict(&mut e);
    }
    e
}

/// The stall counter's single writer path and the ring of recent events.
pub struct StallLog {
    inner: Mutex<Inner>,
    capacity: usize,
    stalls: Arc<CounterVec>,
    /// Notified when a stall starts or ends, for the evidence worker.
    wake: Arc<Wake>,
}

impl StallLog {
    /// An empty log of `capacity` events; registers `stallwatch_stalls_total`. `wake` is
    /// notified whenever a stall starts or ends.
    pub fn new(capacity: usize, registry: &Registry, wake: Arc<Wake>) -> StallLog {
        let stalls = registry.add_family(CounterVec::new(
            "stallwatch_stalls_total",
            "Operations slower than the stall threshold, counted when the threshold is crossed, while the call may still be blocked; cause: where the kernel held the call, as sampled before the crossing.",
            &["target", "mode", "op", "cause"],
        ));
        // The ids' prefix is the run's start, not its first stall's.
        id::init();
        StallLog {
            inner: Mutex::new(Inner {
                events: VecDeque::with_capacity(capacity.min(1024)),
                history: VecDeque::with_capacity(HISTORY),
                counted: HashMap::new(),
                changes: 0,
            }),
            capacity,
            stalls,
            wake,
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

    /// Forgets a target no longer probed: its stall series. Its events stay in the ring,
    /// as history; one still ongoing ends now, since nothing will report its call's
    /// return.
    pub fn remove_target(&self, name: &str, ops: &[(Mode, Op)]) {
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
        self.wake.notify();
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
            info!(id = %ev.id, target = %ev.target, mode = ev.mode, op = ev.op,
                duration_seconds = ev.duration_seconds,
                reads = ev.evidence.reads,
                device_idle = idle.map_or("unknown", |i| if i { "yes" } else { "no" }),
                evidence = %phrases.join("; "),
                verdict = %ev.verdict,
                "stall evidence");
        }
        // The stall record (`store.rs`) and `/api/history` see the new evidence.
        inner.changes += 1;
    }

    /// Events an earlier run recorded (`store.rs`), newest first: kept behind this
    /// run's, up to the log's capacity, marked `restored` (and `interrupted` when they
    /// were still ongoing), never counted. Ids of this run stay unique past theirs.
    pub fn restore(&self, events: Vec<StallEvent>) -> usize {
        // Everything per event (the verdict's phrases among it) is done before the lock
        // is taken: the lanes, the watchdog and the sampler are running already.
        let now = SystemTime::now();
        let mut seen = HashSet::new();
        let restored: Vec<StallEvent> = events
            .into_iter()
            .filter(|ev| seen.insert(ev.id.clone()))
            .take(self.capacity)
            .map(|mut ev| {
                ev.restored = true;
                ev.key = (usize::MAX, u64::MAX);
                // Only the wall clock survives a restart; the monotonic start is its
                // best image in this run (used for nothing once the event is over).
                let ago = now.duration_since(ev.started_at).unwrap_or_default();
                ev.started = Instant::now().checked_sub(ago).unwrap_or_else(Instant::now);
                if ev.ongoing {
                    ev.ongoing = false;
                    ev.interrupted = true;
                }
                set_verdict(&mut ev);
                ev
            })
            .collect();
        for ev in &restored {
            id::reserve(&ev.id);
        }
        let mut inner = lock(&self.inner);
        let ours: HashSet<String> = inner.events.iter().map(|e| e.id.clone()).collect();
        let mut kept = 0;
        for ev in restored {
            if inner.events.len() >= self.capacity {
                break;
            }
            if ours.contains(&ev.id) {
                continue;
            }
            inner.events.push_back(ev);
            kept += 1;
        }
        inner.changes += 1;
        kept
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

    /// The log's change count: bumped at every change of an event.
    pub fn changes(&self) -> u64 {
        lock(&self.inner).changes
    }

    /// The event `id` as [`StallLog::events`] serves it; None when the ring holds no
    /// such event (never had it, or it was pushed out).
    pub fn event(&self, id: &str) -> Option<StallEvent> {
        let inner = lock(&self.inner);
        inner.events.iter().find(|e| e.id == id).map(copy_event)
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
        warn!(id = %ev.id, target = %name, mode = %op.mode, op = %op.op,
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
        self.wake.notify();
    }

    /// A call of lane `key` slower than the threshold returned; `others` are the other
    /// lanes of the target blocked past the threshold right now.
    /// Returns the event's id, for the exemplar of the call's observation.
    pub fn finished(
        &self,
        key: LaneKey<'_>,
        call: FinishedCall,
        others: &[InFlightOp],
    ) -> Option<String> {
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
        let ev = inner.events.iter_mut().find(|e| e.key == (key.lane, seq))?;
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
        warn!(id = %ev.id, target = %ev.target, mode = ev.mode, op = ev.op,
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
        let id = ev.id.clone();
        drop(inner);
        // The evidence worker reads once more, for the end of the window.
        self.wake.notify();
        Some(id)
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
        let devs = key.devices;
        // The last sample at or before the start gives the state the call met; the
        // samples since then give the window so far.
        let before = inner.history.iter().rev().find(|s| s.vm.at <= started);
        let first = before.or_else(|| inner.history.iter().find(|s| s.vm.at > started));
        let mut ev = StallEvent {
            id: id::next(),
            target: key.name.to_owned(),
            mode: mode.as_str(),
            op: op.as_str(),
            started_at: SystemTime::now() - started.elapsed(),
            duration_seconds: started.elapsed().as_secs_f64(),
            ongoing,
            interrupted: false,
            restored: false,
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
            waits: Vec::new(),
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
            scope: Scope::of(devs),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::blockdev::SyncAction;
    use crate::kernel::snapshot::DeviceReading;
    use crate::kernel::vm::VmSample;
    use crate::kernel::vm::{IoPressureTotals, VmCounters};
    use crate::stall::event::BlockedLane;

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

    /// The devices beneath target "t", as the probe's registry hands them over.
    static DEVICES: std::sync::LazyLock<TargetDevices> =
        std::sync::LazyLock::new(|| TargetDevices {
            disk: Some("sdb".into()),
            arrays: vec!["md0".into()],
            ..TargetDevices::default()
        });

    fn key() -> LaneKey<'static> {
        LaneKey {
            devices: &DEVICES,
            lane: 1,
            name: "t",
        }
    }

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
        log.crossed(key(), fsync, &[], None);
        assert!(log.events()[0].also_blocked.is_empty(), "only fsync so far");
        let create = in_flight(Mode::Create, Op::Create, 7, Duration::from_secs(1));
        log.crossed(key(), fsync, &[create], None);
        let longer = in_flight(Mode::Create, Op::Create, 7, Duration::from_secs(3));
        log.crossed(key(), fsync, &[longer], None);
        assert_eq!(counted(&log), 1, "looking again does not count again");
        let write = in_flight(Mode::Append, Op::Write, 2, Duration::from_secs(1));
        log.finished(key(), call(4, Duration::from_secs(5), None), &[write]);
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
        let other = LaneKey { lane: 2, ..key() };
        log.crossed(other, fsync, &[], None);
        assert_eq!(counted(&log), 2);
    }

    #[test]
    fn an_event_keeps_its_id_from_the_crossing_to_the_end_and_is_found_by_it() {
        let log = setup();
        let fsync = in_flight(Mode::Overwrite, Op::Fsync, 4, Duration::from_secs(2));
        log.crossed(key(), fsync, &[], None);
        let ongoing = log.events()[0].clone();
        assert!(ongoing.ongoing && !ongoing.id.is_empty());
        std::thread::sleep(Duration::from_millis(5));
        let found = log.event(&ongoing.id).expect("found by its id");
        assert!(found.ongoing);
        assert!(
            found.duration_seconds > ongoing.duration_seconds,
            "an ongoing event is served with its age so far"
        );
        log.crossed(key(), fsync, &[], None);
        log.finished(key(), call(4, Duration::from_secs(3), None), &[]);
        let done = log.event(&ongoing.id).expect("the same id once completed");
        assert!(!done.ongoing);
        assert_eq!(done.duration_seconds, 3.0);
        assert_eq!(
            serde_json::to_value(&done).unwrap(),
            serde_json::to_value(&log.events()[0]).unwrap()
        );
        assert_eq!(serde_json::to_value(&done).unwrap()["id"], ongoing.id);
        // Counted on return: an id of its own. Pushed out of the ring: not found.
        log.finished(key(), call(5, Duration::from_secs(1), None), &[]);
        log.finished(key(), call(6, Duration::from_secs(1), None), &[]);
        let ids: Vec<String> = log.events().into_iter().map(|e| e.id).collect();
        assert_eq!(ids.len(), 2);
        assert!(ids[0] != ids[1] && !ids.contains(&ongoing.id), "{ids:?}");
        assert!(log.event(&ongoing.id).is_none());
        assert!(log.event("no-such-id").is_none());
        assert_eq!(log.event(&ids[1]).unwrap().id, ids[1]);
    }

    fn setup() -> StallLog {
        StallLog::new(2, &Registry::new(), Arc::default())
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
        log.crossed(key(), op, &[], None);
        log.crossed(key(), op, &[], None);
        assert_eq!(counted(&log), 1, "a crossing is counted once");
        let ev = &log.events()[0];
        assert!(ev.ongoing);
        assert_eq!(ev.vm.dirty_bytes_start, 100);
        assert_eq!(ev.vm.dirty_bytes_max, 300);
        assert_eq!(ev.md[0].sync_action, Some(SyncAction::Check));
        // Later samples while ongoing raise the maxima; idle does not hide the check.
        log.observe(snap(Instant::now(), 200, 90, 4.0, SyncAction::Idle, 3));
        log.finished(key(), call(9, start.elapsed(), None), &[]);
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
            w.add(
                &crate::stall::waits::Sample {
                    wchan: Some(s.to_string()),
                    stack: None,
                },
                crate::stall::waits::SAMPLE_PERIOD,
            );
        }
        w
    }

    #[test]
    fn counted_under_the_cause_at_the_crossing_while_the_event_follows_later_samples() {
        let log = setup();
        let op = in_flight(Mode::Overwrite, Op::Fsync, 3, Duration::from_secs(1));
        let before = sampled(&["folio_wait_writeback", "folio_wait_writeback"]);
        log.crossed(key(), op, &[], Some(&before));
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
        log.crossed(key(), op, &[], Some(&later));
        let mut done = call(3, Duration::from_secs(4), None);
        done.waits = Some(later);
        log.finished(key(), done, &[]);
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
        log.finished(key(), call(4, Duration::from_secs(2), None), &[]);
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
        let seen = log.wake.wait(0, Some(Instant::now())).unwrap();
        let fsync = in_flight(Mode::Overwrite, Op::Fsync, 4, Duration::from_secs(2));
        log.crossed(key(), fsync, &[], None);
        let started = log.wake.wait(seen, None).expect("a start wakes the worker");
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
        log.crossed(key(), fsync, &[], None);
        assert_eq!(log.wake.wait(started, Some(Instant::now())), Some(started));
        log.finished(key(), call(4, Duration::from_secs(3), None), &[]);
        assert!(log.wake.wait(started, None).unwrap() > started);
        assert!(log.ongoing_scopes().is_empty());
        e.reads = 2;
        log.set_evidence(ongoing[0].0, e, true);
        let json = serde_json::to_value(&log.events()[0]).unwrap();
        assert_eq!(json["evidence"]["reads"], 2);
        assert_eq!(json["evidence"]["complete"], true);
        log.wake.close();
        assert_eq!(log.wake.wait(0, None), None);
    }

    #[test]
    fn returned_between_ticks_is_counted_on_return_and_ring_is_bounded() {
        let log = setup();
        for seq in 1..=3 {
            let eio = Some(Failure::Errno(crate::base::errno::Errno::IO));
            log.finished(key(), call(seq, Duration::from_millis(700), eio), &[]);
        }
        assert_eq!(counted(&log), 3);
        let ev = log.events();
        assert_eq!(ev.len(), 2, "ring bounded at stall_log_size");
        assert!(ev[0].started_at >= ev[1].started_at, "newest first");
        assert!(ev[0].error.as_deref().unwrap().contains("EIO"));
        assert_eq!(ev[0].duration_seconds, 0.7);
    }
}
