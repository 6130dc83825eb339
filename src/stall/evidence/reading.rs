//! One reading: a pass over cgroupfs, `/proc/PID/io`, the devices' `stat` and the
//! journals, shared by every ongoing stall, and the devices each stall covers.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::kernel::blockdev::{self, TargetDevices};
use crate::kernel::cgroups::{self, CgroupReading, DevNum, Hierarchies};
use crate::kernel::devstat::{self, DiskStat};
use crate::kernel::jbd2::{self, JournalInfo};
use crate::kernel::kernfs::Roots;
use crate::kernel::procio::{self, ProcReading};

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
    /// The devices of a target that the evidence reads.
    pub fn of(d: &TargetDevices) -> Scope {
        Scope {
            disk: d.disk.clone(),
            device: d.device.clone(),
            members: d.members.clone(),
        }
    }

    /// The devices whose figures the event keeps: the disk first, then the members.
    pub(super) fn devices(&self) -> impl Iterator<Item = (&str, &'static str)> {
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
