//! The VM sampler thread: every `vm_interval` it reads vmstat, PSI, the dirty sysctls and
//! the block devices beneath the targets (the probe's device registry says which),
//! publishes them in the families it owns, records them in the history, keeps the latest
//! for the landing page (`Latest`) and hands each sample to the stall log for the
//! stalls' windows.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use prometheus::{Counter, Gauge, GaugeVec, IntCounter, IntGauge, IntGaugeVec, Opts, Registry};
use strum::VariantArray;
use tracing::{info, warn};

use crate::base::sync::{lock, Shutdown};
use crate::history::History;
use crate::kernel::blockdev::{self, SyncAction};
use crate::kernel::devstat;
use crate::kernel::kernfs::{KeptOpen, Roots};
use crate::kernel::snapshot::{DeviceReading, Snapshot};
use crate::kernel::vm;
use crate::probe::devices::{Devices, Watched};
use crate::stall::log::StallLog;

/// The kernel-state families, written only by the sampler.
pub struct SamplerMetrics {
    vm_dirty: IntGauge,
    vm_writeback: IntGauge,
    vm_dirty_threshold: IntGauge,
    vm_dirty_background_threshold: IntGauge,
    vm_dirtied: IntCounter,
    vm_written: IntCounter,
    vm_sample_errors: IntCounter,
    pressure_some: Counter,
    pressure_full: Counter,
    sysctl_dirty_ratio: Gauge,
    sysctl_dirty_background_ratio: Gauge,
    sysctl_dirty_bytes: Gauge,
    sysctl_dirty_background_bytes: Gauge,
    sysctl_dirty_expire: Gauge,
    sysctl_dirty_writeback: Gauge,
    md_sync_action: IntGaugeVec,
    md_sync_completed: GaugeVec,
    md_degraded: IntGaugeVec,
    device_inflight: IntGaugeVec,
    device_info: IntGaugeVec,
}

fn register<M: prometheus::core::Collector + Clone + 'static>(
    r: &Registry,
    m: prometheus::Result<M>,
) -> M {
    let m = m.expect("valid metric definition");
    r.register(Box::new(m.clone()))
        .expect("metric registered once");
    m
}

impl SamplerMetrics {
    /// Builds the families and registers them in `r`.
    pub fn new(r: &Registry) -> SamplerMetrics {
        let gauge = |name: &str, help: &str| register(r, Gauge::new(name, help));
        let int_gauge = |name: &str, help: &str| register(r, IntGauge::new(name, help));
        let int_counter = |name: &str, help: &str| register(r, IntCounter::new(name, help));
        SamplerMetrics {
            vm_dirty: int_gauge(
                "stallwatch_vm_dirty_bytes",
                "Dirty page cache waiting for writeback (nr_dirty x page size).",
            ),
            vm_writeback: int_gauge(
                "stallwatch_vm_writeback_bytes",
                "Page cache under writeback right now (nr_writeback x page size).",
            ),
            vm_dirty_threshold: int_gauge(
                "stallwatch_vm_dirty_threshold_bytes",
                "Dirty level at which writers are throttled in balance_dirty_pages (nr_dirty_threshold x page size).",
            ),
            vm_dirty_background_threshold: int_gauge(
                "stallwatch_vm_dirty_background_threshold_bytes",
                "Dirty level at which background writeback starts (nr_dirty_background_threshold x page size).",
            ),
            vm_dirtied: int_counter(
                "stallwatch_vm_dirtied_bytes_total",
                "Bytes of pages dirtied since boot (nr_dirtied x page size).",
            ),
            vm_written: int_counter(
                "stallwatch_vm_written_bytes_total",
                "Bytes of pages written back since boot (nr_written x page size).",
            ),
            vm_sample_errors: int_counter(
                "stallwatch_vm_sample_errors_total",
                "Failed reads of /proc/vmstat by the VM sampler.",
            ),
            pressure_some: register(
                r,
                Counter::new(
                    "stallwatch_pressure_io_some_seconds_total",
                    "Time some task was stalled on I/O (/proc/pressure/io some total).",
                ),
            ),
            pressure_full: register(
                r,
                Counter::new(
                    "stallwatch_pressure_io_full_seconds_total",
                    "Time all non-idle tasks were stalled on I/O (/proc/pressure/io full total).",
                ),
            ),
            sysctl_dirty_ratio: gauge(
                "stallwatch_vm_dirty_ratio",
                "vm.dirty_ratio as a fraction 0-1 (0 when vm.dirty_bytes is set instead).",
            ),
            sysctl_dirty_background_ratio: gauge(
                "stallwatch_vm_dirty_background_ratio",
                "vm.dirty_background_ratio as a fraction 0-1 (0 when vm.dirty_background_bytes is set instead).",
            ),
            sysctl_dirty_bytes: gauge(
                "stallwatch_vm_dirty_bytes_setting",
                "vm.dirty_bytes (0 when vm.dirty_ratio applies).",
            ),
            sysctl_dirty_background_bytes: gauge(
                "stallwatch_vm_dirty_background_bytes_setting",
                "vm.dirty_background_bytes (0 when vm.dirty_background_ratio applies).",
            ),
            sysctl_dirty_expire: gauge(
                "stallwatch_vm_dirty_expire_seconds",
                "vm.dirty_expire_centisecs in seconds: age at which dirty data is written back.",
            ),
            sysctl_dirty_writeback: gauge(
                "stallwatch_vm_dirty_writeback_seconds",
                "vm.dirty_writeback_centisecs in seconds: the flusher threads' wake-up interval.",
            ),
            md_sync_action: register(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "stallwatch_md_sync_action",
                        "1 for the current sync action of an md array beneath a target (idle, resync, recover, check, repair, reshape, frozen).",
                    ),
                    &["device", "action"],
                ),
            ),
            md_sync_completed: register(
                r,
                GaugeVec::new(
                    Opts::new(
                        "stallwatch_md_sync_completed_ratio",
                        "Progress of the running md sync action, 0-1; 1 when idle.",
                    ),
                    &["device"],
                ),
            ),
            md_degraded: register(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "stallwatch_md_degraded_disks",
                        "Number of missing member disks of an md array beneath a target.",
                    ),
                    &["device"],
                ),
            ),
            device_inflight: register(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "stallwatch_device_inflight_requests",
                        "Requests in flight on a block device beneath a target (/sys/block/DEV/inflight).",
                    ),
                    &["device", "direction"],
                ),
            ),
            device_info: register(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "stallwatch_device_info",
                        "1 per disk beneath a target (md members included), labelled with its queue facts: rotational 0/1, write_cache (write back: a volatile cache the kernel flushes; write through), fua 0/1, scheduler; unknown where sysfs has no such attribute.",
                    ),
                    &["device", "rotational", "write_cache", "fua", "scheduler"],
                ),
            ),
        }
    }

    /// Reads the facts of the disks beneath `backing` (the devices beneath the targets)
    /// and publishes them when they differ from `known`, the facts last published (the
    /// scheduler and the cache mode can be set at run time). Series are replaced only
    /// on a change.
    fn publish_facts(
        &self,
        backing: &BTreeSet<String>,
        sys_root: &Path,
        known: &mut Option<Vec<[String; 5]>>,
    ) {
        let disks: BTreeSet<String> = backing
            .iter()
            .map(|d| devstat::disk_of(sys_root, d))
            .collect();
        let mut labels = Vec::new();
        for d in &disks {
            let f = match devstat::read_facts(sys_root, d) {
                Ok(f) => f,
                Err(e) => {
                    warn!(device = %d, error = %e, "reading the device's queue facts failed");
                    continue;
                }
            };
            let flag = |b: Option<bool>| b.map_or("unknown", |b| if b { "1" } else { "0" });
            labels.push([
                d.clone(),
                flag(f.rotational).to_owned(),
                f.write_cache.map_or("unknown", |w| w.as_str()).to_owned(),
                flag(f.fua).to_owned(),
                f.scheduler.unwrap_or_else(|| "unknown".into()),
            ]);
        }
        if known.as_ref() != Some(&labels) {
            self.device_info.reset();
            for l in &labels {
                let l: Vec<&str> = l.iter().map(String::as_str).collect();
                self.device_info.with_label_values(&l).set(1);
            }
            *known = Some(labels);
        }
    }

    fn publish_vm(&self, s: &vm::VmSample, prev: Option<&vm::VmSample>) {
        let c = &s.counters;
        self.vm_dirty.set(c.dirty_bytes as i64);
        self.vm_writeback.set(c.writeback_bytes as i64);
        self.vm_dirty_threshold.set(c.dirty_threshold_bytes as i64);
        self.vm_dirty_background_threshold
            .set(c.dirty_background_threshold_bytes as i64);
        // Kernel totals mirrored as counters: add what grew since the last sample.
        let (d0, w0) = prev
            .map(|p| (p.counters.dirtied_bytes, p.counters.written_bytes))
            .unwrap_or((0, 0));
        self.vm_dirtied.inc_by(c.dirtied_bytes.saturating_sub(d0));
        self.vm_written.inc_by(c.written_bytes.saturating_sub(w0));
        if let Some(p) = s.pressure {
            let (s0, f0) = prev
                .and_then(|p| p.pressure)
                .map(|p| (p.some_seconds, p.full_seconds))
                .unwrap_or((0.0, 0.0));
            self.pressure_some.inc_by((p.some_seconds - s0).max(0.0));
            self.pressure_full.inc_by((p.full_seconds - f0).max(0.0));
        }
        if let Some(y) = s.sysctls {
            self.sysctl_dirty_ratio.set(y.dirty_ratio);
            self.sysctl_dirty_background_ratio
                .set(y.dirty_background_ratio);
            self.sysctl_dirty_bytes.set(y.dirty_bytes as f64);
            self.sysctl_dirty_background_bytes
                .set(y.dirty_background_bytes as f64);
            self.sysctl_dirty_expire.set(y.dirty_expire_seconds);
            self.sysctl_dirty_writeback.set(y.dirty_writeback_seconds);
        }
    }

    /// Reads in-flight requests and md state of the devices beneath the targets.
    fn read_devices(
        &self,
        watched: &Watched,
        sys_root: &Path,
        files: &mut InflightFiles,
    ) -> DeviceReading {
        let mut r = DeviceReading::default();
        files.retain(|d, _| watched.disks.contains(d));
        for d in &watched.disks {
            if !files.contains_key(d) {
                let Ok(path) = blockdev::inflight_path(sys_root, d) else {
                    continue;
                };
                let series = |rw: &str| self.device_inflight.with_label_values(&[d.as_str(), rw]);
                let kept = Inflight {
                    file: KeptOpen::new(path),
                    reads: series("read"),
                    writes: series("write"),
                };
                files.insert(d.clone(), kept);
            }
            let kept = files.get_mut(d).expect("inserted above");
            if let Ok((reads, writes)) = kept.file.read_parse(blockdev::parse_inflight) {
                kept.reads.set(reads as i64);
                kept.writes.set(writes as i64);
                r.inflight.insert(d.clone(), reads + writes);
            }
        }
        for a in &watched.arrays {
            let Ok(st) = blockdev::md_state(sys_root, a) else {
                continue;
            };
            if let Some(action) = st.sync_action {
                for &x in SyncAction::VARIANTS {
                    self.md_sync_action
                        .with_label_values(&[a, x.as_str()])
                        .set((x == action) as i64);
                }
                r.md_action.insert(a.clone(), action);
            }
            self.md_sync_completed
                .with_label_values(&[a])
                .set(st.sync_fraction.unwrap_or(1.0));
            if let Some(d) = st.degraded {
                self.md_degraded.with_label_values(&[a]).set(d as i64);
            }
        }
        r
    }
}

/// The `inflight` file of a watched device, kept open between samples, and its two
/// series, looked up once.
struct Inflight {
    file: KeptOpen,
    reads: IntGauge,
    writes: IntGauge,
}

/// The `inflight` file and series of each watched device.
type InflightFiles = HashMap<String, Inflight>;

/// Where the sampler reads and how often.
pub struct Sampler {
    pub metrics: SamplerMetrics,
    pub roots: Roots,
    pub interval: Duration,
    /// Where each sample is kept for the live page.
    pub history: Arc<History>,
    /// Which devices to read: those beneath the targets.
    pub devices: Arc<Devices>,
    /// The latest sample, for the landing page.
    pub latest: Arc<Latest>,
}

/// The latest sample the sampler took, for the landing page; written only by the
/// sampler, under a lock held for a copy.
#[derive(Default)]
pub struct Latest(Mutex<Option<Snapshot>>);

impl Latest {
    /// The latest sample; None before the first one.
    pub fn get(&self) -> Option<Snapshot> {
        lock(&self.0).clone()
    }

    fn set(&self, s: Snapshot) {
        *lock(&self.0) = Some(s);
    }
}

impl Sampler {
    /// Samples until shutdown.
    pub fn run(&self, stalls: &StallLog, shutdown: &Shutdown) {
        let page = vm::page_size();
        let mut prev: Option<vm::VmSample> = None;
        let mut failing = false;
        let mut samples: u64 = 0;
        let mut facts = None;
        let mut next = Instant::now();
        let mut vm_files = vm::VmFiles::new(&self.roots.proc_root);
        let mut inflight_files = InflightFiles::new();
        let mut watched = Watched::default();
        loop {
            // The sysctls every tenth sample (and the first).
            let with_sysctls = samples.is_multiple_of(10);
            // Device facts when the devices change, and every minute or so.
            let changed = watched.refresh(&self.devices);
            if changed || samples.is_multiple_of(60) {
                self.metrics
                    .publish_facts(&watched.backing, &self.roots.sys_root, &mut facts);
            }
            samples += 1;
            match vm::sample(&mut vm_files, page, with_sysctls) {
                Ok(s) => {
                    if failing {
                        info!("VM sampling recovered");
                        failing = false;
                    }
                    self.metrics.publish_vm(&s, prev.as_ref());
                    self.history.record_kernel(&s, SystemTime::now());
                    let devices = self.metrics.read_devices(
                        &watched,
                        &self.roots.sys_root,
                        &mut inflight_files,
                    );
                    let snapshot = Snapshot { vm: s, devices };
                    self.latest.set(snapshot.clone());
                    stalls.observe(snapshot);
                    prev = Some(s);
                }
                Err(e) => {
                    self.metrics.vm_sample_errors.inc();
                    if !failing {
                        warn!(error = %e, "VM sampling failed");
                        failing = true;
                    }
                }
            }
            next += self.interval;
            let now = Instant::now();
            if next < now {
                next = now;
            }
            if shutdown.sleep_until(next) {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::blockdev::TargetDevices;

    #[test]
    fn md_and_device_metrics_from_a_resyncing_raid5_fixture() {
        let sys = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sys/md-raid5-resync");
        let r = crate::exposition::registry::Registry::new();
        let m = SamplerMetrics::new(&r);
        let devices = Devices::default();
        let d = blockdev::resolve(&sys, 9, 0).unwrap();
        devices.set(
            0,
            TargetDevices {
                disk: Some(d.disk.clone()),
                arrays: d.md_arrays.clone(),
                device: Some(d.name.clone()),
                members: d.slaves.clone(),
            },
        );
        let mut watched = Watched::default();
        assert!(watched.refresh(&devices));
        let reading = m.read_devices(&watched, &sys, &mut InflightFiles::new());
        assert_eq!(reading.md_action.get("md0"), Some(&SyncAction::Resync));
        assert_eq!(
            m.md_sync_action.with_label_values(&["md0", "resync"]).get(),
            1
        );
        assert_eq!(
            m.md_sync_action.with_label_values(&["md0", "idle"]).get(),
            0
        );
        let done = m.md_sync_completed.with_label_values(&["md0"]).get();
        assert!((done - 123456.0 / 7814037168.0).abs() < 1e-9, "{done}");
        assert!(reading.inflight.contains_key("md0"));
    }
}
