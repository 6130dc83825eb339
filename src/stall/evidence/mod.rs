//! The evidence of a stall beyond the VM counters: who was dirtying (per cgroup and per
//! process), what the backing devices did (per-second figures over the window) and the
//! ext4 journal's commit times; and the phrases a verdict is built from.
//!
//! One [`Reading`] is a pass over cgroupfs, `/proc/PID/io`, the devices' `stat` and the
//! journals, shared by every ongoing stall; each stall folds the readings of its window
//! into its own [`Window`], whose [`Window::evidence`] is what the event shows. The
//! window starts at the crossing (the first reading), since nothing is read before a
//! stall is seen, and ends with the first reading after the call returned.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::kernel::blockdev;
use crate::kernel::cgroups::{self, CgroupReading, DevNum, Hierarchies};
use crate::kernel::devstat::{self, DiskStat, SECTOR_BYTES};
use crate::kernel::jbd2::{self, JournalInfo};
use crate::kernel::kernfs::Roots;
use crate::kernel::procio::{self, ProcReading};

/// Cgroups and processes named in an event.
pub const TOP: usize = 5;

/// Intervals shorter than this between two readings are merged into the next one, so
/// peak and minimum are per-second figures, not the noise of a 50 ms slice.
const MIN_INTERVAL_SECONDS: f64 = 0.5;

/// A device busy less than this in every interval counts as idle.
const IDLE_UTILISATION: f64 = 0.05;

/// What one stall's evidence covers: the target's devices.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scope {
    /// The whole disk beneath the target (`loop3`, `md0`, `sda`).
    pub disk: Option<String>,
    /// The filesystem's own device (`sda1`), whose journal jbd2 names.
    pub device: Option<String>,
    /// The leaf devices of md arrays beneath the target (`sdb1`, `sdc`).
    pub members: Vec<String>,
}

impl Scope {
    /// The devices whose figures the event keeps: the disk first, then the members.
    fn devices(&self) -> impl Iterator<Item = (&str, &'static str)> {
        self.disk
            .iter()
            .map(|d| (d.as_str(), "disk"))
            .chain(self.members.iter().map(|m| (m.as_str(), "md_member")))
    }
}

/// One device as read in a pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceSample {
    pub stat: DiskStat,
    /// Requests in flight (reads, writes).
    pub inflight: Option<(u64, u64)>,
    pub nr_requests: Option<u64>,
}

/// One pass over everything the ongoing stalls want.
#[derive(Debug, Clone)]
pub struct Reading {
    pub at: Instant,
    pub cgroup_version: Option<u8>,
    /// Where the memory hierarchy is, for the named cgroups' processes.
    pub memory_root: Option<PathBuf>,
    pub cgroups: CgroupReading,
    pub procs: ProcReading,
    pub devices: HashMap<String, DeviceSample>,
    pub dev_nums: HashMap<String, DevNum>,
    pub journals: HashMap<String, (String, JournalInfo)>,
}

/// Reads what `scopes` need, once. Never touches a probed filesystem: cgroupfs, sysfs
/// and procfs only.
pub fn read(roots: &Roots, hierarchies: &Hierarchies, scopes: &[&Scope]) -> Reading {
    let sys = &roots.sys_root;
    let mut devices = HashMap::new();
    let mut dev_nums = HashMap::new();
    let mut journals = HashMap::new();
    for s in scopes {
        for (name, _) in s.devices() {
            if devices.contains_key(name) {
                continue;
            }
            let Ok(stat) = devstat::read_stat(sys, name) else {
                continue;
            };
            devices.insert(
                name.to_owned(),
                DeviceSample {
                    stat,
                    inflight: blockdev::inflight(sys, name).ok(),
                    nr_requests: devstat::read_nr_requests(sys, name).ok().flatten(),
                },
            );
        }
        if let Some(d) = &s.disk {
            if !dev_nums.contains_key(d) {
                if let Ok(n) = devstat::read_dev(sys, d) {
                    dev_nums.insert(d.clone(), n);
                }
            }
        }
        if let Some(d) = &s.device {
            if !journals.contains_key(d) {
                if let Some(dir) = jbd2::find(&roots.proc_root, d) {
                    if let Ok(info) = jbd2::read(&dir) {
                        let name = dir
                            .file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_default();
                        journals.insert(d.clone(), (name, info));
                    }
                }
            }
        }
    }
    let mut nums: Vec<DevNum> = dev_nums.values().copied().collect();
    nums.sort();
    nums.dedup();
    Reading {
        at: Instant::now(),
        cgroup_version: hierarchies.memory_version(),
        memory_root: hierarchies.memory_root().map(Path::to_owned),
        cgroups: cgroups::read(hierarchies, &nums, cgroups::MAX_CGROUPS),
        procs: procio::read(&roots.proc_root, procio::MAX_PROCESSES),
        devices,
        dev_nums,
        journals,
    }
}

/// A cgroup named in the event: its dirty and writeback memory when their sum peaked,
/// and what it wrote to the target's disk during the window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Dirtier {
    pub cgroup: String,
    pub dirty_bytes: u64,
    pub writeback_bytes: u64,
    pub written_bytes: u64,
}

/// A process named in the event, by bytes written during the window.
#[derive(Debug, Clone, PartialEq, Serialize)]
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
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct DeviceFigures {
    pub device: String,
    /// `disk` (beneath the target) or `md_member`.
    pub role: &'static str,
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
}

/// The ext4 journal during the window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JournalFigures {
    /// The jbd2 name, `sda1-8`.
    pub journal: String,
    /// Transactions committed during the window.
    pub transactions: u64,
    pub start: JournalInfo,
    pub end: JournalInfo,
}

/// What the event says about the window, beyond the VM counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
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

/// Evidence phrases for the verdict sentence, strongest first, and whether the backing
/// devices were idle through the window (`Some(true)`: the hold was above the block
/// layer; None when no device was measured over an interval).
pub fn phrases(e: &Evidence) -> (Vec<String>, Option<bool>) {
    let mut out = Vec::new();
    if let Some(d) = e.dirtiers.first() {
        let held = d.dirty_bytes.saturating_add(d.writeback_bytes);
        if held > 0 {
            out.push(format!("top dirtier {} {}", d.cgroup, binary_bytes(held)));
        } else if d.written_bytes > 0 {
            out.push(format!(
                "top writing cgroup {} {} written",
                d.cgroup,
                decimal_bytes(d.written_bytes as f64)
            ));
        }
    }
    if let Some(w) = e.writers.first() {
        let whose = w
            .cgroup
            .as_ref()
            .map_or(String::new(), |c| format!(" in {c}"));
        out.push(format!(
            "top writing process {} (pid {}{whose}) {} written",
            w.comm,
            w.pid,
            decimal_bytes(w.written_bytes as f64)
        ));
    }
    let mut idle = None;
    for d in &e.block_devices {
        let (Some(rate), Some(util), Some(peak)) = (
            d.write_bytes_per_second_avg,
            d.utilisation_avg,
            d.utilisation_max,
        ) else {
            continue;
        };
        let quiet = peak < IDLE_UTILISATION;
        idle = Some(idle.unwrap_or(true) && quiet);
        if quiet {
            out.push(format!("{} idle ({} % busy)", d.device, percent(peak)));
            continue;
        }
        let mut p = format!(
            "{} writing {}/s at {} % busy",
            d.device,
            decimal_bytes(rate),
            percent(util)
        );
        if let Some(lat) = d.write_latency_seconds_avg {
            p.push_str(&format!(", {} per write", duration(lat)));
        }
        out.push(p);
        if let Some(nr) = d.nr_requests {
            let inflight = d.inflight_reads_max + d.inflight_writes_max;
            if nr > 0 && inflight >= nr {
                out.push(format!(
                    "{} queue full ({inflight} of {nr} requests in flight)",
                    d.device
                ));
            }
        }
        if let (Some(n), Some(t)) = (d.flushes, d.flush_seconds_avg) {
            if n > 0 && t >= 0.1 {
                out.push(format!("{} {n} flushes at {} each", d.device, duration(t)));
            }
        }
    }
    if let Some(j) = &e.journal {
        if let Some(c) = j.end.commit_seconds_avg {
            let n = j.transactions;
            out.push(format!(
                "ext4 journal {}: {n} commit{} in the window, average commit {}",
                j.journal,
                if n == 1 { "" } else { "s" },
                duration(c)
            ));
        }
    }
    (out, idle)
}

/// `1.1 GiB`, `512 KiB`, `0 B`: memory in binary units.
pub fn binary_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// `2.0 MB`, `850 kB`: device traffic in decimal units, as disks are rated.
pub fn decimal_bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = b;
    let mut i = 0;
    while v >= 1000.0 && i + 1 < UNITS.len() {
        v /= 1000.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

fn percent(ratio: f64) -> String {
    format!("{:.0}", (ratio * 100.0).clamp(0.0, 100.0))
}

/// `850 ms`, `1.2 s`, `310 µs`.
pub fn duration(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.1} s")
    } else if s >= 0.001 {
        format!("{:.0} ms", s * 1000.0)
    } else {
        format!("{:.0} µs", s * 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::cgroups::CgroupStat;
    use std::time::Duration;

    fn stat(write_ios: u64, write_sectors: u64, write_ticks: u64, io_ticks: u64) -> DiskStat {
        DiskStat {
            write_ios,
            write_sectors,
            write_ticks_ms: write_ticks,
            io_ticks_ms: io_ticks,
            flush_ios: Some(write_ios / 10),
            flush_ticks_ms: Some(write_ticks / 5),
            ..DiskStat::default()
        }
    }

    fn reading(
        at: Instant,
        cg: &[(&str, u64, u64, u64)],
        procs: &[(u32, u64)],
        s: DiskStat,
    ) -> Reading {
        let cgroups = CgroupReading {
            cgroups: cg
                .iter()
                .map(|&(p, dirty, writeback, written)| {
                    (
                        p.to_owned(),
                        CgroupStat {
                            dirty,
                            writeback,
                            written,
                        },
                    )
                })
                .collect(),
            walked: cg.len(),
            capped: cg.len() > 3,
            errors: 0,
        };
        Reading {
            at,
            cgroup_version: Some(1),
            memory_root: None,
            cgroups,
            procs: ProcReading {
                written: procs.iter().copied().collect(),
                unreadable: 2,
                capped: false,
            },
            devices: HashMap::from([(
                "loop3".to_owned(),
                DeviceSample {
                    stat: s,
                    inflight: Some((0, 128)),
                    nr_requests: Some(128),
                },
            )]),
            dev_nums: HashMap::new(),
            journals: HashMap::new(),
        }
    }

    fn scope() -> Scope {
        Scope {
            disk: Some("loop3".into()),
            device: Some("loop3".into()),
            members: vec![],
        }
    }

    #[test]
    fn a_window_ranks_dirtiers_and_keeps_device_peaks_and_minima() {
        let t0 = Instant::now();
        let s = |secs: f64| t0 + Duration::from_secs_f64(secs);
        let mut w = Window::new(scope());
        // 2 MB/s, 100 % busy, then 1 MB/s at 50 %; a 0.2 s slice merged into the next.
        w.fold(&reading(
            s(0.0),
            &[
                ("/", 0, 0, 100),
                ("/writer", 10 << 20, 0, 0),
                ("/idle", 0, 0, 0),
                ("/elsewhere", 100 << 20, 0, 0),
            ],
            &[(7, 1000)],
            stat(0, 0, 0, 0),
        ));
        w.fold(&reading(
            s(1.0),
            &[
                ("/", 0, 0, 2_000_100),
                ("/writer", 30 << 20, 2 << 20, 512 << 10),
                ("/idle", 0, 0, 0),
                ("/late", 4096, 0, 0),
                ("/elsewhere", 100 << 20, 0, 0),
                ("/flushing", 0, 1 << 20, 0),
            ],
            &[(7, 5_001_000), (8, 9)],
            stat(100, 3906, 10_000, 1000),
        ));
        w.fold(&reading(
            s(1.2),
            &[("/writer", 20 << 20, 0, 512 << 10)],
            &[(7, 6_001_000)],
            stat(110, 4000, 11_000, 1100),
        ));
        w.fold(&reading(
            s(2.0),
            &[("/writer", 25 << 20, 0, 1 << 20)],
            &[(7, 7_001_000)],
            stat(150, 5859, 15_000, 1500),
        ));
        let e = w.evidence(Path::new("/nonexistent"));
        assert_eq!(e.reads, 4);
        assert_eq!(e.cgroup_version, Some(1));
        assert_eq!(e.cgroup_reads_capped, 2);
        assert_eq!(e.cgroups_walked, 6);
        assert_eq!(
            e.dirtiers,
            vec![
                Dirtier {
                    cgroup: "/writer".into(),
                    dirty_bytes: 30 << 20,
                    writeback_bytes: 2 << 20,
                    written_bytes: 1 << 20
                },
                Dirtier {
                    cgroup: "/flushing".into(),
                    dirty_bytes: 0,
                    writeback_bytes: 1 << 20,
                    written_bytes: 0
                },
                Dirtier {
                    cgroup: "/elsewhere".into(),
                    dirty_bytes: 100 << 20,
                    writeback_bytes: 0,
                    written_bytes: 0
                },
                Dirtier {
                    cgroup: "/late".into(),
                    dirty_bytes: 4096,
                    writeback_bytes: 0,
                    written_bytes: 0
                },
                Dirtier {
                    cgroup: "/".into(),
                    dirty_bytes: 0,
                    writeback_bytes: 0,
                    written_bytes: 2_000_000
                },
            ],
            "the one that wrote to the disk, then by writeback; the idle cgroup not named"
        );
        assert_eq!(
            e.writers,
            vec![Writer {
                pid: 7,
                comm: "?".into(),
                cgroup: None,
                written_bytes: 7_000_000
            }],
            "pid 8 appeared with 9 bytes and wrote nothing since"
        );
        assert_eq!(e.processes_unreadable, 2);
        let d = &e.block_devices[0];
        assert_eq!((d.device.as_str(), d.role), ("loop3", "disk"));
        assert_eq!(d.window_seconds, 2.0);
        assert_eq!(d.written_bytes, 5859 * 512);
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-6 * b.max(1.0);
        assert!(close(d.write_bytes_per_second_max, 3906.0 * 512.0), "{d:?}");
        assert!(
            close(d.write_bytes_per_second_min, 1953.0 * 512.0 / 1.0),
            "{d:?}"
        );
        assert!(close(d.write_iops_max, 100.0) && close(d.write_iops_min, 50.0));
        assert!(close(d.utilisation_max, 1.0) && close(d.utilisation_min, 0.5));
        assert!(close(d.utilisation_avg, 0.75));
        assert!(
            close(d.write_latency_seconds_avg, 0.1),
            "15 s of ticks over 150 writes"
        );
        assert_eq!(d.flushes, Some(15));
        assert!(close(d.flush_seconds_avg, 0.2));
        assert_eq!((d.inflight_writes_max, d.nr_requests), (128, Some(128)));

        let (p, idle) = phrases(&e);
        assert_eq!(idle, Some(false));
        assert_eq!(
            p,
            vec![
                "top dirtier /writer 32.0 MiB",
                "top writing process ? (pid 7) 7.0 MB written",
                "loop3 writing 1.5 MB/s at 75 % busy, 100 ms per write",
                "loop3 queue full (128 of 128 requests in flight)",
                "loop3 15 flushes at 200 ms each",
            ]
        );
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["dirtiers"][0]["cgroup"], "/writer");
        assert_eq!(json["block_devices"][0]["utilisation_max"], 1.0);
        assert_eq!(json["journal"], serde_json::Value::Null);
    }

    #[test]
    fn writers_are_the_named_cgroups_processes() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("writer")).unwrap();
        std::fs::write(root.path().join("writer/cgroup.procs"), "7\n").unwrap();
        std::fs::create_dir(root.path().join("second")).unwrap();
        std::fs::write(root.path().join("second/cgroup.procs"), "11\n").unwrap();
        let t0 = Instant::now();
        let mut w = Window::new(scope());
        let mut r = reading(
            t0,
            &[
                ("/writer", 1 << 20, 0, 0),
                ("/second", 4096, 0, 0),
                ("/build", 0, 0, 0),
            ],
            &[(7, 0), (9, 0), (11, 0)],
            stat(0, 0, 0, 0),
        );
        r.memory_root = Some(root.path().to_owned());
        w.fold(&r);
        r.procs.written = HashMap::from([(7, 4096), (9, 500 << 20), (11, 90 << 20)]);
        w.fold(&r);
        let e = w.evidence(Path::new("/nonexistent"));
        let pids: Vec<(u32, Option<&str>)> = e
            .writers
            .iter()
            .map(|w| (w.pid, w.cgroup.as_deref()))
            .collect();
        assert_eq!(
            pids,
            [(7, Some("/writer")), (11, Some("/second"))],
            "the first dirtier's process first; pid 9 wrote most, outside the named cgroups"
        );
        assert_eq!(
            phrases(&e).0[1],
            "top writing process ? (pid 7 in /writer) 4.1 kB written"
        );
    }

    #[test]
    fn an_idle_device_and_a_short_window() {
        let t0 = Instant::now();
        let mut w = Window::new(scope());
        let s = stat(10, 80, 5, 40);
        w.fold(&reading(t0, &[], &[], s));
        let e = w.evidence(Path::new("/nonexistent"));
        assert!(
            e.block_devices[0].utilisation_max.is_none(),
            "one reading: no rate"
        );
        assert_eq!(phrases(&e), (vec![], None));
        // 0.3 s later: shorter than an interval, no rate yet.
        w.fold(&reading(t0 + Duration::from_millis(300), &[], &[], s));
        let e = w.evidence(Path::new("/nonexistent"));
        assert_eq!(e.block_devices[0].utilisation_avg, None);
        assert_eq!(phrases(&e), (vec![], None));
        // 0.6 s, nothing moved: one interval, its rate is peak and minimum.
        w.fold(&reading(t0 + Duration::from_millis(600), &[], &[], s));
        let e = w.evidence(Path::new("/nonexistent"));
        let d = &e.block_devices[0];
        assert_eq!(
            (d.utilisation_max, d.write_bytes_per_second_min),
            (Some(0.0), Some(0.0))
        );
        assert_eq!(d.write_latency_seconds_avg, None, "no write completed");
        assert_eq!(
            phrases(&e),
            (vec!["loop3 idle (0 % busy)".to_owned()], Some(true))
        );
    }

    #[test]
    fn journal_figures_from_start_to_end() {
        let t0 = Instant::now();
        let mut w = Window::new(scope());
        let info = |n, c| JournalInfo {
            transactions: n,
            commit_seconds_avg: Some(c),
            ..JournalInfo::default()
        };
        let mut r = reading(t0, &[], &[], stat(0, 0, 0, 0));
        r.journals
            .insert("loop3".into(), ("loop3-8".into(), info(20, 0.0016)));
        w.fold(&r);
        r.journals
            .insert("loop3".into(), ("loop3-8".into(), info(23, 2.5)));
        w.fold(&r);
        let e = w.evidence(Path::new("/nonexistent"));
        let j = e.journal.as_ref().unwrap();
        assert_eq!((j.journal.as_str(), j.transactions), ("loop3-8", 3));
        assert_eq!(j.start.commit_seconds_avg, Some(0.0016));
        assert!(phrases(&e).0.contains(
            &"ext4 journal loop3-8: 3 commits in the window, average commit 2.5 s".to_owned()
        ));
    }

    #[test]
    fn units() {
        assert_eq!(binary_bytes(0), "0 B");
        assert_eq!(binary_bytes(1_181_116_006), "1.1 GiB");
        assert_eq!(binary_bytes(512 << 10), "512.0 KiB");
        assert_eq!(decimal_bytes(2_000_000.0), "2.0 MB");
        assert_eq!(decimal_bytes(999.0), "999 B");
        assert_eq!(duration(9.24), "9.2 s");
        assert_eq!(duration(0.85), "850 ms");
        assert_eq!(duration(0.00031), "310 µs");
        assert_eq!(percent(1.2), "100");
    }
}
