//! The target → device registry: the whole disk, the md arrays, the filesystem's own
//! device and the leaf devices beneath each target. Written by a target's lanes when
//! they resolve its mount, read by the sampler (which devices to read) and by the lanes
//! and the watchdog, which hand a stalled call's devices to the stall log.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use crate::base::sync::lock;
use crate::kernel::blockdev::TargetDevices;

/// The devices beneath every target, by the target's number in the configuration. Its
/// lock is held for a copy, never across a system call.
#[derive(Default)]
pub struct Devices {
    by_target: Mutex<HashMap<usize, Arc<TargetDevices>>>,
}

impl Devices {
    /// Records which devices lie beneath a target, for the context of its stalls.
    pub fn set(&self, target: usize, devices: TargetDevices) {
        lock(&self.by_target).insert(target, Arc::new(devices));
    }

    /// Forgets a target no longer probed.
    pub fn remove(&self, target: usize) {
        lock(&self.by_target).remove(&target);
    }

    /// The devices beneath a target; none known yet when its mount is not resolved.
    pub fn of(&self, target: usize) -> Arc<TargetDevices> {
        lock(&self.by_target)
            .get(&target)
            .cloned()
            .unwrap_or_default()
    }

    /// The whole disks and md arrays beneath all targets, for the sampler to read.
    pub fn watched(&self) -> (BTreeSet<String>, BTreeSet<String>) {
        let by_target = lock(&self.by_target);
        let disks = by_target.values().filter_map(|d| d.disk.clone()).collect();
        let arrays = by_target
            .values()
            .flat_map(|d| d.arrays.iter().cloned())
            .collect();
        (disks, arrays)
    }

    /// The whole disks beneath all targets and the leaf devices beneath them, for the
    /// device facts.
    pub fn backing(&self) -> BTreeSet<String> {
        lock(&self.by_target)
            .values()
            .flat_map(|d| d.disk.iter().chain(d.members.iter()).cloned())
            .collect()
    }
}
