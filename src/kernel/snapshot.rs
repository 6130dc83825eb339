//! One sample of the kernel's state as the sampler reads it every `vm_interval`: the VM
//! counters and what it read of the block devices beneath the targets. Plain data,
//! kept by the stall log for its events' windows and by the sampler for the page.

use std::collections::HashMap;

use super::blockdev::SyncAction;
use super::vm::VmSample;

/// What the sampler read of the block devices beneath the targets.
#[derive(Debug, Clone, Default)]
pub struct DeviceReading {
    /// Requests in flight (reads + writes) per whole disk.
    pub inflight: HashMap<String, u64>,
    /// Sync action per md array.
    pub md_action: HashMap<String, SyncAction>,
}

/// One sample of the kernel's state.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub vm: VmSample,
    pub devices: DeviceReading,
}
