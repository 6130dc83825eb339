//! A stall event as `/api/stalls` serves it (field names are contract, SPEC), and how
//! an event is built up: the kernel's state folded in sample by sample, the wait-point
//! samples, the other lanes blocked at the same time, the verdict. Events also
//! deserialize from the same JSON, for the stall record on disk (`store.rs`).

use std::time::{Instant, SystemTime};

use serde::{Deserialize, Deserializer, Serialize};
use strum::VariantArray;

use crate::base::labels::{Cause, Mode, Op};
use crate::kernel::blockdev::SyncAction;
use crate::kernel::snapshot::Snapshot;
use crate::stall::evidence::{self, Evidence, Scope};
use crate::stall::inflight::InFlightOp;
use crate::stall::verdict::{self, Facts};
use crate::stall::waits::{second_wait, SymbolCount, WaitSamples, WaitTime};

/// The kernel's state over a stall's window. Field names are contract (SPEC).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct VmContext {
    pub dirty_bytes_start: u64,
    pub dirty_bytes_max: u64,
    pub writeback_bytes_max: u64,
    /// The threshold at the latest reading.
    pub dirty_threshold_bytes: u64,
    /// The lowest threshold of the window (0 when never read): a limit lowered during
    /// the stall and raised again before it ended is the one the writers were held at.
    /// Absent in records of agents before 0.2.0.
    #[serde(default)]
    pub dirty_threshold_bytes_min: u64,
    pub dirty_background_threshold_bytes: u64,
    /// PSI io time accrued during the stall; null without PSI.
    pub io_pressure_some_seconds: Option<f64>,
    pub io_pressure_full_seconds: Option<f64>,
}

/// An md array beneath the target and its sync action during the stall (the busiest
/// one seen: a check that ran for part of the window is reported).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MdContext {
    pub device: String,
    /// `unknown` until the sampler has read the array.
    #[serde(
        serialize_with = "action_or_unknown",
        deserialize_with = "action_from_name"
    )]
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

fn action_from_name<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SyncAction>, D::Error> {
    let name = String::deserialize(d)?;
    Ok(name.parse().ok())
}

/// The `&'static str` among `names` that a stored name spells.
fn static_name<'de, D: Deserializer<'de>>(
    d: D,
    names: impl Iterator<Item = &'static str>,
) -> Result<&'static str, D::Error> {
    let name = String::deserialize(d)?;
    let mut names = names;
    names
        .find(|n| *n == name)
        .ok_or_else(|| serde::de::Error::custom(format!("unknown name {name:?}")))
}

fn mode_name<'de, D: Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
    static_name(d, Mode::VARIANTS.iter().map(|m| m.as_str()))
}

fn op_name<'de, D: Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
    static_name(d, Op::VARIANTS.iter().map(|o| o.as_str()))
}

fn from_rfc3339<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_rfc3339(&s).map_err(serde::de::Error::custom)
}

/// `&'static str` under another name: serde borrows a field spelled `&str` from the
/// input, which would tie every event read to the bytes it was read from; these are
/// mapped to the program's own names instead (`mode_name`, `op_name`).
type Name = &'static str;

/// The key of an event restored from disk: no lane has it, so no call of this run
/// finds it.
fn restored_key() -> (usize, u64) {
    (usize::MAX, u64::MAX)
}

/// The backing device and its peak in-flight requests during the stall.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeviceContext {
    pub device: String,
    pub inflight_requests_max: u64,
}

/// One stall, as `/api/stalls` serves it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StallEvent {
    /// Unique across restarts and agents on one host (`id.rs`); set when the event
    /// appears and kept when it completes.
    pub id: String,
    pub target: String,
    #[serde(deserialize_with = "mode_name")]
    pub mode: Name,
    #[serde(deserialize_with = "op_name")]
    pub op: Name,
    #[serde(serialize_with = "rfc3339", deserialize_with = "from_rfc3339")]
    pub started_at: SystemTime,
    /// Time blocked so far while ongoing; the call's duration once it returned.
    pub duration_seconds: f64,
    pub ongoing: bool,
    /// The event was ongoing when the agent that recorded it died (crash, `kill -9`):
    /// restored with the duration known at the stall record's last write.
    #[serde(default)]
    pub interrupted: bool,
    /// Loaded from the stall record (`--storage.path`) at start: recorded by an earlier
    /// run of the agent, not counted in this run's metrics.
    #[serde(default)]
    pub restored: bool,
    pub error: Option<String>,
    pub vm: VmContext,
    pub md: Vec<MdContext>,
    pub device: Option<DeviceContext>,
    /// The other lanes of the target blocked past the threshold during the stall: all
    /// of them on a frozen filesystem, none when only this call is held.
    pub also_blocked: Vec<BlockedLane>,
    /// The kernel wait points sampled while the call was blocked, most frequent first.
    pub wchan: Vec<SymbolCount>,
    /// The wait points with the time the call was held at each, longest first: the
    /// cause is the one held longest (`waits.rs`). Absent in records of agents before
    /// 0.2.0.
    #[serde(default)]
    pub waits: Vec<WaitTime>,
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
    #[serde(skip, default = "Instant::now")]
    pub(super) started: Instant,
    /// The lane and the call's sequence number in it.
    #[serde(skip, default = "restored_key")]
    pub(super) key: (usize, u64),
    #[serde(skip)]
    pub(super) pressure_start: Option<(f64, f64)>,
    #[serde(skip)]
    pub(super) disk: Option<String>,
    #[serde(skip)]
    pub(super) arrays: Vec<String>,
    /// The wait point that decided `cause`.
    #[serde(skip)]
    pub(super) symbol: Option<String>,
    #[serde(skip)]
    pub(super) scope: Scope,
}

/// Which event the evidence worker is reading for: its lane and call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventId(pub(super) usize, pub(super) u64);

/// Another lane's call, blocked at the same time as the stalled one.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BlockedLane {
    #[serde(deserialize_with = "mode_name")]
    pub mode: Name,
    #[serde(deserialize_with = "op_name")]
    pub op: Name,
    /// The longest it was seen blocked while the stall lasted.
    pub blocked_seconds: f64,
}

/// Adds the calls of `others` to `into`, keeping each one's longest time blocked.
pub(super) fn merge_blocked(into: &mut Vec<BlockedLane>, others: &[InFlightOp]) {
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

/// Takes the call's wait-point samples into the event; samples absent (the call was
/// not sampled, or a look found none yet) leave what the event has.
pub(super) fn set_waits(ev: &mut StallEvent, waits: Option<&WaitSamples>) {
    let Some(w) = waits else {
        return;
    };
    ev.wchan = w.wchan();
    ev.waits = w.waits();
    ev.stack = w.stack().map(<[String]>::to_vec);
    ev.cause = w.cause();
    ev.symbol = w.symbol().map(str::to_owned);
}

/// Builds the event's verdict from its fields, the evidence worker's phrases (top
/// dirtiers, writers, device figures, the journal) and whether the device was idle. Built
/// anew whenever any of them changes: the evidence arrives after the crossing and its
/// final reading after the call returned.
pub(super) fn set_verdict(ev: &mut StallEvent) {
    let facts = Facts {
        op: ev.op,
        seconds: ev.duration_seconds,
        ongoing: ev.ongoing,
        cause: Some(ev.cause),
        symbol: ev.symbol.as_deref(),
        second: second_wait(&ev.waits, ev.cause),
        dirty_bytes_max: ev.vm.dirty_bytes_max,
        writeback_bytes_max: ev.vm.writeback_bytes_max,
        dirty_threshold_bytes: ev.vm.dirty_threshold_bytes,
        dirty_threshold_bytes_min: ev.vm.dirty_threshold_bytes_min,
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
pub(super) fn log_fields(ev: &StallEvent) -> (String, String, u64) {
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
pub(super) fn blocked_field(b: &[BlockedLane]) -> String {
    if b.is_empty() {
        return "none".into();
    }
    let v: Vec<String> = b.iter().map(|b| format!("{}:{}", b.mode, b.op)).collect();
    v.join(",")
}

/// Folds one sample into an event's window.
pub(super) fn update(ev: &mut StallEvent, s: &Snapshot) {
    let c = &s.vm.counters;
    ev.vm.dirty_bytes_max = ev.vm.dirty_bytes_max.max(c.dirty_bytes);
    ev.vm.writeback_bytes_max = ev.vm.writeback_bytes_max.max(c.writeback_bytes);
    ev.vm.dirty_threshold_bytes = c.dirty_threshold_bytes;
    if c.dirty_threshold_bytes > 0 {
        let min = &mut ev.vm.dirty_threshold_bytes_min;
        *min = match *min {
            0 => c.dirty_threshold_bytes,
            m => m.min(c.dirty_threshold_bytes),
        };
    }
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
