//! The target → device registry: the whole disk, the md arrays, the filesystem's own
//! device and the leaf devices beneath each target. Written by a target's lanes when
//! they resolve its mount, read by the sampler (which devices to read) and by the lanes
//! and the watchdog, which hand a stalled call's devices to the stall log.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::base::sync::lock;
use crate::kernel::blockdev::TargetDevices;

/// The devices beneath every target, by the target's number in the configuration. Its
/// lock is held for a copy, never across a system call.
#[derive(Default)]
pub struct Devices {
    by_target: Mutex<HashMap<usize, Arc<TargetDevices>>>,
    /// Counts the changes of `by_target`, so the sampler rebuilds its sets only then
    /// (`Watched::refresh`), not at every sample.
    changes: AtomicU64,
}

/// The devices the sampler reads, as of one change of the registry: rebuilt from it
/// only when a target's devices changed. Rebuilt every second, the sets were a walk
/// over every target's entry, cold after a second, for the same few names: about 20 µs
/// of the sampler's 176 µs per sample at 64 targets, 8 of them on disks (its thread's
/// CPU clock around each step, 2026-12-07; BENCHMARKS.md, "CPU at the syscall floor").
#[derive(Debug, Default)]
pub struct Watched {
    /// The change of the registry these sets are of; None before the first refresh.
    change: Option<u64>,
    /// The whole disks beneath the targets (their `inflight` is read).
    pub disks: BTreeSet<String>,
    /// The md arrays beneath the targets.
    pub arrays: BTreeSet<String>,
    /// The whole disks and the leaf devices beneath them (their queue facts).
    pub backing: BTreeSet<String>,
}

impl Watched {
    /// Brings the sets up to date with `devices`; true when they were rebuilt.
    pub fn refresh(&mut self, devices: &Devices) -> bool {
        // Read before the lock: a change counted after this load (its devices may or
        // may not be in the sets built now) makes the next refresh build them again.
        let change = devices.changes.load(Ordering::Acquire);
        if self.change == Some(change) {
            return false;
        }
        let by_target = lock(&devices.by_target);
        let all = || by_target.values();
        self.disks = all().filter_map(|d| d.disk.clone()).collect();
        self.arrays = all().flat_map(|d| d.arrays.iter().cloned()).collect();
        self.backing = all()
            .flat_map(|d| d.disk.iter().chain(d.members.iter()).cloned())
            .collect();
        self.change = Some(change);
        true
    }
}

impl Devices {
    /// Records which devices lie beneath a target, for the context of its stalls.
    pub fn set(&self, target: usize, devices: TargetDevices) {
        let mut by_target = lock(&self.by_target);
        if by_target.get(&target).is_some_and(|d| **d == devices) {
            return;
        }
        by_target.insert(target, Arc::new(devices));
        self.changes.fetch_add(1, Ordering::Release);
    }

    /// Forgets a target no longer probed.
    pub fn remove(&self, target: usize) {
        let mut by_target = lock(&self.by_target);
        if by_target.remove(&target).is_some() {
            self.changes.fetch_add(1, Ordering::Release);
        }
    }

    /// The devices beneath a target; none known yet when its mount is not resolved.
    pub fn of(&self, target: usize) -> Arc<TargetDevices> {
        lock(&self.by_target)
            .get(&target)
            .cloned()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(disk: &str, members: &[&str], arrays: &[&str]) -> TargetDevices {
        TargetDevices {
            disk: Some(disk.into()),
            arrays: arrays.iter().map(|a| a.to_string()).collect(),
            device: Some(disk.into()),
            members: members.iter().map(|m| m.to_string()).collect(),
        }
    }

    fn names(s: &BTreeSet<String>) -> Vec<&str> {
        s.iter().map(String::as_str).collect()
    }

    #[test]
    fn the_watched_sets_are_rebuilt_only_when_a_targets_devices_change() {
        let devices = Devices::default();
        let mut w = Watched::default();
        assert!(w.refresh(&devices), "the first refresh builds them");
        assert!(w.disks.is_empty() && w.backing.is_empty());
        assert!(!w.refresh(&devices));

        devices.set(0, on("md0", &["sdb1", "sdc1"], &["md0"]));
        devices.set(1, on("sda", &[], &[]));
        devices.set(2, TargetDevices::default());
        assert!(w.refresh(&devices));
        assert_eq!(names(&w.disks), ["md0", "sda"]);
        assert_eq!(names(&w.arrays), ["md0"]);
        assert_eq!(names(&w.backing), ["md0", "sda", "sdb1", "sdc1"]);
        assert!(!w.refresh(&devices), "nothing changed since");

        // A lane resolving its mount again to the same devices changes nothing.
        devices.set(1, on("sda", &[], &[]));
        assert!(!w.refresh(&devices));

        devices.set(1, on("sdd", &[], &[]));
        assert!(w.refresh(&devices));
        assert_eq!(names(&w.disks), ["md0", "sdd"]);

        devices.remove(0);
        devices.remove(7);
        assert!(w.refresh(&devices));
        assert_eq!(names(&w.disks), ["sdd"]);
        assert!(w.arrays.is_empty());
        assert!(
            !w.refresh(&devices),
            "removing an unknown target changes nothing"
        );
    }
}
