//! What a probe times and how it can fail: the `op` and `errno` label values shared by
//! the probe threads, the stall log, the metrics and the `probe` command.

use std::fmt;

use nix::errno::Errno;

use crate::config::{Mode, SyncKind};

/// One timed operation. Names are contract (metric label `op`); `prepare` covers the
/// untimed set-up a cycle may need (opening the probe directory, preallocating a file).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    strum::IntoStaticStr,
    strum::Display,
    strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
pub enum Op {
    Prepare,
    Create,
    Close,
    Unlink,
    Write,
    Fsync,
    Fdatasync,
    Rename,
    Dirsync,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// The timed operations of a mode, in the order a cycle runs them.
pub fn ops_of(mode: Mode, sync: SyncKind) -> &'static [Op] {
    match (mode, sync) {
        (Mode::Create, _) => &[Op::Create, Op::Close, Op::Unlink],
        (Mode::Overwrite, SyncKind::Fsync) => &[Op::Write, Op::Fsync],
        (Mode::Overwrite, SyncKind::Fdatasync) => &[Op::Write, Op::Fdatasync],
        (Mode::Direct, _) => &[Op::Write],
        (Mode::Replace, _) => &[Op::Create, Op::Write, Op::Fsync, Op::Rename, Op::Dirsync],
        (Mode::Append, _) => &[Op::Write, Op::Fdatasync],
    }
}

/// Why an operation failed: an errno, or a condition the kernel does not name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    Errno(Errno),
    /// `pwrite` wrote fewer bytes than asked.
    ShortWrite,
    /// The probe directory is a symlink, not ours, or writable by others.
    UnsafeDir,
    /// The directory is not on the mount that was checked (it changed under us).
    MountChanged,
}

impl Failure {
    /// The value of the `errno` label.
    pub fn label(self) -> &'static str {
        match self {
            Failure::Errno(e) => errno_name(e),
            Failure::ShortWrite => "short_write",
            Failure::UnsafeDir => "unsafe_dir",
            Failure::MountChanged => "mount_changed",
        }
    }
}

/// The symbolic name of an errno (`EIO`), as the metrics label it.
pub fn errno_name(e: Errno) -> &'static str {
    // Errno's Debug is its symbolic name; intern the few we see to avoid allocating.
    match e {
        Errno::EIO => "EIO",
        Errno::ENOSPC => "ENOSPC",
        Errno::EROFS => "EROFS",
        Errno::EACCES => "EACCES",
        Errno::EPERM => "EPERM",
        Errno::ENOENT => "ENOENT",
        Errno::EINVAL => "EINVAL",
        Errno::EDQUOT => "EDQUOT",
        Errno::ELOOP => "ELOOP",
        Errno::ENOTDIR => "ENOTDIR",
        Errno::EEXIST => "EEXIST",
        Errno::ESTALE => "ESTALE",
        Errno::EUCLEAN => "EUCLEAN",
        Errno::ENODEV => "ENODEV",
        Errno::ENXIO => "ENXIO",
        Errno::EBADF => "EBADF",
        Errno::EMFILE => "EMFILE",
        Errno::ENFILE => "ENFILE",
        Errno::ENOMEM => "ENOMEM",
        Errno::EINTR => "EINTR",
        Errno::EAGAIN => "EAGAIN",
        Errno::EFBIG => "EFBIG",
        Errno::ETIMEDOUT => "ETIMEDOUT",
        Errno::ENOTCONN => "ENOTCONN",
        _ => "other",
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Errno(e) => write!(f, "{} ({})", errno_name(*e), e.desc()),
            Failure::ShortWrite => f.write_str("short write"),
            Failure::UnsafeDir => f.write_str("unsafe probe directory"),
            Failure::MountChanged => f.write_str("mount changed under the probe"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strum::VariantArray;

    #[test]
    fn op_labels_are_the_contract_names() {
        let names: Vec<&str> = Op::VARIANTS.iter().map(|o| o.as_str()).collect();
        assert_eq!(
            names,
            [
                "prepare",
                "create",
                "close",
                "unlink",
                "write",
                "fsync",
                "fdatasync",
                "rename",
                "dirsync"
            ]
        );
        assert_eq!(Op::Fdatasync.to_string(), "fdatasync");
    }

    #[test]
    fn errno_labels_are_symbolic_and_bounded() {
        assert_eq!(Failure::Errno(Errno::EIO).label(), "EIO");
        assert_eq!(Failure::Errno(Errno::ENOTCONN).label(), "ENOTCONN");
        assert_eq!(Failure::Errno(Errno::EXDEV).label(), "other");
        assert_eq!(Failure::ShortWrite.label(), "short_write");
        assert_eq!(
            Failure::Errno(Errno::ENOSPC).to_string(),
            "ENOSPC (No space left on device)"
        );
    }
}
