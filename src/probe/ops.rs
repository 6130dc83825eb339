//! The system calls of each probe mode, each timed on its own on the monotonic clock.
//! No metrics and no globals here: every timed call is reported to an [`Observer`].
//!
//! All paths are opened relative to a directory descriptor with `O_NOFOLLOW|O_CLOEXEC`,
//! so a symlink planted in the probe directory is never followed and nothing outside it
//! is touched. No descriptor outlives a cycle, so the agent never makes `umount` fail.

use std::fmt;
use std::os::fd::{AsFd, BorrowedFd, IntoRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{
    fdatasync, fsync, mkdirat, openat, renameat, unlinkat, AtFlags, Dir, FileType,
    Mode as FileMode, OFlags, Statx, StatxFlags,
};

use crate::base::errno::Errno;
use crate::base::labels::{Failure, Mode, Op, SyncKind};

/// Name of the directory the agent owns below each target path.
pub const PROBE_DIR: &str = ".stallwatch";

/// A failed operation of a cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpError {
    pub mode: Mode,
    pub op: Op,
    pub failure: Failure,
    /// What was being done, for the log.
    pub context: String,
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}: {}: {}",
            self.mode, self.op, self.context, self.failure
        )
    }
}

/// Receives every timed operation: `begin` right before the system call with the time
/// it starts, `end` right after it with the elapsed time and the time it returned, whether
/// it succeeded or not. The times are the timer's own clock reads, so an observer needs
/// none of its own.
pub trait Observer {
    fn begin(&self, mode: Mode, op: Op, started: Instant);
    fn end(&self, mode: Mode, op: Op, elapsed: Duration, failure: Option<Failure>, ended: Instant);
}

/// An observer that records nothing.
pub struct NoObserver;

impl Observer for NoObserver {
    fn begin(&self, _: Mode, _: Op, _: Instant) {}
    fn end(&self, _: Mode, _: Op, _: Duration, _: Option<Failure>, _: Instant) {}
}

/// The open probe directory of one cycle.
pub struct ProbeDir {
    fd: OwnedFd,
    /// This open created the directory (it was missing).
    pub created: bool,
}

/// The mount id of an open descriptor (statx `STATX_MNT_ID`, Linux 5.8+), so that the
/// directory we hold can be checked against the mount table without a race.
pub fn mount_id(fd: impl AsFd) -> Result<u64, Errno> {
    let st = statx(fd.as_fd(), StatxFlags::MNT_ID)?;
    if st.stx_mask & StatxFlags::MNT_ID.bits() == 0 {
        return Err(Errno::NOSYS);
    }
    Ok(st.stx_mnt_id)
}

/// statx of the descriptor itself (an empty path with `AT_EMPTY_PATH`), asking only for
/// `mask`.
fn statx(fd: BorrowedFd<'_>, mask: StatxFlags) -> Result<Statx, Errno> {
    rustix::fs::statx(fd, c"", AtFlags::EMPTY_PATH, mask)
}

/// The filesystem's O_DIRECT alignment (statx `STATX_DIOALIGN`, Linux 6.1+): `None`
/// when the filesystem says it does not support direct I/O, 4096 when the kernel is too
/// old to say.
fn direct_alignment(fd: impl AsFd) -> Option<u64> {
    match statx(fd.as_fd(), StatxFlags::DIOALIGN) {
        Ok(st) if st.stx_mask & StatxFlags::DIOALIGN.bits() != 0 => {
            if st.stx_dio_offset_align == 0 {
                None
            } else {
                Some(u64::from(st.stx_dio_offset_align.max(st.stx_dio_mem_align)).max(512))
            }
        }
        _ => Some(4096),
    }
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// The probe directory could not be opened or is not safe to write into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepareError {
    pub failure: Failure,
    pub context: String,
}

impl fmt::Display for PrepareError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.context, self.failure)
    }
}

/// Opens `PATH/.stallwatch`, creating it (mode 0700) if missing. When `expected_mount`
/// is given, `PATH` must be on that mount id, checked on the descriptor we then use for
/// every operation. Refuses a probe directory that is a symlink, is not owned by us, or
/// is writable by group or others.
pub fn open_probe_dir(path: &Path, expected_mount: Option<u64>) -> Result<ProbeDir, PrepareError> {
    open_dir(path, expected_mount, true)
}

/// Like [`open_probe_dir`] but never creates the directory (for cleaning up).
pub fn open_probe_dir_existing(
    path: &Path,
    expected_mount: Option<u64>,
) -> Result<ProbeDir, PrepareError> {
    open_dir(path, expected_mount, false)
}

fn open_dir(
    path: &Path,
    expected_mount: Option<u64>,
    create: bool,
) -> Result<ProbeDir, PrepareError> {
    let err = |failure, context: String| PrepareError { failure, context };
    let parent = rustix::fs::open(path, DIR_FLAGS, FileMode::empty()).map_err(|e| {
        // O_NOFOLLOW|O_DIRECTORY on a symlink answers ENOTDIR (or ELOOP), which would
        // send the reader looking for a file; say what it is.
        let symlink = matches!(e, Errno::NOTDIR | Errno::LOOP)
            && path.symlink_metadata().is_ok_and(|m| m.is_symlink());
        if symlink {
            err(
                Failure::UnsafeDir,
                format!(
                    "{} is a symlink, which is not followed: configure the directory it points to",
                    path.display()
                ),
            )
        } else {
            err(Failure::Errno(e), format!("open {}", path.display()))
        }
    })?;
    if let Some(want) = expected_mount {
        match mount_id(&parent) {
            Ok(id) if id != want => {
                return Err(err(
                    Failure::MountChanged,
                    format!("{} is on mount {id}, expected {want}", path.display()),
                ))
            }
            _ => {}
        }
    }
    // Open first and create only when missing: mkdir takes the filesystem's write
    // access even when the directory exists, and would block on a frozen filesystem
    // before the probe's own timed operations.
    let open = || openat(&parent, PROBE_DIR, DIR_FLAGS, FileMode::empty());
    let mut created = false;
    let opened = match open() {
        Err(Errno::NOENT) if create => match mkdirat(&parent, PROBE_DIR, FileMode::RWXU) {
            Ok(()) => {
                created = true;
                open()
            }
            Err(Errno::EXIST) => open(),
            Err(e) => {
                return Err(err(
                    Failure::Errno(e),
                    format!("create {}/{PROBE_DIR}", path.display()),
                ))
            }
        },
        r => r,
    };
    let fd = opened.map_err(|e| {
        let failure = match e {
            // O_NOFOLLOW on a symlink: ELOOP; O_DIRECTORY on a file: ENOTDIR.
            Errno::LOOP | Errno::NOTDIR => Failure::UnsafeDir,
            e => Failure::Errno(e),
        };
        let what = if failure == Failure::UnsafeDir {
            "is a symlink or not a directory; refusing to write through it"
        } else {
            "cannot be opened"
        };
        err(failure, format!("{}/{PROBE_DIR} {what}", path.display()))
    })?;
    // statx without the timestamps, for the same reason as in open_prealloc: a queried
    // directory mtime would make every create and unlink in it update the inode.
    let mask = StatxFlags::TYPE | StatxFlags::MODE | StatxFlags::UID;
    let st = statx(fd.as_fd(), mask)
        .map_err(|e| err(Failure::Errno(e), "stat probe directory".into()))?;
    let pst =
        statx(parent.as_fd(), mask).map_err(|e| err(Failure::Errno(e), "stat target".into()))?;
    let mode = u32::from(st.stx_mode);
    let euid = rustix::process::geteuid().as_raw();
    if st.stx_uid != euid || mode & 0o022 != 0 {
        return Err(err(
            Failure::UnsafeDir,
            format!(
                "{}/{PROBE_DIR} is owned by uid {} with mode {:o}; it must belong to uid {euid} and not be writable by group or others",
                path.display(),
                st.stx_uid,
                mode & 0o7777
            ),
        ));
    }
    if (st.stx_dev_major, st.stx_dev_minor) != (pst.stx_dev_major, pst.stx_dev_minor) {
        return Err(err(
            Failure::MountChanged,
            format!("{}/{PROBE_DIR} is a mount point of its own", path.display()),
        ));
    }
    Ok(ProbeDir { fd, created })
}

/// File names the agent owns in its directory; only these are ever removed.
pub const OVERWRITE_FILE: &str = "overwrite.dat";
pub const DIRECT_FILE: &str = "direct.dat";
pub const REPLACE_FILE: &str = "replace.dat";
pub const REPLACE_TEMP: &str = "replace.tmp";
pub const APPEND_FILE: &str = "append.log";
/// The new, empty log while the append probe rotates; renamed over `append.log`.
pub const APPEND_NEXT: &str = "append.next";
const CREATE_PREFIX: &str = "create.";

/// The mode whose lane owns the file `name`, or None for a name that is not ours. Each
/// lane removes only its own mode's leftovers, so lanes never delete each other's files.
pub fn owner_of(name: &str) -> Option<Mode> {
    match name {
        OVERWRITE_FILE => Some(Mode::Overwrite),
        DIRECT_FILE => Some(Mode::Direct),
        REPLACE_FILE | REPLACE_TEMP => Some(Mode::Replace),
        APPEND_FILE | APPEND_NEXT => Some(Mode::Append),
        _ => name
            .strip_prefix(CREATE_PREFIX)
            .filter(|rest| !rest.is_empty() && rest.chars().all(|c| c.is_ascii_digit() || c == '.'))
            .map(|_| Mode::Create),
    }
}

impl ProbeDir {
    /// Removes every file of ours in the directory (leftovers of an earlier run, or
    /// ours at shutdown). `unlinkat` never follows symlinks; foreign names stay.
    /// Returns how many were removed.
    pub fn remove_own_files(&self) -> usize {
        self.remove_files_of(|_| true)
    }

    /// Removes the files of ours that belong to the modes `which` selects.
    pub fn remove_files_of(&self, which: impl Fn(Mode) -> bool) -> usize {
        let Ok(dir) = openat(&self.fd, ".", DIR_FLAGS, FileMode::empty()).and_then(Dir::new) else {
            return 0;
        };
        let names: Vec<String> = dir
            .into_iter()
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str().ok().map(str::to_owned))
            .filter(|n| owner_of(n).is_some_and(&which))
            .collect();
        names
            .iter()
            .filter(|n| unlinkat(&self.fd, n.as_str(), AtFlags::empty()).is_ok())
            .count()
    }

    /// Removes our files and then the directory itself if nothing else is in it.
    pub fn remove_all(self, parent: &Path) {
        self.remove_mode(parent, |_| true);
    }

    /// Removes the files of the modes `which` selects, then the directory if that left
    /// it empty (the last lane of a target to stop removes it).
    pub fn remove_mode(self, parent: &Path, which: impl Fn(Mode) -> bool) {
        self.remove_files_of(which);
        drop(self);
        if let Ok(p) = rustix::fs::open(parent, DIR_FLAGS, FileMode::empty()) {
            let _ = unlinkat(&p, PROBE_DIR, AtFlags::REMOVEDIR);
        }
    }
}

/// Settings of one cycle.
pub struct CycleSpec {
    pub size: u64,
    pub sync: SyncKind,
    /// The append log's size limit: past it a new log replaces the old one.
    pub rotate_size: u64,
    /// Cycle number: varies the written bytes and the created names.
    pub seq: u64,
}

/// The latencies of one mode's completed operations, in order.
pub type Latencies = Vec<(Op, Duration)>;

struct Timer<'a> {
    mode: Mode,
    obs: &'a dyn Observer,
    done: &'a mut Latencies,
}

impl Timer<'_> {
    /// Times one system call. Failed calls are reported to the observer but not kept as
    /// latencies.
    fn run<T>(
        &mut self,
        op: Op,
        context: impl FnOnce() -> String,
        f: impl FnOnce() -> Result<T, Failure>,
    ) -> Result<T, OpError> {
        // Two clock reads per call, as the floor program makes (bench/floor.c): the
        // in-flight slot, the latency and the observer's time stamps all use them.
        let t0 = Instant::now();
        self.obs.begin(self.mode, op, t0);
        let r = f();
        let t1 = Instant::now();
        let elapsed = t1.saturating_duration_since(t0);
        self.obs
            .end(self.mode, op, elapsed, r.as_ref().err().copied(), t1);
        match r {
            Ok(v) => {
                if op != Op::Prepare {
                    self.done.push((op, elapsed));
                }
                Ok(v)
            }
            Err(failure) => Err(OpError {
                mode: self.mode,
                op,
                failure,
                context: context(),
            }),
        }
    }
}

/// A heap buffer aligned for O_DIRECT: `len` bytes at an `align`ed address inside a
/// slightly larger allocation, so no unsafe allocation code is needed.
struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize, align: usize, fill: u8) -> AlignedBuf {
        let align = align.max(1);
        let storage = vec![fill; len + align];
        let start = storage.as_ptr().align_offset(align);
        assert!(
            start < align,
            "a byte buffer can be aligned within one alignment"
        );
        AlignedBuf {
            storage,
            start,
            len,
        }
    }

    fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }
}

fn errno(e: Errno) -> Failure {
    Failure::Errno(e)
}

/// close(2), reporting its error (dropping an `OwnedFd` ignores it).
fn close(fd: OwnedFd) -> Result<(), Errno> {
    // SAFETY: `into_raw_fd` gives up ownership of a valid descriptor, which is closed here
    // exactly once and not used again.
    unsafe { rustix::io::try_close(fd.into_raw_fd()) }
}

fn write_all_at(fd: &OwnedFd, buf: &[u8]) -> Result<(), Failure> {
    let n = rustix::io::pwrite(fd, buf, 0).map_err(errno)?;
    if n != buf.len() {
        return Err(Failure::ShortWrite);
    }
    Ok(())
}

/// `O_DSYNC` itself: rustix's `OFlags::DSYNC` is `O_SYNC` on Linux, which would also
/// write the inode's timestamps on every write and so time more than a database's
/// `O_DSYNC` write.
const O_DSYNC: OFlags = OFlags::from_bits_retain(libc::O_DSYNC as u32);

const FILE_FLAGS: OFlags = OFlags::NOFOLLOW.union(OFlags::CLOEXEC);

/// Creates `name`, which must not exist yet, timed as op `create`.
fn create_new(t: &mut Timer<'_>, dir: &ProbeDir, name: &str) -> Result<OwnedFd, OpError> {
    t.run(
        Op::Create,
        || format!("create {name}"),
        || {
            openat(
                &dir.fd,
                name,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | FILE_FLAGS,
                FileMode::RUSR | FileMode::WUSR,
            )
            .map_err(errno)
        },
    )
}

/// The size of an opened probe file, after checking it is a regular file with one link
/// (a planted hard link or device is refused). statx asks for type, links and size only:
/// asking for the timestamps (as fstat does) marks them queried, and on Linux 6.13+
/// multigrain timestamps then make the timed write update mtime and the flush write the
/// inode, inflating the very latency we measure.
fn own_file_size(fd: &OwnedFd) -> Result<u64, Failure> {
    let st = statx(
        fd.as_fd(),
        StatxFlags::TYPE | StatxFlags::NLINK | StatxFlags::SIZE,
    )
    .map_err(errno)?;
    let regular = FileType::from_raw_mode(st.stx_mode.into()) == FileType::RegularFile;
    if !regular || st.stx_nlink != 1 {
        return Err(Failure::UnsafeDir);
    }
    Ok(st.stx_size)
}

/// Opens (creating and preallocating if needed) a data file of at least `size` bytes.
fn open_prealloc(
    t: &mut Timer<'_>,
    dir: &ProbeDir,
    name: &'static str,
    size: u64,
    extra: OFlags,
) -> Result<OwnedFd, OpError> {
    let fd = t.run(
        Op::Prepare,
        || format!("open {name}"),
        || {
            let fd = openat(
                &dir.fd,
                name,
                OFlags::WRONLY | OFlags::CREATE | FILE_FLAGS,
                FileMode::RUSR | FileMode::WUSR,
            )
            .map_err(errno)?;
            if own_file_size(&fd)? < size {
                // Preallocate with real data: the timed writes then overwrite allocated
                // blocks, as a database rewriting its pages does.
                write_all_at(&fd, &vec![0u8; size as usize])?;
                fsync(&fd).map_err(errno)?;
            }
            Ok(fd)
        },
    )?;
    if extra.is_empty() {
        return Ok(fd);
    }
    drop(fd);
    t.run(
        Op::Prepare,
        || format!("open {name} with O_DIRECT|O_DSYNC"),
        || {
            openat(
                &dir.fd,
                name,
                OFlags::WRONLY | FILE_FLAGS | extra,
                FileMode::empty(),
            )
            .map_err(|e| match e {
                Errno::INVAL => Failure::Errno(Errno::INVAL),
                e => errno(e),
            })
        },
    )
}

/// The largest write buffer a lane keeps between cycles.
const KEPT_BUFFER: usize = 64 << 10;

/// Runs one mode's operations in `dir`.
pub fn run_mode(
    mode: Mode,
    dir: &ProbeDir,
    spec: &CycleSpec,
    obs: &dyn Observer,
) -> Result<Latencies, OpError> {
    let mut done = Vec::with_capacity(5);
    run_mode_into(mode, dir, spec, obs, &mut done)?;
    Ok(done)
}

/// [`run_mode`] into the caller's `done` (cleared first), which a lane keeps from cycle
/// to cycle: no allocation per cycle.
pub fn run_mode_into(
    mode: Mode,
    dir: &ProbeDir,
    spec: &CycleSpec,
    obs: &dyn Observer,
    done: &mut Latencies,
) -> Result<(), OpError> {
    done.clear();
    let mut t = Timer { mode, obs, done };
    let fill = (spec.seq % 251) as u8 + 1;
    match mode {
        Mode::Create => {
            // The name in the lane's own buffer, the process id asked once: no
            // allocation and no getpid per cycle.
            thread_local! {
                static NAME: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
            }
            static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
            let pid = *PID.get_or_init(std::process::id);
            let name = NAME.with_borrow_mut(|n| {
                n.clear();
                n.push_str(CREATE_PREFIX);
                n.push_str(itoa::Buffer::new().format(pid));
                n.push('.');
                n.push_str(itoa::Buffer::new().format(spec.seq));
                std::mem::take(n)
            });
            let fd = create_new(&mut t, dir, &name)?;
            let closed = t.run(
                Op::Close,
                || format!("close {name}"),
                || close(fd).map_err(errno),
            );
            let unlinked = t.run(
                Op::Unlink,
                || format!("unlink {name}"),
                || unlinkat(&dir.fd, name.as_str(), AtFlags::empty()).map_err(errno),
            );
            // The buffer back for the next cycle.
            NAME.with_borrow_mut(|n| *n = name);
            closed.and(unlinked)?;
        }
        Mode::Overwrite => {
            let fd = open_prealloc(&mut t, dir, OVERWRITE_FILE, spec.size, OFlags::empty())?;
            // The lane's own buffer, kept from cycle to cycle when small (the default
            // 4 KiB): no allocation per cycle, and no lane holds a large one idle.
            thread_local! {
                static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
            }
            BUF.with_borrow_mut(|buf| {
                // Refilled in place when it has the size already (one memset); the
                // bytes are the same either way.
                if buf.len() == spec.size as usize {
                    buf.fill(fill);
                } else {
                    buf.clear();
                    buf.resize(spec.size as usize, fill);
                }
                let r = t.run(
                    Op::Write,
                    || format!("pwrite {} bytes to {OVERWRITE_FILE}", spec.size),
                    || write_all_at(&fd, buf),
                );
                if buf.capacity() > KEPT_BUFFER {
                    *buf = Vec::new();
                }
                r
            })?;
            // One flush per descriptor, never retried: a second fsync after a failure
            // would report success for pages the kernel already dropped.
            match spec.sync {
                SyncKind::Fsync => t.run(
                    Op::Fsync,
                    || format!("fsync {OVERWRITE_FILE}"),
                    || fsync(&fd).map_err(errno),
                )?,
                SyncKind::Fdatasync => t.run(
                    Op::Fdatasync,
                    || format!("fdatasync {OVERWRITE_FILE}"),
                    || fdatasync(&fd).map_err(errno),
                )?,
            }
        }
        Mode::Direct => {
            // statx reports STATX_DIOALIGN for regular files only (XFS and ext4 say
            // nothing for a directory), so ask the data file itself, opened buffered.
            let plain = open_prealloc(
                &mut t,
                dir,
                DIRECT_FILE,
                spec.size.div_ceil(4096) * 4096,
                OFlags::empty(),
            )?;
            let Some(align) = direct_alignment(&plain) else {
                return Err(OpError {
                    mode,
                    op: Op::Prepare,
                    failure: Failure::Errno(Errno::INVAL),
                    context: format!(
                        "this filesystem does not support direct I/O (statx reports no O_DIRECT alignment for {DIRECT_FILE})"
                    ),
                });
            };
            drop(plain);
            let size = spec.size.div_ceil(align) * align;
            let fd = open_prealloc(
                &mut t,
                dir,
                DIRECT_FILE,
                size,
                OFlags::DIRECT | O_DSYNC,
            )
            .map_err(|mut e| {
                if e.failure == Failure::Errno(Errno::INVAL) {
                    e.context = format!(
                        "this filesystem does not support direct I/O (open of {DIRECT_FILE} with O_DIRECT|O_DSYNC refused)"
                    );
                }
                e
            })?;
            let buf = AlignedBuf::new(size as usize, align.max(4096) as usize, fill);
            t.run(
                Op::Write,
                || {
                    format!(
                        "O_DIRECT|O_DSYNC pwrite {size} bytes to {DIRECT_FILE} (alignment {align})"
                    )
                },
                || write_all_at(&fd, buf.as_slice()),
            )?;
        }
        Mode::Replace => {
            // A temp file left by an interrupted cycle would make O_EXCL fail forever.
            let _ = unlinkat(&dir.fd, REPLACE_TEMP, AtFlags::empty());
            let fd = create_new(&mut t, dir, REPLACE_TEMP)?;
            let buf = vec![fill; spec.size as usize];
            t.run(
                Op::Write,
                || format!("pwrite {} bytes to {REPLACE_TEMP}", spec.size),
                || write_all_at(&fd, &buf),
            )?;
            t.run(
                Op::Fsync,
                || format!("fsync {REPLACE_TEMP}"),
                || fsync(&fd).map_err(errno),
            )?;
            drop(fd);
            t.run(
                Op::Rename,
                || format!("rename {REPLACE_TEMP} over {REPLACE_FILE}"),
                || renameat(&dir.fd, REPLACE_TEMP, &dir.fd, REPLACE_FILE).map_err(errno),
            )?;
            t.run(
                Op::Dirsync,
                || format!("fsync {PROBE_DIR}"),
                || fsync(&dir.fd).map_err(errno),
            )?;
        }
        Mode::Append => {
            let fd = open_log(&mut t, dir, spec)?;
            let buf = vec![fill; spec.size as usize];
            t.run(
                Op::Write,
                || format!("append {} bytes to {APPEND_FILE}", spec.size),
                || match rustix::io::write(&fd, &buf) {
                    Ok(n) if n == buf.len() => Ok(()),
                    Ok(_) => Err(Failure::ShortWrite),
                    Err(e) => Err(errno(e)),
                },
            )?;
            // The write grew the file: this fdatasync must commit the new size with the
            // data, as a database's log commit does.
            t.run(
                Op::Fdatasync,
                || format!("fdatasync {APPEND_FILE}"),
                || fdatasync(&fd).map_err(errno),
            )?;
        }
    }
    Ok(())
}

/// Opens the append log for appending (creating it when missing); when the next write
/// would take it past `rotate_size`, a new empty log first replaces it. Both are set-up
/// (`prepare`), not timed ops.
fn open_log(t: &mut Timer<'_>, dir: &ProbeDir, spec: &CycleSpec) -> Result<OwnedFd, OpError> {
    let append = OFlags::WRONLY | OFlags::APPEND | FILE_FLAGS;
    let mode = FileMode::RUSR | FileMode::WUSR;
    let (fd, len) = t.run(
        Op::Prepare,
        || format!("open {APPEND_FILE}"),
        || {
            let fd = openat(&dir.fd, APPEND_FILE, append | OFlags::CREATE, mode).map_err(errno)?;
            let len = own_file_size(&fd)?;
            Ok((fd, len))
        },
    )?;
    if len == 0 || len + spec.size <= spec.rotate_size {
        return Ok(fd);
    }
    drop(fd);
    // An earlier rotation interrupted between create and rename left this behind.
    let _ = unlinkat(&dir.fd, APPEND_NEXT, AtFlags::empty());
    let fd = t.run(
        Op::Prepare,
        || format!("create {APPEND_NEXT} to rotate {APPEND_FILE} at {len} bytes"),
        || {
            openat(
                &dir.fd,
                APPEND_NEXT,
                append | OFlags::CREATE | OFlags::EXCL,
                mode,
            )
            .map_err(errno)
        },
    )?;
    t.run(
        Op::Prepare,
        || format!("rename {APPEND_NEXT} over {APPEND_FILE}"),
        || renameat(&dir.fd, APPEND_NEXT, &dir.fd, APPEND_FILE).map_err(errno),
    )?;
    Ok(fd)
}

/// Where each target's probe files live.
pub fn probe_dir_of(path: &Path) -> PathBuf {
    path.join(PROBE_DIR)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn spec(seq: u64) -> CycleSpec {
        CycleSpec {
            size: 4096,
            sync: SyncKind::Fsync,
            rotate_size: 16384,
            seq,
        }
    }

    #[test]
    fn create_and_overwrite_and_replace_on_a_real_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = open_probe_dir(tmp.path(), None).unwrap();
        let meta = std::fs::metadata(tmp.path().join(PROBE_DIR)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o700);
        let c = run_mode(Mode::Create, &dir, &spec(1), &NoObserver).unwrap();
        assert_eq!(
            c.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
            vec![Op::Create, Op::Close, Op::Unlink]
        );
        let o = run_mode(Mode::Overwrite, &dir, &spec(2), &NoObserver).unwrap();
        assert_eq!(o.len(), 2);
        let data = std::fs::read(tmp.path().join(PROBE_DIR).join(OVERWRITE_FILE)).unwrap();
        assert_eq!(data.len(), 4096);
        assert!(data.iter().all(|b| *b == 3));
        let r = run_mode(Mode::Replace, &dir, &spec(3), &NoObserver).unwrap();
        assert_eq!(r.len(), 5);
        assert!(tmp.path().join(PROBE_DIR).join(REPLACE_FILE).exists());
        assert!(!tmp.path().join(PROBE_DIR).join(REPLACE_TEMP).exists());
        // Only our files exist; removal takes them and leaves foreign ones.
        std::fs::write(tmp.path().join(PROBE_DIR).join("notes.txt"), b"x").unwrap();
        std::fs::write(tmp.path().join(PROBE_DIR).join("create.77.5"), b"").unwrap();
        assert_eq!(dir.remove_own_files(), 3);
        assert!(tmp.path().join(PROBE_DIR).join("notes.txt").exists());
    }

    #[test]
    fn symlinked_or_shared_probe_dir_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), tmp.path().join(PROBE_DIR)).unwrap();
        let e = open_probe_dir(tmp.path(), None).err().unwrap();
        assert_eq!(e.failure, Failure::UnsafeDir);
        std::fs::remove_file(tmp.path().join(PROBE_DIR)).unwrap();
        std::fs::create_dir(tmp.path().join(PROBE_DIR)).unwrap();
        std::fs::set_permissions(
            tmp.path().join(PROBE_DIR),
            std::fs::Permissions::from_mode(0o777),
        )
        .unwrap();
        let e = open_probe_dir(tmp.path(), None).err().unwrap();
        assert_eq!(e.failure, Failure::UnsafeDir);
        assert!(e.to_string().contains("writable"));
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    }

    #[test]
    fn symlinked_data_file_is_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = open_probe_dir(tmp.path(), None).unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, tmp.path().join(PROBE_DIR).join(OVERWRITE_FILE))
            .unwrap();
        let e = run_mode(Mode::Overwrite, &dir, &spec(1), &NoObserver).unwrap_err();
        assert_eq!(e.failure, Failure::Errno(Errno::LOOP));
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    }

    #[test]
    fn symlinked_target_is_refused_and_creation_is_reported() {
        let tmp = tempfile::tempdir().unwrap();
        let link = tmp.path().join("link");
        let real = tmp.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = open_probe_dir(&link, None).err().unwrap();
        assert_eq!(e.failure, Failure::UnsafeDir);
        assert!(e.context.contains("is a symlink"), "{e}");
        assert!(!real.join(PROBE_DIR).exists());
        assert!(open_probe_dir(&real, None).unwrap().created);
        assert!(!open_probe_dir(&real, None).unwrap().created);
    }

    #[test]
    fn missing_target_is_an_errno() {
        let e = open_probe_dir(Path::new("/nonexistent/stallwatch"), None)
            .err()
            .unwrap();
        assert_eq!(e.failure, Failure::Errno(Errno::NOENT));
    }

    #[test]
    fn own_names_and_the_lane_that_owns_them() {
        assert_eq!(owner_of("create.12.3"), Some(Mode::Create));
        assert_eq!(owner_of(OVERWRITE_FILE), Some(Mode::Overwrite));
        assert_eq!(owner_of(DIRECT_FILE), Some(Mode::Direct));
        assert_eq!(owner_of(REPLACE_TEMP), Some(Mode::Replace));
        assert_eq!(owner_of(APPEND_NEXT), Some(Mode::Append));
        assert_eq!(owner_of("create."), None);
        assert_eq!(owner_of("create.x"), None);
        assert_eq!(owner_of("data.db"), None);
    }

    #[test]
    fn append_grows_the_log_and_rotates_it_at_the_cap() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = open_probe_dir(tmp.path(), None).unwrap();
        let log = tmp.path().join(PROBE_DIR).join(APPEND_FILE);
        // 16 KiB cap, 4 KiB appends: four fit, the fifth starts a new log.
        for seq in 1..=4 {
            let l = run_mode(Mode::Append, &dir, &spec(seq), &NoObserver).unwrap();
            assert_eq!(
                l.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
                [Op::Write, Op::Fdatasync]
            );
            assert_eq!(std::fs::metadata(&log).unwrap().len(), 4096 * seq);
        }
        let before = std::fs::metadata(&log).unwrap().ino();
        run_mode(Mode::Append, &dir, &spec(5), &NoObserver).unwrap();
        let after = std::fs::metadata(&log).unwrap();
        assert_eq!(after.len(), 4096, "rotated: a new log with one append");
        assert_ne!(after.ino(), before, "a new file, not a truncated one");
        let names: Vec<String> = std::fs::read_dir(tmp.path().join(PROBE_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, [APPEND_FILE], "the old log is gone");
        assert_eq!(dir.remove_files_of(|m| m == Mode::Append), 1);
    }
}
