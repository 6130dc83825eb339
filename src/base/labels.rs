//! The label types every layer uses: which probe runs (`Mode`, `SyncKind`), what it
//! times and how that can fail (`Op`, `Failure`: the `op` and `errno` label values) and
//! why a call was held (`Cause`). Names are contract (metric labels, event fields).

use std::fmt;

use serde::{Deserialize, Serialize};
use strum::VariantArray;

use crate::base::errno::{self, Errno};

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
    // A bounded set: the errnos a probe can meet; any other is `other`.
    const LABELLED: &[Errno] = &[
        Errno::IO,
        Errno::NOSPC,
        Errno::ROFS,
        Errno::ACCESS,
        Errno::PERM,
        Errno::NOENT,
        Errno::INVAL,
        Errno::DQUOT,
        Errno::LOOP,
        Errno::NOTDIR,
        Errno::EXIST,
        Errno::STALE,
        Errno::UCLEAN,
        Errno::NODEV,
        Errno::NXIO,
        Errno::BADF,
        Errno::MFILE,
        Errno::NFILE,
        Errno::NOMEM,
        Errno::INTR,
        Errno::AGAIN,
        Errno::FBIG,
        Errno::TIMEDOUT,
        Errno::NOTCONN,
    ];
    if LABELLED.contains(&e) {
        errno::name(e)
    } else {
        "other"
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Errno(e) => write!(f, "{} ({})", errno_name(*e), errno::desc(*e)),
            Failure::ShortWrite => f.write_str("short write"),
            Failure::UnsafeDir => f.write_str("unsafe probe directory"),
            Failure::MountChanged => f.write_str("mount changed under the probe"),
        }
    }
}

/// Which probe a cycle runs. Names are contract (metric label `mode`). strum derives the
/// names, the parser and the variant list from the variants; serde's `rename_all` spells
/// the same names, and `enum_names_agree_with_serde` pins the two together.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Deserialize,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::Display,
    strum::VariantArray,
)]
#[serde(rename_all = "lowercase")]
#[strum(
    serialize_all = "snake_case",
    parse_err_ty = UnknownName,
    parse_err_fn = UnknownName::mode
)]
pub enum Mode {
    Create,
    Overwrite,
    Direct,
    Replace,
    /// The database commit: append to a log, then fdatasync.
    Append,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// The flush call of the overwrite and replace probes.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Deserialize,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::Display,
    strum::VariantArray,
)]
#[serde(rename_all = "lowercase")]
#[strum(
    serialize_all = "snake_case",
    parse_err_ty = UnknownName,
    parse_err_fn = UnknownName::sync
)]
pub enum SyncKind {
    Fsync,
    Fdatasync,
}

impl SyncKind {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A word that names no mode or flush call (`--mode`, `--sync`), with the words accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnknownName {
    #[error("unknown mode {0:?}: expected {expected}", expected = or_list(Mode::VARIANTS))]
    Mode(String),
    #[error("unknown sync {0:?}: expected {expected}", expected = or_list(SyncKind::VARIANTS))]
    Sync(String),
}

impl UnknownName {
    fn mode(s: &str) -> UnknownName {
        UnknownName::Mode(s.to_owned())
    }

    fn sync(s: &str) -> UnknownName {
        UnknownName::Sync(s.to_owned())
    }
}

/// `a`, `a or b`, `a, b or c`: how the command line lists the accepted words.
fn or_list<T: Copy + Into<&'static str>>(values: &[T]) -> String {
    let words: Vec<&str> = values.iter().map(|&v| v.into()).collect();
    match words.as_slice() {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// The cause of a stall. Label values of `stallwatch_stalls_total{cause}` and
/// `stallwatch_probe_blocked_cause{cause}`: contract (SPEC "second wave").
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::Display,
    strum::VariantArray,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Cause {
    /// The filesystem is frozen (fsfreeze, a snapshot): writers wait for the thaw.
    Frozen,
    /// `balance_dirty_pages`: the writer is paused because too much is dirty.
    DirtyThrottle,
    /// Waiting for a journal or log commit (ext4 jbd2, XFS log, btrfs transaction).
    Journal,
    /// Waiting for pages under writeback to reach the device.
    WritebackWait,
    /// Waiting in the block layer: a request tag, writeback throttling, a synchronous
    /// request such as a cache flush.
    DeviceQueue,
    /// Waiting for a filesystem metadata block (an inode or block bitmap, an inode table
    /// block, a directory block) that is locked or being read from the device.
    MetadataBuffer,
    /// md RAID: barrier, stripe cache, superblock update or resync.
    Md,
    /// A network or FUSE filesystem waiting for its server.
    Remote,
    /// Sampled, but at a wait point the table does not know (the symbol is kept).
    Other,
    /// Never sampled: the call returned, or was not seen, before the sampling point.
    Unknown,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The words the verdict puts in parentheses after the wait point.
    pub fn text(self) -> &'static str {
        match self {
            Cause::Frozen => "filesystem frozen",
            Cause::DirtyThrottle => "dirty throttling",
            Cause::Journal => "journal or log commit wait",
            Cause::WritebackWait => "waiting for writeback",
            Cause::DeviceQueue => "block device queue or writeback throttling",
            Cause::MetadataBuffer => "waiting for a metadata block under I/O",
            Cause::Md => "md RAID barrier, stripe cache or resync",
            Cause::Remote => "network or FUSE filesystem",
            Cause::Other => "wait point not in the cause table",
            Cause::Unknown => "no wait point sampled",
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
        assert_eq!(Failure::Errno(Errno::IO).label(), "EIO");
        assert_eq!(Failure::Errno(Errno::NOTCONN).label(), "ENOTCONN");
        assert_eq!(Failure::Errno(Errno::XDEV).label(), "other");
        assert_eq!(Failure::ShortWrite.label(), "short_write");
        // Every label value there is, by raw number: contract (the `errno` label).
        let labels: Vec<(i32, &str)> = (1..200)
            .map(|n| (n, errno_name(Errno::from_raw_os_error(n))))
            .filter(|(_, l)| *l != "other")
            .collect();
        assert_eq!(
            labels,
            [
                (libc::EPERM, "EPERM"),
                (libc::ENOENT, "ENOENT"),
                (libc::EINTR, "EINTR"),
                (libc::EIO, "EIO"),
                (libc::ENXIO, "ENXIO"),
                (libc::EBADF, "EBADF"),
                (libc::EAGAIN, "EAGAIN"),
                (libc::ENOMEM, "ENOMEM"),
                (libc::EACCES, "EACCES"),
                (libc::EEXIST, "EEXIST"),
                (libc::ENODEV, "ENODEV"),
                (libc::ENOTDIR, "ENOTDIR"),
                (libc::EINVAL, "EINVAL"),
                (libc::ENFILE, "ENFILE"),
                (libc::EMFILE, "EMFILE"),
                (libc::EFBIG, "EFBIG"),
                (libc::ENOSPC, "ENOSPC"),
                (libc::EROFS, "EROFS"),
                (libc::ELOOP, "ELOOP"),
                (libc::ENOTCONN, "ENOTCONN"),
                (libc::ETIMEDOUT, "ETIMEDOUT"),
                (libc::ESTALE, "ESTALE"),
                (libc::EUCLEAN, "EUCLEAN"),
                (libc::EDQUOT, "EDQUOT"),
            ]
        );
        assert_eq!(
            Failure::Errno(Errno::NOSPC).to_string(),
            "ENOSPC (No space left on device)"
        );
    }
}
