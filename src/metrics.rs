//! Every metric family in one place: names, help, labels, buckets. Names are contract
//! (SPEC "Metrics"); the dashboard and the alert rules depend on them.

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    Counter, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

use crate::probe::ops::Op;
use crate::probe::TargetShared;

/// Latency buckets from 25 µs (a cached metadata op on NVMe) to 300 s (the longest
/// writeback stalls reported on RAID): roughly 1-2.5-5 per decade.
pub const BUCKETS: [f64; 23] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 180.0, 300.0,
];

/// The agent's metric families, registered in `registry`.
pub struct Metrics {
    pub registry: Registry,
    pub probe_duration: HistogramVec,
    pub probe_errors: IntCounterVec,
    pub probes: IntCounterVec,
    pub skipped: IntCounterVec,
    pub stalls: IntCounterVec,
    pub target_up: IntGaugeVec,
    pub target_read_only: IntGaugeVec,
    pub target_info: IntGaugeVec,
    pub last_success: GaugeVec,
    pub vm_dirty: IntGauge,
    pub vm_writeback: IntGauge,
    pub vm_dirty_threshold: IntGauge,
    pub vm_dirty_background_threshold: IntGauge,
    pub vm_dirtied: IntCounter,
    pub vm_written: IntCounter,
    pub vm_sample_errors: IntCounter,
    pub pressure_some: Counter,
    pub pressure_full: Counter,
    pub sysctl_dirty_ratio: Gauge,
    pub sysctl_dirty_background_ratio: Gauge,
    pub sysctl_dirty_bytes: Gauge,
    pub sysctl_dirty_background_bytes: Gauge,
    pub sysctl_dirty_expire: Gauge,
    pub sysctl_dirty_writeback: Gauge,
    pub md_sync_action: IntGaugeVec,
    pub md_sync_completed: GaugeVec,
    pub md_degraded: IntGaugeVec,
    pub device_inflight: IntGaugeVec,
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help)
}

macro_rules! reg {
    ($r:expr, $m:expr) => {{
        let m = $m.expect("valid metric definition");
        $r.register(Box::new(m.clone()))
            .expect("metric registered once");
        m
    }};
}

impl Metrics {
    /// Builds and registers every family. `targets` feeds the live in-flight gauge.
    pub fn new(targets: Vec<Arc<TargetShared>>) -> Metrics {
        let r = Registry::new();
        let tmo = &["target", "mode", "op"];
        let m = Metrics {
            probe_duration: reg!(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "stallwatch_probe_duration_seconds",
                        "Latency of each completed probe system call, timed on its own. \
                         Updated by the probe threads; a scrape never waits for a probe."
                    )
                    .buckets(BUCKETS.to_vec()),
                    tmo
                )
            ),
            probe_errors: reg!(
                r,
                IntCounterVec::new(
                    opts(
                        "stallwatch_probe_errors_total",
                        "Failed probe operations by errno name (op=prepare: opening the probe directory or file)."
                    ),
                    &["target", "mode", "op", "errno"]
                )
            ),
            probes: reg!(
                r,
                IntCounterVec::new(
                    opts(
                        "stallwatch_probes_total",
                        "Probe cycles run per mode, successful or failed."
                    ),
                    &["target", "mode"]
                )
            ),
            skipped: reg!(
                r,
                IntCounterVec::new(
                    opts(
                        "stallwatch_probes_skipped_total",
                        "Probe cycles not started: in_flight (previous cycle still running), not_mounted, mount_changed."
                    ),
                    &["target", "reason"]
                )
            ),
            stalls: reg!(
                r,
                IntCounterVec::new(
                    opts(
                        "stallwatch_stalls_total",
                        "Operations slower than the stall threshold, counted when the threshold is crossed, while the call may still be blocked."
                    ),
                    tmo
                )
            ),
            target_up: reg!(
                r,
                IntGaugeVec::new(
                    opts(
                        "stallwatch_target_up",
                        "1 when the last cycle succeeded on the expected mount, else 0."
                    ),
                    &["target"]
                )
            ),
            target_read_only: reg!(
                r,
                IntGaugeVec::new(
                    opts(
                        "stallwatch_target_read_only",
                        "1 when the target's filesystem is mounted read-only (ro or emergency_ro) or answered EROFS."
                    ),
                    &["target"]
                )
            ),
            target_info: reg!(
                r,
                IntGaugeVec::new(
                    opts(
                        "stallwatch_target_info",
                        "What is probed: the target's path, its mount point, device, filesystem type and mount plus super options."
                    ),
                    &["target", "path", "mountpoint", "device", "fstype", "options"]
                )
            ),
            last_success: reg!(
                r,
                GaugeVec::new(
                    opts(
                        "stallwatch_last_success_timestamp_seconds",
                        "Unix time at the end of the last successful probe cycle."
                    ),
                    &["target"]
                )
            ),
            vm_dirty: reg!(
                r,
                IntGauge::new(
                    "stallwatch_vm_dirty_bytes",
                    "Dirty page cache waiting for writeback (nr_dirty x page size)."
                )
            ),
            vm_writeback: reg!(
                r,
                IntGauge::new(
                    "stallwatch_vm_writeback_bytes",
                    "Page cache under writeback right now (nr_writeback x page size)."
                )
            ),
            vm_dirty_threshold: reg!(
                r,
                IntGauge::new(
                    "stallwatch_vm_dirty_threshold_bytes",
                    "Dirty level at which writers are throttled in balance_dirty_pages (nr_dirty_threshold x page size)."
                )
            ),
            vm_dirty_background_threshold: reg!(
                r,
                IntGauge::new(
                    "stallwatch_vm_dirty_background_threshold_bytes",
                    "Dirty level at which background writeback starts (nr_dirty_background_threshold x page size)."
                )
            ),
            vm_dirtied: reg!(
                r,
                IntCounter::new(
                    "stallwatch_vm_dirtied_bytes_total",
                    "Bytes of pages dirtied since boot (nr_dirtied x page size)."
                )
            ),
            vm_written: reg!(
                r,
                IntCounter::new(
                    "stallwatch_vm_written_bytes_total",
                    "Bytes of pages written back since boot (nr_written x page size)."
                )
            ),
            vm_sample_errors: reg!(
                r,
                IntCounter::new(
                    "stallwatch_vm_sample_errors_total",
                    "Failed reads of /proc/vmstat by the VM sampler."
                )
            ),
            pressure_some: reg!(
                r,
                Counter::new(
                    "stallwatch_pressure_io_some_seconds_total",
                    "Time some task was stalled on I/O (/proc/pressure/io some total)."
                )
            ),
            pressure_full: reg!(
                r,
                Counter::new(
                    "stallwatch_pressure_io_full_seconds_total",
                    "Time all non-idle tasks were stalled on I/O (/proc/pressure/io full total)."
                )
            ),
            sysctl_dirty_ratio: reg!(
                r,
                Gauge::new(
                    "stallwatch_vm_dirty_ratio",
                    "vm.dirty_ratio as a fraction 0-1 (0 when vm.dirty_bytes is set instead)."
                )
            ),
            sysctl_dirty_background_ratio: reg!(
                r,
                Gauge::new(
                    "stallwatch_vm_dirty_background_ratio",
                    "vm.dirty_background_ratio as a fraction 0-1 (0 when vm.dirty_background_bytes is set instead)."
                )
            ),
            sysctl_dirty_bytes: reg!(
                r,
                Gauge::new(
                    "stallwatch_vm_dirty_bytes_setting",
                    "vm.dirty_bytes (0 when vm.dirty_ratio applies)."
                )
            ),
            sysctl_dirty_background_bytes: reg!(
                r,
                Gauge::new(
                    "stallwatch_vm_dirty_background_bytes_setting",
                    "vm.dirty_background_bytes (0 when vm.dirty_background_ratio applies)."
                )
            ),
            sysctl_dirty_expire: reg!(
                r,
                Gauge::new(
                    "stallwatch_vm_dirty_expire_seconds",
                    "vm.dirty_expire_centisecs in seconds: age at which dirty data is written back."
                )
            ),
            sysctl_dirty_writeback: reg!(
                r,
                Gauge::new(
                    "stallwatch_vm_dirty_writeback_seconds",
                    "vm.dirty_writeback_centisecs in seconds: the flusher threads' wake-up interval."
                )
            ),
            md_sync_action: reg!(
                r,
                IntGaugeVec::new(
                    opts(
                        "stallwatch_md_sync_action",
                        "1 for the current sync action of an md array beneath a target (idle, resync, recover, check, repair, reshape, frozen)."
                    ),
                    &["device", "action"]
                )
            ),
            md_sync_completed: reg!(
                r,
                GaugeVec::new(
                    opts(
                        "stallwatch_md_sync_completed_ratio",
                        "Progress of the running md sync action, 0-1; 1 when idle."
                    ),
                    &["device"]
                )
            ),
            md_degraded: reg!(
                r,
                IntGaugeVec::new(
                    opts(
                        "stallwatch_md_degraded_disks",
                        "Number of missing member disks of an md array beneath a target."
                    ),
                    &["device"]
                )
            ),
            device_inflight: reg!(
                r,
                IntGaugeVec::new(
                    opts(
                        "stallwatch_device_inflight_requests",
                        "Requests in flight on a block device beneath a target (/sys/block/DEV/inflight)."
                    ),
                    &["device", "direction"]
                )
            ),
            registry: r,
        };
        let build = IntGaugeVec::new(
            opts("stallwatch_build_info", "The running stallwatch version."),
            &["version"],
        )
        .expect("valid");
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        m.registry
            .register(Box::new(build))
            .expect("registered once");
        m.registry
            .register(Box::new(Inflight::new(targets)))
            .expect("registered once");
        let pc = prometheus::process_collector::ProcessCollector::for_self();
        m.registry.register(Box::new(pc)).expect("registered once");
        m
    }

    /// Encodes every family in the text format.
    pub fn encode(&self) -> String {
        let families = self.registry.gather();
        prometheus::TextEncoder::new()
            .encode_to_string(&families)
            .unwrap_or_default()
    }
}

/// `stallwatch_probe_inflight_seconds`, computed at scrape time from each target's
/// in-flight slot, so the age grows live while the call is blocked in the kernel.
struct Inflight {
    targets: Vec<Arc<TargetShared>>,
    desc: Desc,
}

impl Inflight {
    const NAME: &'static str = "stallwatch_probe_inflight_seconds";
    const HELP: &'static str = "Age of the probe operation in flight right now, 0 when none; \
        computed at scrape time, so it grows while the call is blocked in the kernel.";

    fn new(targets: Vec<Arc<TargetShared>>) -> Inflight {
        let desc = Desc::new(
            Self::NAME.into(),
            Self::HELP.into(),
            vec!["target".into(), "mode".into(), "op".into()],
            Default::default(),
        )
        .expect("valid desc");
        Inflight { targets, desc }
    }
}

impl Collector for Inflight {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        use prometheus::proto::{Gauge, LabelPair, Metric, MetricType};
        // Built directly rather than through a GaugeVec: no hashing or locking per
        // scrape. Labels sorted by name, as the encoder expects.
        let label = |name: &str, value: &str| {
            let mut l = LabelPair::default();
            l.set_name(name.to_owned());
            l.set_value(value.to_owned());
            l
        };
        let mut metrics = Vec::new();
        for t in &self.targets {
            let now = t.inflight.current();
            // Set-up (op="prepare") can block too: show it, so a stuck probe is never
            // invisible.
            let prepare = t.target.modes.iter().map(|&m| (m, Op::Prepare));
            for (mode, op) in t.ops.iter().copied().chain(prepare) {
                let age = match now {
                    Some(c) if c.mode == mode && c.op == op => c.age.as_secs_f64(),
                    _ => 0.0,
                };
                let mut g = Gauge::default();
                g.set_value(age);
                let mut m = Metric::default();
                m.set_label(vec![
                    label("mode", mode.as_str()),
                    label("op", op.as_str()),
                    label("target", &t.target.name),
                ]);
                m.set_gauge(g);
                metrics.push(m);
            }
        }
        let mut family = MetricFamily::default();
        family.set_name(Self::NAME.to_owned());
        family.set_help(Self::HELP.to_owned());
        family.set_field_type(MetricType::GAUGE);
        family.set_metric(metrics);
        vec![family]
    }
}
