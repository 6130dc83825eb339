//! The kernel readers: pure parsers and readers of procfs and sysfs, each taking the
//! roots it reads under (`kernfs::Roots`), never a hard-coded `/proc` or `/sys`.

pub mod blockdev;
pub mod cgroups;
pub mod devstat;
pub mod host;
pub mod jbd2;
pub mod kernfs;
pub mod mounts;
pub mod procio;
pub mod snapshot;
pub mod vm;
