//! One stall's window: the readings from its crossing to the first one after its call
//! returned, folded into the evidence the event shows (top dirtiers and writers, device
//! figures per second, the journal's commits).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Deserializer, Serialize};

use super::reading::{Reading, Scope};
use crate::kernel::cgroups;
use crate::kernel::devstat::{DiskStat, SECTOR_BYTES};
use crate::kernel::jbd2::JournalInfo;
use crate::kernel::procio;

/// Cgroups and processes named in an event.
pub const TOP: usize = 5;

/// Intervals shorter than this between two readings are merged into the next one, so
/// peak and minimum are per-second figures, not the noise of a 50 ms slice.
const MIN_INTERVAL_SECONDS: f64 = 0.5;

/// Intervals kept per device for the stall page's chart: past this, neighbours are
/// merged in pairs, so a long stall keeps its whole window at a coarser grain.
const MAX_INTERVALS: usize = 60;

/// A cgroup named in the event: its dirty and writeback memory when their sum peaked,
/// and what it wrote to the target's disk during the window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dirtier {
    pub cgroup: String,
    pub dirty_bytes: u64,
    pub writeback_bytes: u64,
    pub written_bytes: u64,
}

/// A process named in the event, by bytes written during the window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Writer {
    pub pid: u32,
    pub comm: String,
    /// The named cgroup it is in; null where no memory hierarchy is mounted.
    pub cgroup: Option<String>,
    pub written_bytes: u64,
}

/// A backing device's figures over the window: rates per interval of about a second
/// (peak and minimum), averages over the whole window. Rates are None until two
/// readings half a second apart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct DeviceFigures {
    pub device: String,
    /// `disk` (beneath the target) or `md_member`.
    #[serde(deserialize_with = "role_name")]
    pub role: Role,
    pub window_seconds: f64,
    pub written_bytes: u64,
    pub write_bytes_per_second_avg: Option<f64>,
    pub write_bytes_per_second_max: Option<f64>,
    pub write_bytes_per_second_min: Option<f64>,
    pub write_iops_max: Option<f64>,
    pub write_iops_min: Option<f64>,
    /// Write ticks over write I/Os completed in the window; None without a completion.
    pub write_latency_seconds_avg: Option<f64>,
    pub flushes: Option<u64>,
    pub flush_seconds_avg: Option<f64>,
    /// Busy time (io_ticks) over elapsed time, 0-1.
    pub utilisation_avg: Option<f64>,
    pub utilisation_max: Option<f64>,
    pub utilisation_min: Option<f64>,
    pub inflight_reads_max: u64,
    pub inflight_writes_max: u64,
    pub nr_requests: Option<u64>,
    /// The rates of each interval, oldest first, for the stall page's chart (at most
    /// 60: neighbours merged in pairs past that). Not part of the event's JSON; the
    /// stall record on disk keeps them beside it (`stall/store.rs`).
    #[serde(skip)]
    pub intervals: Vec<DeviceInterval>,
}

/// One interval of a device's window: from `start_seconds` after the window's first
/// reading, `seconds` long.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct DeviceInterval {
    pub start_seconds: f64,
    pub seconds: f64,
    pub write_bytes_per_second: f64,
    /// Write ticks over writes completed in the interval; None without a completion.
    pub write_latency_seconds: Option<f64>,
    /// Busy time over elapsed time, 0-1.
    pub utilisation: f64,
    /// Cache flushes completed in the interval (kernel ≥ 5.5).
    pub flushes: Option<u64>,
}

/// The ext4 journal during the window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalFigures {
    /// The jbd2 name, `sda1-8`.
    pub journal: String,
    /// Transactions committed during the window.
    pub transactions: u64,
    pub start: JournalInfo,
    pub end: JournalInfo,
}

/// `&'static str` under another name, so serde does not borrow it from the input (it
/// does for a field spelled `&str`); read back by `role_name`.
type Role = &'static str;

/// A device's role as stored: one of the two names [`DeviceFigures::role`] takes.
fn role_name<'de, D: Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
    let name = String::deserialize(d)?;
    ["disk", "md_member"]
        .into_iter()
        .find(|r| *r == name)
        .ok_or_else(|| serde::de::Error::custom(format!("unknown device role {name:?}")))
}

/// What the event says about the window, beyond the VM counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Evidence {
    /// Readings folded in: 0 when the call returned before the watchdog saw it.
    pub reads: u32,
    /// True once the reading after the call returned is in: the figures are final.
    pub complete: bool,
    /// 2 or 1: the cgroup version the dirty figures come from; null without a memory
    /// controller.
    pub cgroup_version: Option<u8>,
    /// The most cgroups walked by one reading.
    pub cgroups_walked: usize,
    /// Readings that stopped at the cap of cgroups walked (`cgroups::MAX_CGROUPS`).
    pub cgroup_reads_capped: u32,
    /// Top cgroups: those that wrote to the target's disk during the window (the root
    /// excepted) first, then by peak memory under writeback, then by dirty + writeback
    /// at their peak, then by bytes written. Dirty and writeback are the figures at the
    /// peak of their sum.
    pub dirtiers: Vec<Dirtier>,
    /// Processes of the named cgroups that wrote during the window (`/proc/PID/io`):
    /// the first dirtier's first, each cgroup's by bytes written; all processes by bytes
    /// written where no memory hierarchy is mounted.
    pub writers: Vec<Writer>,
    /// Processes whose `io` the agent could not read in the last reading (all but its
    /// own user's unless root).
    pub processes_unreadable: usize,
    pub block_devices: Vec<DeviceFigures>,
    pub journal: Option<JournalFigures>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    /// Written bytes when first seen.
    base: u64,
    /// The highest dirty + writeback seen, and the two at that moment.
    peak: u64,
    /// The most memory seen under writeback.
    peak_writeback: u64,
    dirty: u64,
    writeback: u64,
    written: u64,
}

#[derive(Debug, Clone, Default)]
struct DeviceWindow {
    first: Option<(Instant, DiskStat)>,
    last: Option<(Instant, DiskStat)>,
    /// The start of the interval being measured.
    mark: Option<(Instant, DiskStat)>,
    wbps: MinMax,
    iops: MinMax,
    util: MinMax,
    inflight_reads_max: u64,
    inflight_writes_max: u64,
    nr_requests: Option<u64>,
    /// The raw intervals: start, end, and the stats at both.
    intervals: Vec<(Instant, Instant, DiskStat, DiskStat)>,
}

#[derive(Debug, Clone, Copy, Default)]
struct MinMax(Option<(f64, f64)>);

impl MinMax {
    fn add(&mut self, v: f64) {
        self.0 = Some(match self.0 {
            Some((lo, hi)) => (lo.min(v), hi.max(v)),
            None => (v, v),
        });
    }
    fn min(&self) -> Option<f64> {
        self.0.map(|m| m.0)
    }
    fn max(&self) -> Option<f64> {
        self.0.map(|m| m.1)
    }
}

/// Interval rates between two stat readings `dt` seconds apart.
fn rates(a: &DiskStat, b: &DiskStat, dt: f64) -> (f64, f64, f64) {
    let d = |x: u64, y: u64| y.saturating_sub(x) as f64;
    (
        d(a.write_sectors, b.write_sectors) * SECTOR_BYTES as f64 / dt,
        d(a.write_ios, b.write_ios) / dt,
        (d(a.io_ticks_ms, b.io_ticks_ms) / 1000.0 / dt).min(1.0),
    )
}

/// One stall's accumulated evidence.
#[derive(Debug, Clone, Default)]
pub struct Window {
    scope: Scope,
    reads: u32,
    cgroup_version: Option<u8>,
    memory_root: Option<PathBuf>,
    cgroups_walked: usize,
    capped: u32,
    cgroups: HashMap<String, Tally>,
    proc_base: HashMap<u32, u64>,
    proc_last: HashMap<u32, u64>,
    processes_unreadable: usize,
    devices: Vec<(String, &'static str, DeviceWindow)>,
    journal: Option<(String, JournalInfo, JournalInfo)>,
}

impl Window {
    pub fn new(scope: Scope) -> Window {
        let devices = scope
            .devices()
            .map(|(d, role)| (d.to_owned(), role, DeviceWindow::default()))
            .collect();
        Window {
            scope,
            devices,
            ..Window::default()
        }
    }

    /// The devices this window wants read.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// Folds one reading into the window.
    pub fn fold(&mut self, r: &Reading) {
        self.reads += 1;
        self.cgroup_version = r.cgroup_version;
        self.memory_root.clone_from(&r.memory_root);
        self.cgroups_walked = self.cgroups_walked.max(r.cgroups.walked);
        self.capped += r.cgroups.capped as u32;
        for (path, s) in &r.cgroups.cgroups {
            let t = self.cgroups.entry(path.clone()).or_insert(Tally {
                base: s.written,
                ..Tally::default()
            });
            let sum = s.dirty.saturating_add(s.writeback);
            t.peak_writeback = t.peak_writeback.max(s.writeback);
            if sum > t.peak {
                t.peak = sum;
                t.dirty = s.dirty;
                t.writeback = s.writeback;
            }
            // A counter that went down: the cgroup was removed and made again.
            if s.written < t.base {
                t.base = s.written;
            }
            t.written = s.written - t.base;
        }
        for (&pid, &w) in &r.procs.written {
            self.proc_base.entry(pid).or_insert(w);
        }
        self.proc_last = r.procs.written.clone();
        self.processes_unreadable = r.procs.unreadable;
        for (name, _, w) in &mut self.devices {
            let Some(s) = r.devices.get(name) else {
                continue;
            };
            let now = (r.at, s.stat);
            w.first.get_or_insert(now);
            w.last = Some(now);
            match w.mark {
                Some((t0, s0)) => {
                    let dt = r.at.duration_since(t0).as_secs_f64();
                    if dt >= MIN_INTERVAL_SECONDS {
                        let (bps, iops, util) = rates(&s0, &s.stat, dt);
                        w.wbps.add(bps);
                        w.iops.add(iops);
                        w.util.add(util);
                        if w.intervals.len() == MAX_INTERVALS {
                            w.intervals = w
                                .intervals
                                .chunks(2)
                                .map(|c| (c[0].0, c[c.len() - 1].1, c[0].2, c[c.len() - 1].3))
                                .collect();
                        }
                        w.intervals.push((t0, r.at, s0, s.stat));
                        w.mark = Some(now);
                    }
                }
                None => w.mark = Some(now),
            }
            if let Some((rd, wr)) = s.inflight {
                w.inflight_reads_max = w.inflight_reads_max.max(rd);
                w.inflight_writes_max = w.inflight_writes_max.max(wr);
            }
            w.nr_requests = s.nr_requests.or(w.nr_requests);
        }
        if let Some(dev) = &self.scope.device {
            if let Some((name, info)) = r.journals.get(dev) {
                match &mut self.journal {
                    Some((_, _, end)) => *end = *info,
                    None => self.journal = Some((name.clone(), *info, *info)),
                }
            }
        }
    }

    /// The event's view of the window; reads the top writers' `comm` under `proc_root`.
    pub fn evidence(&self, proc_root: &Path) -> Evidence {
        let mut ranked: Vec<(&String, &Tally)> = self
            .cgroups
            .iter()
            .filter(|(_, t)| t.peak > 0 || t.written > 0)
            .collect();
        // Dirty memory is counted per cgroup over all devices: ranked by it alone, a
        // build with 300 MB of output waiting on another disk would outrank the writer
        // filling this one. So first the cgroups that wrote to the target's disk during
        // the window (on v2 cgroup writeback charges the flusher's writes to the
        // dirtier; the root's own writes are the kernel's: flusher on v1, journal), then
        // by memory under writeback (I/O in flight from the cgroup's page cache: on a
        // stalled disk it stays for seconds, elsewhere it clears in milliseconds), then
        // by dirty + writeback.
        let key = |(c, t): &(&String, &Tally)| {
            (
                t.written > 0 && c.as_str() != "/",
                t.peak_writeback,
                t.peak,
                t.written,
            )
        };
        ranked.sort_by(|a, b| key(b).cmp(&key(a)).then(a.0.cmp(b.0)));
        let dirtiers: Vec<Dirtier> = ranked
            .into_iter()
            .take(TOP)
            .map(|(c, t)| Dirtier {
                cgroup: c.clone(),
                dirty_bytes: t.dirty,
                writeback_bytes: t.writeback,
                written_bytes: t.written,
            })
            .collect();
        // The processes of the named cgroups: /proc/PID/io counts bytes written over all
        // devices, so the host's busiest writer may have nothing to do with this disk.
        // pid → (rank of its cgroup among the dirtiers, the cgroup).
        let named: Option<HashMap<u32, (usize, &str)>> = self.memory_root.as_ref().map(|root| {
            dirtiers
                .iter()
                .enumerate()
                .flat_map(|(rank, d): (usize, &Dirtier)| {
                    cgroups::procs(root, &d.cgroup)
                        .into_iter()
                        .map(move |pid| (pid, (rank, d.cgroup.as_str())))
                })
                .collect()
        });
        let of = |pid: &u32| named.as_ref().and_then(|n| n.get(pid)).copied();
        let mut writers: Vec<(u32, u64)> = self
            .proc_last
            .iter()
            .filter(|(pid, _)| named.is_none() || of(pid).is_some())
            // The agent's own writes (its probes, its stall record) are not a cause.
            .filter(|(pid, _)| **pid != std::process::id())
            .filter_map(|(pid, &w)| {
                let d = w.saturating_sub(*self.proc_base.get(pid)?);
                (d > 0).then_some((*pid, d))
            })
            .collect();
        // The first dirtier's processes first, each cgroup's by bytes written.
        let rank = |pid: &u32| of(pid).map_or(0, |(r, _)| r);
        writers.sort_by(|a, b| (rank(&a.0), b.1, a.0).cmp(&(rank(&b.0), a.1, b.0)));
        let writers = writers
            .into_iter()
            .take(TOP)
            .map(|(pid, written_bytes)| Writer {
                pid,
                comm: procio::comm(proc_root, pid),
                cgroup: of(&pid).map(|(_, c)| c.to_owned()),
                written_bytes,
            })
            .collect();
        Evidence {
            reads: self.reads,
            complete: false,
            cgroup_version: self.cgroup_version,
            cgroups_walked: self.cgroups_walked,
            cgroup_reads_capped: self.capped,
            dirtiers,
            writers,
            processes_unreadable: self.processes_unreadable,
            block_devices: self
                .devices
                .iter()
                .filter_map(|(name, role, w)| figures(name, role, w))
                .collect(),
            journal: self
                .journal
                .as_ref()
                .map(|(name, start, end)| JournalFigures {
                    journal: name.clone(),
                    transactions: end.transactions.saturating_sub(start.transactions),
                    start: *start,
                    end: *end,
                }),
        }
    }
}

fn figures(name: &str, role: &'static str, w: &DeviceWindow) -> Option<DeviceFigures> {
    let ((t0, a), (t1, b)) = (w.first?, w.last?);
    let dt = t1.duration_since(t0).as_secs_f64();
    let d = |x: u64, y: u64| y.saturating_sub(x);
    let written = d(a.write_sectors, b.write_sectors) * SECTOR_BYTES;
    let ios = d(a.write_ios, b.write_ios);
    let flushes = match (a.flush_ios, b.flush_ios) {
        (Some(x), Some(y)) => Some(d(x, y)),
        _ => None,
    };
    let flush_ms = match (a.flush_ticks_ms, b.flush_ticks_ms) {
        (Some(x), Some(y)) => Some(d(x, y)),
        _ => None,
    };
    let mut f = DeviceFigures {
        device: name.to_owned(),
        role,
        window_seconds: dt,
        written_bytes: written,
        write_latency_seconds_avg: (ios > 0)
            .then(|| d(a.write_ticks_ms, b.write_ticks_ms) as f64 / 1000.0 / ios as f64),
        flushes,
        flush_seconds_avg: match (flushes, flush_ms) {
            (Some(n), Some(ms)) if n > 0 => Some(ms as f64 / 1000.0 / n as f64),
            _ => None,
        },
        inflight_reads_max: w.inflight_reads_max,
        inflight_writes_max: w.inflight_writes_max,
        nr_requests: w.nr_requests,
        intervals: w
            .intervals
            .iter()
            .map(|&(t0, t1, a, b)| {
                let dt = t1.duration_since(t0).as_secs_f64();
                let (bps, _, util) = rates(&a, &b, dt);
                let ios = d(a.write_ios, b.write_ios);
                DeviceInterval {
                    start_seconds: t0.duration_since(w.first.map_or(t0, |f| f.0)).as_secs_f64(),
                    seconds: dt,
                    write_bytes_per_second: bps,
                    write_latency_seconds: (ios > 0).then(|| {
                        d(a.write_ticks_ms, b.write_ticks_ms) as f64 / 1000.0 / ios as f64
                    }),
                    utilisation: util,
                    flushes: match (a.flush_ios, b.flush_ios) {
                        (Some(x), Some(y)) => Some(d(x, y)),
                        _ => None,
                    },
                }
            })
            .collect(),
        ..DeviceFigures::default()
    };
    // A window shorter than one interval gives no rate: a 100 ms slice says nothing
    // about a device's second. One interval long, its one rate is peak and minimum.
    if dt >= MIN_INTERVAL_SECONDS {
        let (bps, iops, util) = rates(&a, &b, dt);
        f.write_bytes_per_second_avg = Some(bps);
        f.utilisation_avg = Some(util);
        let one = |m: &MinMax, v: f64| {
            if m.0.is_some() {
                *m
            } else {
                MinMax(Some((v, v)))
            }
        };
        let (wbps, wiops, wutil) = (one(&w.wbps, bps), one(&w.iops, iops), one(&w.util, util));
        f.write_bytes_per_second_max = wbps.max();
        f.write_bytes_per_second_min = wbps.min();
        f.write_iops_max = wiops.max();
        f.write_iops_min = wiops.min();
        f.utilisation_max = wutil.max();
        f.utilisation_min = wutil.min();
    }
    Some(f)
}
