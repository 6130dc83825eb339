//! The probe metric families, owned by the probe threads: latency histograms, errors,
//! cycles, skips, target state, and the in-flight age computed at scrape time. Names are
//! contract (SPEC "Metrics"); the dashboard and the alert rules depend on them.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::base::labels::{Failure, Mode, Op};
use crate::base::sync::lock;
use crate::config::Target;
use crate::exposition::family::{
    Counter, CounterVec, Exemplar, Gauge, GaugeVec, HistogramSeries, HistogramVec,
};
use crate::exposition::registry::Registry;
use crate::kernel::mounts::Mount;

/// Latency buckets from 25 µs (a cached metadata op on NVMe) to 300 s (the longest
/// writeback stalls reported on RAID): roughly 1-2.5-5 per decade.
pub const BUCKETS: [f64; 23] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 180.0, 300.0,
];

/// Why a cycle was not started (label `reason` of `stallwatch_probes_skipped_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum SkipReason {
    /// The previous cycle is still running (blocked in the kernel).
    InFlight,
    /// The path is not the root of a mount (require_mountpoint).
    NotMounted,
    /// Another filesystem is mounted at the path than the one first seen.
    MountChanged,
}

impl SkipReason {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// The probe families, registered once; each probe thread writes its target's series.
pub struct ProbeMetrics {
    duration: Arc<HistogramVec>,
    errors: Arc<CounterVec>,
    cycles: Arc<CounterVec>,
    skipped: Arc<CounterVec>,
    up: Arc<GaugeVec>,
    read_only: Arc<GaugeVec>,
    info: Arc<GaugeVec>,
    last_success: Arc<GaugeVec>,
    lane_up: Arc<GaugeVec>,
    lane_skipped: Arc<CounterVec>,
    /// The (target, mode, op, errno) series of `errors` created so far: errno values
    /// are not known in advance, and a retired target's series must all go.
    error_series: Mutex<BTreeSet<[String; 4]>>,
}

impl ProbeMetrics {
    /// Builds the families and registers them in `r`.
    pub fn new(r: &Registry) -> ProbeMetrics {
        let target = &["target"];
        ProbeMetrics {
            duration: r.add_family(HistogramVec::new(
                "stallwatch_probe_duration_seconds",
                "Latency of each completed probe system call, timed on its own. \
                 Updated by the probe threads; a scrape never waits for a probe.",
                &["target", "mode", "op"],
                &BUCKETS,
            )),
            errors: r.add_family(CounterVec::new(
                "stallwatch_probe_errors_total",
                "Failed probe operations by errno name (op=prepare: opening the probe directory or file).",
                &["target", "mode", "op", "errno"],
            )),
            cycles: r.add_family(CounterVec::new(
                "stallwatch_probes_total",
                "Probe cycles run per mode, successful or failed.",
                &["target", "mode"],
            )),
            skipped: r.add_family(CounterVec::new(
                "stallwatch_probes_skipped_total",
                "Probe cycles not started: in_flight (previous cycle still running), not_mounted, mount_changed.",
                &["target", "reason"],
            )),
            up: r.add_family(GaugeVec::new(
                "stallwatch_target_up",
                "1 when the last cycle succeeded on the expected mount, else 0.",
                target,
            )),
            read_only: r.add_family(GaugeVec::new(
                "stallwatch_target_read_only",
                "1 when the target's filesystem is mounted read-only (ro or emergency_ro) or answered EROFS.",
                target,
            )),
            info: r.add_family(GaugeVec::new(
                "stallwatch_target_info",
                "What is probed: the target's path, its mount point, device, filesystem type and mount plus super options.",
                &["target", "path", "mountpoint", "device", "fstype", "options"],
            )),
            last_success: r.add_family(GaugeVec::new(
                "stallwatch_last_success_timestamp_seconds",
                "Unix time at the end of the last successful probe cycle.",
                target,
            )),
            lane_up: r.add_family(GaugeVec::new(
                "stallwatch_lane_up",
                "1 when the last cycle of this mode's lane succeeded; stallwatch_target_up is 1 when every lane's is.",
                &["target", "mode"],
            )),
            lane_skipped: r.add_family(CounterVec::new(
                "stallwatch_lane_skipped_total",
                "Cycles of this mode's lane not started, by reason; stallwatch_probes_skipped_total is their sum per target.",
                &["target", "mode", "reason"],
            )),
            error_series: Mutex::default(),
        }
    }

    /// Removes every series of a target no longer probed (after a reload), so its last
    /// values do not linger in every scrape.
    pub(super) fn remove_target(&self, t: &Target, ops: &[(Mode, Op)], mount: Option<&Mount>) {
        let name = t.name.as_str();
        for &(mode, op) in ops {
            let _ = self
                .duration
                .remove_label_values(&[name, mode.as_str(), op.as_str()]);
        }
        for &mode in &t.modes {
            let _ = self.cycles.remove_label_values(&[name, mode.as_str()]);
            let _ = self.lane_up.remove_label_values(&[name, mode.as_str()]);
            for &reason in <SkipReason as strum::VariantArray>::VARIANTS {
                let _ =
                    self.lane_skipped
                        .remove_label_values(&[name, mode.as_str(), reason.as_str()]);
            }
        }
        for &reason in <SkipReason as strum::VariantArray>::VARIANTS {
            let _ = self.skipped.remove_label_values(&[name, reason.as_str()]);
        }
        lock(&self.error_series).retain(|labels| {
            let ours = labels[0] == name;
            if ours {
                let _ = self
                    .errors
                    .remove_label_values(&labels.each_ref().map(String::as_str));
            }
            !ours
        });
        for family in [&self.up, &self.read_only] {
            let _ = family.remove_label_values(&[name]);
        }
        let _ = self.last_success.remove_label_values(&[name]);
        self.set_mount(t, mount, None);
    }

    /// Creates a target's series, so alerts and `rate()` see them from the first scrape.
    pub(super) fn add_target(&self, t: &Target, ops: &[(Mode, Op)]) {
        let name = t.name.as_str();
        for &(mode, op) in ops {
            self.duration
                .with_label_values(&[name, mode.as_str(), op.as_str()]);
        }
        for &mode in &t.modes {
            self.cycles.with_label_values(&[name, mode.as_str()]);
            self.set_lane_up(name, mode, false);
        }
        for &reason in <SkipReason as strum::VariantArray>::VARIANTS {
            self.skipped(name, reason);
            for &mode in &t.modes {
                self.lane_skipped(name, mode, reason);
            }
        }
        self.set_up(name, false);
        self.set_read_only(name, false);
        self.last_success.with_label_values(&[name]).set(0.0);
    }

    /// The series a lane of `target` writes every cycle, looked up once: a lookup by
    /// label values takes the family's lock and compares the label strings, which the
    /// lanes, waking together, would otherwise do several times a cycle each.
    pub(super) fn lane_series(&self, target: &str, mode: Mode, ops: &[Op]) -> LaneSeries {
        LaneSeries {
            duration: ops
                .iter()
                .map(|&op| {
                    let h = self
                        .duration
                        .with_label_values(&[target, mode.as_str(), op.as_str()]);
                    (op, h)
                })
                .collect(),
            cycles: self.cycles.with_label_values(&[target, mode.as_str()]),
            lane_up: self.lane_up.with_label_values(&[target, mode.as_str()]),
        }
    }

    /// The per-target series every cycle writes, looked up once (see `lane_series`).
    pub(super) fn target_series(&self, target: &str) -> TargetSeries {
        TargetSeries {
            up: self.up.with_label_values(&[target]),
            read_only: self.read_only.with_label_values(&[target]),
            last_success: self.last_success.with_label_values(&[target]),
        }
    }

    /// The skip counter of `target` for `reason`.
    pub(super) fn skipped(&self, target: &str, reason: SkipReason) -> Arc<Counter> {
        self.skipped.with_label_values(&[target, reason.as_str()])
    }

    /// The skip counter of `target`'s `mode` lane for `reason`.
    pub(super) fn lane_skipped(
        &self,
        target: &str,
        mode: Mode,
        reason: SkipReason,
    ) -> Arc<Counter> {
        self.lane_skipped
            .with_label_values(&[target, mode.as_str(), reason.as_str()])
    }

    pub(super) fn set_lane_up(&self, target: &str, mode: Mode, up: bool) {
        self.lane_up
            .with_label_values(&[target, mode.as_str()])
            .set(flag(up));
    }

    /// Records a call's latency by its labels, with the stall exemplar as
    /// [`LaneSeries::observe`] does; the lanes hold their series instead of looking them
    /// up. For fixtures (`agent::fixture::scrape_registry`).
    pub(crate) fn observe(
        &self,
        target: &str,
        mode: Mode,
        op: Op,
        elapsed: Duration,
        stall: Option<(String, SystemTime)>,
    ) {
        let labels = [target, mode.as_str(), op.as_str()];
        let v = elapsed.as_secs_f64();
        match stall {
            None => self.duration.observe(&labels, v),
            Some((id, at)) => {
                self.duration
                    .observe_with_exemplar(&labels, v, stall_exemplar(id, at, v))
            }
        }
    }

    pub(super) fn failed(&self, target: &str, mode: Mode, op: Op, failure: Failure) {
        let labels = [target, mode.as_str(), op.as_str(), failure.label()];
        self.errors.with_label_values(&labels).inc();
        lock(&self.error_series).insert(labels.map(str::to_owned));
    }

    pub(super) fn set_up(&self, target: &str, up: bool) {
        self.up.with_label_values(&[target]).set(flag(up));
    }

    pub(super) fn set_read_only(&self, target: &str, read_only: bool) {
        self.read_only
            .with_label_values(&[target])
            .set(flag(read_only));
    }

    /// Replaces the `target_info` series of `t` on `old` by one on `new`.
    pub(super) fn set_mount(&self, t: &Target, old: Option<&Mount>, new: Option<&Mount>) {
        let labels = |m: &Mount| {
            [
                t.name.clone(),
                t.path.display().to_string(),
                m.mount_point.display().to_string(),
                m.source.clone(),
                m.fstype.clone(),
                m.options(),
            ]
        };
        if let Some(old) = old {
            let _ = self
                .info
                .remove_label_values(&labels(old).each_ref().map(|s| s.as_str()));
        }
        if let Some(m) = new {
            self.info
                .with_label_values(&labels(m).each_ref().map(|s| s.as_str()))
                .set(1.0);
        }
    }

    #[cfg(test)]
    pub(super) fn cycles_of(&self, target: &str, mode: Mode) -> u64 {
        self.cycles
            .with_label_values(&[target, mode.as_str()])
            .get()
    }

    #[cfg(test)]
    pub(super) fn up_of(&self, target: &str) -> i64 {
        self.up.with_label_values(&[target]).get() as i64
    }

    #[cfg(test)]
    pub(super) fn observed(&self, target: &str, mode: Mode, op: Op) -> u64 {
        self.duration
            .with_label_values(&[target, mode.as_str(), op.as_str()])
            .count()
    }

    #[cfg(test)]
    pub(super) fn lane_up_of(&self, target: &str, mode: Mode) -> i64 {
        self.lane_up
            .with_label_values(&[target, mode.as_str()])
            .get() as i64
    }

    #[cfg(test)]
    pub(super) fn skipped_of(&self, target: &str, reason: SkipReason) -> u64 {
        self.skipped(target, reason).get()
    }
}

/// The series of one lane, as `ProbeMetrics::lane_series` looked them up. A reload
/// that removes the target removes the series from the families; a lane of a removed
/// target writes nothing after its stop, so these never bring one back.
#[derive(Clone)]
pub(super) struct LaneSeries {
    duration: Vec<(Op, HistogramSeries)>,
    cycles: Arc<Counter>,
    lane_up: Arc<Gauge>,
}

impl LaneSeries {
    /// Records a call's latency; `stall`: the id of the stall event it became and when
    /// it returned, kept as the exemplar (label `stall_id`) of its buckets.
    pub(super) fn observe(&self, op: Op, elapsed: Duration, stall: Option<(String, SystemTime)>) {
        let Some((_, h)) = self.duration.iter().find(|(o, _)| *o == op) else {
            return;
        };
        let v = elapsed.as_secs_f64();
        match stall {
            None => h.observe(v),
            Some((id, at)) => h.observe_with_exemplar(v, stall_exemplar(id, at, v)),
        }
    }

    pub(super) fn cycle_done(&self) {
        self.cycles.inc();
    }

    pub(super) fn set_up(&self, up: bool) {
        self.lane_up.set(flag(up));
    }
}

/// The per-target series of every cycle, as `ProbeMetrics::target_series` looked them up.
pub(super) struct TargetSeries {
    up: Arc<Gauge>,
    read_only: Arc<Gauge>,
    last_success: Arc<Gauge>,
}

impl TargetSeries {
    pub(super) fn set_up(&self, up: bool) {
        self.up.set(flag(up));
    }

    pub(super) fn set_read_only(&self, read_only: bool) {
        self.read_only.set(flag(read_only));
    }

    pub(super) fn succeeded_at(&self, at: SystemTime) {
        let unix = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        self.last_success.set(unix.as_secs_f64());
    }
}

/// 1 or 0, as the flag gauges (`stallwatch_target_up` ...) are written.
fn flag(on: bool) -> f64 {
    f64::from(u8::from(on))
}

/// The exemplar of a call that became the stall event `id`, returned at `at`.
fn stall_exemplar(id: String, at: SystemTime, v: f64) -> Exemplar {
    let unix = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    Exemplar {
        label: ("stall_id", id.into()),
        value: v,
        unix,
    }
}
