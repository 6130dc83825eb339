//! The mount table, read by `procfs`, not by stallwatch's own parser: the tests check the
//! agent's mount logic against the kernel. procfs keeps the octal escapes (`\040` for a
//! space) in mount points; no test mounts on such a path.

use std::path::Path;

use procfs::process::{MountInfo, Process};

/// All entries of `/proc/self/mountinfo`, in order (later entries stack on earlier ones).
pub fn mountinfo() -> Vec<MountInfo> {
    Process::myself()
        .and_then(|me| me.mountinfo())
        .expect("read /proc/self/mountinfo")
        .0
}

/// The topmost mount whose mount point is exactly `path`, if any.
pub fn mounted_at(path: &Path) -> Option<MountInfo> {
    mountinfo().into_iter().rfind(|m| m.mount_point == path)
}
