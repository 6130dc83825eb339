//! Shared integration-test harness.
//!
//! Used by the test binaries through `mod common;`. Each binary uses a subset of it,
//! hence the module-wide `dead_code` allowance. What a crate does is left to the crate:
//! HTTP to `ureq`, the mount table to `procfs`, the text exposition to `nom-openmetrics`.
//!
//! * [`require_root`]: gate for tests that need root; never lets them pass silently.
//! * [`LoopFs`]: a scratch filesystem on a loop device inside a temporary directory,
//!   with freeze / throttle / shutdown / read-only / unmount / fill helpers and a `Drop`
//!   that undoes all of it (thaw, unthrottle, umount, `losetup -d`, delete) on every
//!   exit path, panics included.
//! * [`Agent`]: the real `stallwatch` binary, started on a temporary config with
//!   `--web.listen-address 127.0.0.1:0`, its log captured, plus an HTTP client.
//! * [`Metrics`]: a parsed Prometheus text exposition with lookups by name and labels.
//! * [`wait_until`]: bounded polling.
//! * [`prom`]: a real Prometheus scraping agents, queried over its API (the fleet test).
//!
//! Ordering advice: declare the `Agent` *after* the `LoopFs` it probes, so the agent is
//! killed first and the filesystem torn down afterwards. Either order is safe: an agent
//! blocked in a frozen filesystem cannot die before the thaw, so `Agent::drop` waits a
//! bounded time and then leaves the reaping to a background thread.
#![allow(dead_code)]

pub mod prom;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nom_openmetrics::MetricDescriptor;
use procfs::process::{MountInfo, Process};
use tempfile::TempDir;

// ---------------------------------------------------------------------------------------
// Root gate
// ---------------------------------------------------------------------------------------

/// Environment variable that turns "needs root" from a failure into an explicit skip.
pub const SKIP_ROOT_ENV: &str = "STALLWATCH_SKIP_ROOT_TESTS";

/// The effective uid of this process.
pub fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Returns true when the test may go on as root. Without root it panics, unless
/// `STALLWATCH_SKIP_ROOT_TESTS=1` is set: then it prints a loud SKIPPED line and returns
/// false (the test must then `return`). Root tests never pass silently.
///
/// ```ignore
/// if !common::require_root("freeze_blocks_create") { return; }
/// ```
pub fn require_root(test: &str) -> bool {
    if euid() == 0 {
        return true;
    }
    if std::env::var(SKIP_ROOT_ENV).as_deref() == Ok("1") {
        eprintln!("**************************************************************");
        eprintln!("SKIPPED (needs root): {test}");
        eprintln!("**************************************************************");
        return false;
    }
    panic!(
        "test `{test}` needs root (loop devices, mount, fsfreeze, blkio throttling); \
         run it as root, or set {SKIP_ROOT_ENV}=1 to skip root tests explicitly"
    );
}

// ---------------------------------------------------------------------------------------
// Commands
// ---------------------------------------------------------------------------------------

/// Default time limit for one external command.
pub const CMD_TIMEOUT_SECS: u64 = 60;

fn describe(prog: &str, args: &[&str]) -> String {
    std::iter::once(prog)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The repository (the crate's manifest directory).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// An executable in PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Finds an executable in PATH, or fails with how to install it.
pub fn tool(name: &str, install: &str) -> PathBuf {
    which(name).unwrap_or_else(|| panic!("`{name}` not found: install it ({install})"))
}

/// Runs `timeout -k 5 SECS prog args...`; returns stdout on success, or an error that
/// names the command, its exit status and its stderr.
pub fn run_cmd_timeout(secs: u64, prog: &str, args: &[&str]) -> Result<String, String> {
    let what = describe(prog, args);
    let out = Command::new("timeout")
        .arg("-k")
        .arg("5")
        .arg(secs.to_string())
        .arg(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("`{what}`: cannot start `timeout`: {e}"))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let why = match out.status.code() {
        Some(124) | Some(137) => format!("timed out after {secs}s"),
        _ => format!("failed ({})", out.status),
    };
    Err(format!(
        "`{what}` {why}; stderr: {:?}; stdout: {:?}",
        stderr.trim(),
        stdout.trim()
    ))
}

/// [`run_cmd_timeout`] with the default limit.
pub fn run_cmd(prog: &str, args: &[&str]) -> Result<String, String> {
    run_cmd_timeout(CMD_TIMEOUT_SECS, prog, args)
}

/// [`run_cmd`], panicking with the command's stderr on failure.
pub fn run(prog: &str, args: &[&str]) -> String {
    run_cmd(prog, args).unwrap_or_else(|e| panic!("{e}"))
}

// ---------------------------------------------------------------------------------------
// Mount table
// ---------------------------------------------------------------------------------------

/// All entries of `/proc/self/mountinfo`, in order (later entries stack on earlier ones).
/// Read by `procfs`, not by stallwatch's own parser: the tests check the agent's mount
/// logic against the kernel. procfs keeps the octal escapes (`\040` for a space) in mount
/// points; no test mounts on such a path.
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

/// True when anything is mounted at `path` or below it.
pub fn any_mount_under(path: &Path) -> bool {
    mountinfo().iter().any(|m| m.mount_point.starts_with(path))
}

/// Output of `losetup -a` (one line per attached loop device, naming its backing file).
pub fn losetup_list() -> String {
    run("losetup", &["-a"])
}

// ---------------------------------------------------------------------------------------
// LoopFs
// ---------------------------------------------------------------------------------------

const BLKIO_WRITE_BPS: &str = "/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device";
const BLKIO_READ_BPS: &str = "/sys/fs/cgroup/blkio/blkio.throttle.read_bps_device";
const FILL_FILE: &str = "stallwatch-test-fill";

/// A scratch filesystem on a loop device, mounted at `TEMPDIR/mnt`.
///
/// Every dangerous operation (freeze, shutdown, fill, remount) first checks in
/// `/proc/self/mountinfo` that the mount point really carries this guard's loop device,
/// so it can never hit the parent filesystem. `Drop` thaws, removes the throttle,
/// unmounts (retries, then `umount -l`), detaches the loop device, unmounts the backing
/// tmpfs (if any) and deletes the temporary directory, in that order.
pub struct LoopFs {
    fstype: String,
    dev: String,
    maj_min: String,
    mnt: PathBuf,
    image: PathBuf,
    root: PathBuf,
    backing: Option<PathBuf>,
    // State, for Drop.
    backing_mounted: bool,
    attached: bool,
    mounted: bool,
    frozen: bool,
    throttled: bool,
    /// A [`ReadThrottle`] was handed out: the drop clears the read limit too.
    read_throttled: bool,
    read_only: bool,
    dir: Option<TempDir>,
}

impl LoopFs {
    /// Sparse image of `size_mib` MiB in a fresh temporary directory, attached with
    /// `losetup -f --show`, formatted (`"xfs"`, `"ext4"` or `"btrfs"`) and mounted.
    /// Note: mkfs.xfs refuses filesystems below 300 MiB; btrfs wants ≳ 128 MiB.
    pub fn new(fstype: &str, size_mib: u64) -> LoopFs {
        let mut fs = LoopFs::blank(fstype);
        let image = fs.root.join("image");
        fs.setup(image, size_mib);
        fs
    }

    /// Like [`LoopFs::new`], but the image file lives on a tmpfs of `tmpfs_mib` MiB that
    /// the guard mounts inside its temporary directory. With an image larger than the
    /// tmpfs (e.g. ext4: 40 MiB image on 24 MiB tmpfs), writeback into the filesystem
    /// fails with EIO once the tmpfs is full. For xfs the tmpfs must hold the zeroed log
    /// (≈ 65 MiB for a 320 MiB image), e.g. 320 MiB image on a 96 MiB tmpfs.
    pub fn on_tmpfs_backing(fstype: &str, image_mib: u64, tmpfs_mib: u64) -> LoopFs {
        let mut fs = LoopFs::blank(fstype);
        let backing = fs.root.join("backing");
        std::fs::create_dir(&backing).expect("mkdir backing");
        let opt = format!("size={tmpfs_mib}M,mode=0700");
        run("mount", &["-t", "tmpfs", "-o", &opt, "tmpfs", p(&backing)]);
        fs.backing_mounted = true;
        fs.backing = Some(backing.clone());
        fs.setup(backing.join("image"), image_mib);
        fs
    }

    fn blank(fstype: &str) -> LoopFs {
        assert!(
            matches!(fstype, "xfs" | "ext4" | "btrfs"),
            "LoopFs: unsupported fstype {fstype:?} (xfs, ext4, btrfs)"
        );
        let dir = tempfile::Builder::new()
            .prefix("stallwatch-loopfs-")
            .tempdir()
            .expect("create tempdir");
        let root = dir.path().to_path_buf();
        LoopFs {
            fstype: fstype.to_string(),
            dev: String::new(),
            maj_min: String::new(),
            mnt: root.join("mnt"),
            image: PathBuf::new(),
            root,
            backing: None,
            backing_mounted: false,
            attached: false,
            mounted: false,
            frozen: false,
            throttled: false,
            read_throttled: false,
            read_only: false,
            dir: Some(dir),
        }
    }

    // Any panic in here drops the half-built guard, which undoes what was done so far.
    fn setup(&mut self, image: PathBuf, size_mib: u64) {
        self.image = image;
        run("truncate", &["-s", &format!("{size_mib}M"), p(&self.image)]);
        let dev = run("losetup", &["-f", "--show", p(&self.image)])
            .trim()
            .to_string();
        assert!(
            dev.starts_with("/dev/loop"),
            "losetup -f --show printed {dev:?}"
        );
        self.dev = dev;
        self.attached = true;
        self.maj_min = run("lsblk", &["-dno", "MAJ:MIN", &self.dev])
            .trim()
            .to_string();
        assert!(
            valid_maj_min(&self.maj_min),
            "lsblk gave MAJ:MIN {:?} for {}",
            self.maj_min,
            self.dev
        );
        match self.fstype.as_str() {
            "xfs" => run("mkfs.xfs", &["-q", "-f", &self.dev]),
            "ext4" => run("mkfs.ext4", &["-q", "-F", &self.dev]),
            "btrfs" => run("mkfs.btrfs", &["-q", "-f", &self.dev]),
            _ => unreachable!(),
        };
        std::fs::create_dir(&self.mnt).expect("mkdir mnt");
        self.mount_again();
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// The loop device, e.g. `/dev/loop3`.
    pub fn dev(&self) -> &str {
        &self.dev
    }

    /// The loop device's `MAJ:MIN` (from `lsblk -no MAJ:MIN`).
    pub fn maj_min(&self) -> String {
        self.maj_min.clone()
    }

    pub fn fstype(&self) -> &str {
        &self.fstype
    }

    /// The backing image file.
    pub fn image(&self) -> &Path {
        &self.image
    }

    /// The guard's temporary directory (holds `mnt/`, the image, `backing/`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn is_mounted(&self) -> bool {
        self.mounted
    }

    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    pub fn is_throttled(&self) -> bool {
        self.throttled
    }

    /// Panics unless our loop device is what is mounted at our mount point right now.
    fn ensure_ours(&self, what: &str) {
        assert!(self.mounted, "LoopFs::{what}: filesystem is not mounted");
        let m = mounted_at(&self.mnt);
        match m {
            Some(ref m) if m.mount_source.as_deref() == Some(self.dev.as_str()) => {}
            other => panic!(
                "LoopFs::{what}: refusing, {} is not the mount of {} (mountinfo: {:?})",
                self.mnt.display(),
                self.dev,
                other
            ),
        }
    }

    /// `fsfreeze -f` the mount: create, write and unlink block until [`LoopFs::thaw`].
    pub fn freeze(&mut self) {
        self.ensure_ours("freeze");
        assert!(!self.frozen, "LoopFs::freeze: already frozen");
        // Set the flag first: if fsfreeze times out it may still have frozen it.
        self.frozen = true;
        run("fsfreeze", &["-f", p(&self.mnt)]);
    }

    /// `fsfreeze -u` the mount.
    pub fn thaw(&mut self) {
        assert!(self.frozen, "LoopFs::thaw: not frozen");
        run("fsfreeze", &["-u", p(&self.mnt)]);
        self.frozen = false;
    }

    /// Limit writes to the loop device to `bps` bytes/s (cgroup-v1 blkio, root cgroup).
    pub fn throttle_write_bps(&mut self, bps: u64) {
        assert!(bps > 0, "use unthrottle() to remove the limit");
        assert!(self.attached);
        self.throttled = true;
        write_blkio(&format!("{} {bps}", self.maj_min)).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Remove the write limit.
    pub fn unthrottle(&mut self) {
        write_blkio(&format!("{} 0", self.maj_min)).unwrap_or_else(|e| panic!("{e}"));
        self.throttled = false;
    }

    /// Limit reads from the loop device to `bps` bytes/s (cgroup-v1 blkio, root cgroup),
    /// until the returned guard is dropped (and, as a backstop, until this `LoopFs` is).
    /// Declare the guard after whatever reads through it (e.g. an [`Agent`] started from
    /// this filesystem): it is dropped first, so the reader is killed and reaped after the
    /// limit is gone, not while its page faults crawl.
    #[must_use = "the limit is removed when the guard is dropped"]
    pub fn throttle_read_bps(&mut self, bps: u64) -> ReadThrottle {
        assert!(bps > 0, "drop the ReadThrottle to remove the limit");
        assert!(self.attached);
        self.read_throttled = true;
        let line = format!("{} {bps}", self.maj_min);
        write_blkio_file(BLKIO_READ_BPS, &line).unwrap_or_else(|e| panic!("{e}"));
        ReadThrottle {
            maj_min: self.maj_min.clone(),
            active: true,
        }
    }

    /// `xfs_io -x -c shutdown`: the filesystem answers EIO from now on (until unmounted).
    pub fn shutdown(&mut self) {
        self.ensure_ours("shutdown");
        assert!(!self.frozen, "LoopFs::shutdown: thaw first");
        run("xfs_io", &["-x", "-c", "shutdown", p(&self.mnt)]);
    }

    /// `mount -o remount,ro`.
    pub fn remount_ro(&mut self) {
        self.ensure_ours("remount_ro");
        assert!(!self.frozen, "LoopFs::remount_ro: thaw first");
        run("mount", &["-o", "remount,ro", p(&self.mnt)]);
        self.read_only = true;
    }

    /// `mount -o remount,rw`.
    pub fn remount_rw(&mut self) {
        self.ensure_ours("remount_rw");
        run("mount", &["-o", "remount,rw", p(&self.mnt)]);
        self.read_only = false;
    }

    /// Unmount: the mount point becomes a plain (empty) directory on the parent
    /// filesystem. Panics if frozen (thaw first) or on failure (e.g. EBUSY).
    pub fn umount(&mut self) {
        self.ensure_ours("umount");
        assert!(!self.frozen, "LoopFs::umount: thaw first");
        run("umount", &[p(&self.mnt)]);
        self.mounted = false;
        self.read_only = false;
    }

    /// Mount the loop device at the mount point again.
    pub fn mount_again(&mut self) {
        assert!(!self.mounted, "LoopFs::mount_again: already mounted");
        assert!(self.attached);
        run("mount", &["-t", &self.fstype, &self.dev, p(&self.mnt)]);
        self.mounted = true;
        self.read_only = false;
        self.ensure_ours("mount_again");
    }

    /// Path of the file [`LoopFs::fill`] writes.
    pub fn fill_path(&self) -> PathBuf {
        self.mnt.join(FILL_FILE)
    }

    /// Fill the filesystem with one file until ENOSPC (`dd` failing is expected), then
    /// `sync -f` the filesystem. Keep such images small.
    pub fn fill(&mut self) {
        self.ensure_ours("fill");
        assert!(!self.frozen, "LoopFs::fill: thaw first");
        let of = format!("of={}", self.fill_path().display());
        // dd ends with ENOSPC, i.e. with a failure status: expected, ignored.
        let _ = run_cmd_timeout(300, "dd", &["if=/dev/zero", &of, "bs=1M"]);
        let _ = run_cmd_timeout(300, "sync", &["-f", p(&self.mnt)]);
    }

    /// Remove the fill file and `sync -f` the filesystem.
    pub fn free_fill(&mut self) {
        self.ensure_ours("free_fill");
        match std::fs::remove_file(self.fill_path()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("LoopFs::free_fill: {e}"),
        }
        run_cmd_timeout(300, "sync", &["-f", p(&self.mnt)]).unwrap_or_else(|e| panic!("{e}"));
    }

    fn cleanup(&mut self) {
        let mut leak = false;
        if self.frozen {
            match run_cmd("fsfreeze", &["-u", p(&self.mnt)]) {
                Ok(_) => self.frozen = false,
                Err(e) => {
                    // EINVAL: it was not frozen after all (e.g. fsfreeze -f timed out).
                    if e.contains("Invalid argument") {
                        self.frozen = false;
                    } else {
                        eprintln!("LoopFs drop: thaw of {} failed: {e}", self.mnt.display());
                    }
                }
            }
        }
        if self.throttled {
            match write_blkio(&format!("{} 0", self.maj_min)) {
                Ok(()) => self.throttled = false,
                Err(e) => eprintln!("LoopFs drop: {e}"),
            }
        }
        if self.read_throttled {
            match write_blkio_file(BLKIO_READ_BPS, &format!("{} 0", self.maj_min)) {
                Ok(()) => self.read_throttled = false,
                Err(e) => eprintln!("LoopFs drop: {e}"),
            }
        }
        if self.frozen {
            // Unmounting or deleting inside a frozen filesystem would hang: leak it.
            eprintln!(
                "LoopFs drop: {} is STILL FROZEN; leaving mount, {} and {} in place",
                self.mnt.display(),
                self.dev,
                self.root.display()
            );
            leak = true;
        } else {
            if self.mounted {
                if umount_retry(&self.mnt, &self.dev) {
                    self.mounted = false;
                } else {
                    leak = true;
                }
            }
            if self.attached && !leak {
                let mut last = String::new();
                for i in 0..10 {
                    match run_cmd("losetup", &["-d", &self.dev]) {
                        Ok(_) => {
                            self.attached = false;
                            break;
                        }
                        Err(e) => last = e,
                    }
                    thread::sleep(Duration::from_millis(100 * (i + 1)));
                }
                if self.attached {
                    eprintln!("LoopFs drop: losetup -d {} failed: {last}", self.dev);
                } else {
                    // `losetup -d` on a device the kernel still holds (btrfs releases its
                    // devices a moment after umount) only marks it for autoclear: wait,
                    // bounded, until the device has really let go of our image.
                    let backing = format!(
                        "/sys/block/{}/loop/backing_file",
                        self.dev.trim_start_matches("/dev/")
                    );
                    let image = self.image.to_string_lossy().into_owned();
                    wait_until(Duration::from_secs(5), Duration::from_millis(20), || {
                        std::fs::read_to_string(&backing)
                            .map(|b| b.trim() != image)
                            .unwrap_or(true)
                    });
                }
            }
            if self.backing_mounted && !leak {
                let backing = self.backing.clone().expect("backing path");
                // The loop device may still hold the image (autoclear after a lazy
                // umount); a lazy umount of the tmpfs is fine then.
                if umount_retry(&backing, "tmpfs") {
                    self.backing_mounted = false;
                } else {
                    leak = true;
                }
            }
        }
        if let Some(dir) = self.dir.take() {
            if leak {
                let kept = dir.keep();
                eprintln!("LoopFs drop: leaked {}", kept.display());
            } else {
                if let Err(e) = dir.close() {
                    eprintln!("LoopFs drop: removing {}: {e}", self.root.display());
                }
            }
        }
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        self.cleanup();
    }
}

impl std::fmt::Debug for LoopFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopFs")
            .field("fstype", &self.fstype)
            .field("dev", &self.dev)
            .field("mnt", &self.mnt)
            .field("mounted", &self.mounted)
            .field("frozen", &self.frozen)
            .field("throttled", &self.throttled)
            .field("read_only", &self.read_only)
            .finish()
    }
}

fn p(path: &Path) -> &str {
    path.to_str().expect("non-UTF-8 path")
}

fn valid_maj_min(s: &str) -> bool {
    match s.split_once(':') {
        Some((a, b)) => {
            !a.is_empty()
                && !b.is_empty()
                && a.bytes().all(|c| c.is_ascii_digit())
                && b.bytes().all(|c| c.is_ascii_digit())
        }
        None => false,
    }
}

fn write_blkio(line: &str) -> Result<(), String> {
    write_blkio_file(BLKIO_WRITE_BPS, line)
}

fn write_blkio_file(file: &str, line: &str) -> Result<(), String> {
    std::fs::write(file, format!("{line}\n"))
        .map_err(|e| format!("writing {line:?} to {file}: {e}"))
}

/// A read limit on a loop device (from [`LoopFs::throttle_read_bps`]); removed on drop.
pub struct ReadThrottle {
    maj_min: String,
    active: bool,
}

impl ReadThrottle {
    /// Remove the limit now.
    pub fn remove(&mut self) {
        if self.active {
            write_blkio_file(BLKIO_READ_BPS, &format!("{} 0", self.maj_min))
                .unwrap_or_else(|e| panic!("{e}"));
            self.active = false;
        }
    }
}

impl Drop for ReadThrottle {
    fn drop(&mut self) {
        if self.active {
            if let Err(e) = write_blkio_file(BLKIO_READ_BPS, &format!("{} 0", self.maj_min)) {
                eprintln!("ReadThrottle drop: {e}");
            }
            self.active = false;
        }
    }
}

/// Unmount `mnt` if `source` is mounted there: a few tries with short sleeps, then
/// `umount -l`. Returns true when it is no longer mounted there.
fn umount_retry(mnt: &Path, source: &str) -> bool {
    let ours = || mounted_at(mnt).is_some_and(|m| m.mount_source.as_deref() == Some(source));
    let mut last = String::new();
    for i in 0..6 {
        if !ours() {
            return true;
        }
        match run_cmd("umount", &[p(mnt)]) {
            Ok(_) => return true,
            Err(e) => last = e,
        }
        thread::sleep(Duration::from_millis(100 * (i + 1)));
    }
    eprintln!(
        "LoopFs drop: umount {} keeps failing ({last}); lazy unmount",
        mnt.display()
    );
    match run_cmd("umount", &["-l", p(mnt)]) {
        Ok(_) => true,
        Err(e) => {
            eprintln!("LoopFs drop: umount -l {} failed: {e}", mnt.display());
            !ours()
        }
    }
}

// ---------------------------------------------------------------------------------------
// Agent
// ---------------------------------------------------------------------------------------

/// Path of the binary under test.
pub const AGENT_BIN: &str = env!("CARGO_BIN_EXE_stallwatch");

/// How long [`Agent::start`] waits for `listening on ADDR`.
pub const AGENT_START_TIMEOUT: Duration = Duration::from_secs(15);

/// An HTTP response as the agent sent it: header names lower-case, the body undecoded
/// (ureq is built without its gzip feature, so a gzip body stays gzip).
#[derive(Debug, Clone)]
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub elapsed: Duration,
}

impl RawResponse {
    /// First header of that name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// ureq settings for talking to the agent: a status is an answer, not an error; no
/// proxy; no `Accept-Encoding` unless a test sends one; IPv4 only, so `localhost` is the
/// 127.0.0.1 the agent listens on.
pub fn client_config() -> ureq::config::ConfigBuilder<ureq::typestate::AgentScope> {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(2)))
        .timeout_global(Some(Duration::from_secs(10)))
        .proxy(None)
        .ip_family(ureq::config::IpFamily::Ipv4Only)
        .accept_encoding(ureq::config::AutoHeaderValue::None)
}

/// A client that opens a new connection for every request (nothing pooled), like a
/// scraper's first request: what is measured includes the agent accepting it.
pub fn fresh_client() -> ureq::Agent {
    client_config().max_idle_connections(0).build().into()
}

/// One request with `client`; Err (naming method and URL) on a transport failure:
/// refused, reset, TLS handshake, timeout.
pub fn request(
    client: &ureq::Agent,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<RawResponse, String> {
    let fail = |e: &dyn std::fmt::Display| format!("{method} {url}: {e}");
    let mut req = ureq::http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(()).map_err(|e| fail(&e))?;
    let start = Instant::now();
    let mut resp = client.run(req).map_err(|e| fail(&e))?;
    let body = resp.body_mut().read_to_vec().map_err(|e| fail(&e))?;
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| {
            let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
            (k.as_str().to_ascii_lowercase(), v)
        })
        .collect();
    Ok(RawResponse {
        status: resp.status().as_u16(),
        headers,
        body,
        elapsed: start.elapsed(),
    })
}

/// The running `stallwatch` binary. Killed (SIGKILL) and reaped on drop.
pub struct Agent {
    child: Option<Child>,
    exited: Option<ExitStatus>,
    pid: u32,
    addr: String,
    logs: Arc<Mutex<Vec<String>>>,
    http: ureq::Agent,
    config_path: PathBuf,
    _dir: TempDir,
}

impl Agent {
    /// Start the agent with `config_yaml` (written to a temp file, passed as `--config`)
    /// and `--web.listen-address 127.0.0.1:0`; waits up to 15 s for `listening on ADDR`.
    pub fn start(config_yaml: &str) -> Agent {
        Agent::start_with_args(config_yaml, &[])
    }

    /// Like [`Agent::start`], with extra command-line arguments. An extra
    /// `--web.listen-address` or `--config` replaces the harness's own.
    pub fn start_with_args(config_yaml: &str, extra_args: &[&str]) -> Agent {
        Agent::start_bin(Path::new(AGENT_BIN), config_yaml, extra_args)
    }

    /// Like [`Agent::start_with_args`], running the binary at `bin` (e.g. a copy of
    /// [`AGENT_BIN`] on a test filesystem).
    pub fn start_bin(bin: &Path, config_yaml: &str, extra_args: &[&str]) -> Agent {
        Agent::start_cmd(Command::new(bin), config_yaml, extra_args)
    }

    /// Like [`Agent::start_with_args`], with `cmd` as the start of the command line: a
    /// program and its leading arguments (e.g. `systemd-socket-activate -l ADDR BIN`),
    /// perhaps a `pre_exec`. `--config` (and, unless `--web.systemd-socket` or
    /// `--web.listen-address` is among `extra_args`, `--web.listen-address 127.0.0.1:0`)
    /// and `extra_args` follow.
    pub fn start_cmd(mut cmd: Command, config_yaml: &str, extra_args: &[&str]) -> Agent {
        let dir = tempfile::Builder::new()
            .prefix("stallwatch-agent-")
            .tempdir()
            .expect("create tempdir");
        let config_path = dir.path().join("config.yaml");
        std::fs::write(&config_path, config_yaml).expect("write config");

        let has = |flag: &str| {
            extra_args
                .iter()
                .any(|a| *a == flag || a.starts_with(&format!("{flag}=")))
        };
        if !has("--config") {
            cmd.arg("--config").arg(&config_path);
        }
        if !has("--web.listen-address") && !has("--web.systemd-socket") {
            cmd.arg("--web.listen-address").arg("127.0.0.1:0");
        }
        cmd.args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        eprintln!("[harness] starting {cmd:?}");
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let pid = child.id();

        let logs = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("stderr pipe");
        let stdout = child.stdout.take().expect("stdout pipe");
        spawn_log_reader(stderr, "[agent] ", logs.clone());
        spawn_log_reader(stdout, "[agent:stdout] ", logs.clone());

        let mut agent = Agent {
            child: Some(child),
            exited: None,
            pid,
            addr: String::new(),
            logs,
            http: client_config().build().into(),
            config_path,
            _dir: dir,
        };

        let deadline = Instant::now() + AGENT_START_TIMEOUT;
        loop {
            if let Some(addr) = agent.logs().iter().find_map(|l| parse_listening(l)) {
                agent.addr = addr;
                break;
            }
            if let Some(status) = agent.try_wait() {
                // Give the readers a moment to collect the last lines.
                thread::sleep(Duration::from_millis(200));
                panic!(
                    "agent exited ({status}) before logging `listening on`; log:\n{}",
                    agent.logs().join("\n")
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "agent did not log `listening on ADDR` within {AGENT_START_TIMEOUT:?}; log:\n{}",
                    agent.logs().join("\n")
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
        agent
    }

    /// The bound address, e.g. `127.0.0.1:40111`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `http://ADDR{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// GET with optional request headers on a pooled connection; non-2xx statuses are
    /// responses, not errors. Err on transport failure (refused, timeout). Body as text
    /// (lossy UTF-8).
    pub fn try_get_with(
        &self,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<(u16, String, Duration), String> {
        let r = request(&self.http, "GET", &self.url(path), headers)?;
        Ok((r.status, r.text(), r.elapsed))
    }

    /// GET; Err on transport failure.
    pub fn try_get(&self, path: &str) -> Result<(u16, String, Duration), String> {
        self.try_get_with(path, &[])
    }

    /// GET → (status, body, elapsed). Panics on transport failure, with the agent's log.
    pub fn get(&self, path: &str) -> (u16, String, Duration) {
        self.try_get(path).unwrap_or_else(|e| {
            panic!("{e}; agent log tail:\n{}", self.log_tail(40));
        })
    }

    /// GET on a new connection: headers exactly as the agent sent them, body undecoded
    /// (e.g. still gzip). For checking `Content-Encoding` and friends.
    pub fn get_raw(&self, path: &str, headers: &[(&str, &str)]) -> Result<RawResponse, String> {
        request(&fresh_client(), "GET", &self.url(path), headers)
    }

    /// GET /metrics, expect 200, parse.
    pub fn scrape(&self) -> Metrics {
        self.scrape_path("/metrics")
    }

    /// GET `path` (a custom `telemetry_path`), expect 200, parse.
    pub fn scrape_path(&self, path: &str) -> Metrics {
        let (status, body, _) = self.get(path);
        assert_eq!(status, 200, "GET {path}: status {status}, body:\n{body}");
        Metrics::parse(&body).unwrap_or_else(|e| panic!("GET {path}: {e}\nbody:\n{body}"))
    }

    /// All log lines so far (stderr and stdout, ANSI colours stripped).
    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    /// The last `n` log lines, joined.
    pub fn log_tail(&self, n: usize) -> String {
        let logs = self.logs.lock().unwrap();
        let from = logs.len().saturating_sub(n);
        logs[from..].join("\n")
    }

    /// Waits up to 10 s until `stallwatch_target_up{target}` is 1.
    pub fn wait_up(&self, target: &str) -> bool {
        wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
            self.try_get("/metrics")
                .ok()
                .and_then(|(_, body, _)| Metrics::parse(&body).ok())
                .and_then(|m| m.get("stallwatch_target_up", &[("target", target)]))
                == Some(1.0)
        })
    }

    /// Wait up to `timeout` for a log line containing `substr`.
    pub fn wait_log(&self, substr: &str, timeout: Duration) -> bool {
        wait_until(timeout, Duration::from_millis(20), || {
            self.logs.lock().unwrap().iter().any(|l| l.contains(substr))
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// `Threads:` of /proc/PID/status.
    pub fn thread_count(&self) -> usize {
        let status = Process::new(self.pid as i32)
            .and_then(|p| p.status())
            .unwrap_or_else(|e| panic!("read /proc/{}/status: {e}", self.pid));
        status.threads as usize
    }

    fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(st)) = child.try_wait() {
                    self.exited = Some(st);
                }
            }
        }
        self.exited
    }

    /// True while the child has not exited.
    pub fn is_running(&mut self) -> bool {
        self.try_wait().is_none()
    }

    /// `kill -s SIG PID` to our own child (e.g. `"TERM"`, `"INT"`, `"HUP"`). Returns
    /// false, sending nothing, when the child already exited (it is reaped here, so its
    /// pid can never have been reused while we hold it unreaped).
    pub fn signal(&mut self, sig: &str) -> bool {
        if self.try_wait().is_some() {
            return false;
        }
        run("kill", &["-s", sig, &self.pid.to_string()]);
        true
    }

    /// Wait up to `timeout` for the child to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_wait() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.try_wait().is_some() {
            return;
        }
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = child.kill(); // SIGKILL; the child is unreaped, so the pid is ours.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        // Blocked in the kernel (e.g. a frozen filesystem): it dies at the thaw.
        eprintln!(
            "[harness] agent pid {} survives SIGKILL (blocked in the kernel?); reaping in background",
            self.pid
        );
        thread::spawn(move || {
            let _ = child.wait();
        });
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            // CSI: parameters and intermediates, then a final byte in @..~
            for c2 in chars.by_ref() {
                if ('@'..='~').contains(&c2) {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn spawn_log_reader(
    pipe: impl Read + Send + 'static,
    prefix: &'static str,
    logs: Arc<Mutex<Vec<String>>>,
) {
    thread::spawn(move || {
        let mut r = BufReader::new(pipe);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf);
                    let line = strip_ansi(line.trim_end_matches(['\n', '\r']));
                    eprintln!("{prefix}{line}");
                    logs.lock().unwrap().push(line);
                }
            }
        }
    });
}

/// Address token after `listening on ` in a log line (plain, logfmt or JSON): ends at
/// whitespace or a double quote; an `http://` prefix and trailing `,`/`.` are dropped.
pub fn parse_listening(line: &str) -> Option<String> {
    let idx = line.find("listening on ")?;
    let rest = &line[idx + "listening on ".len()..];
    let tok: String = rest
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != '"' && *c != '\\')
        .collect();
    let tok = tok.strip_prefix("http://").unwrap_or(&tok);
    let tok = tok.trim_end_matches([',', '.', '/']);
    if tok.is_empty() || !tok.contains(':') {
        return None;
    }
    Some(tok.to_string())
}

// ---------------------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------------------

/// One sample line, labels unescaped.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A Prometheus text exposition (format 0.0.4), parsed by `nom-openmetrics`, with the
/// lookups the tests use.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// The text as received.
    pub text: String,
    samples: Vec<Sample>,
    types: BTreeMap<String, String>,
    helps: BTreeMap<String, String>,
}

impl Metrics {
    /// Parse; Err names the offending line.
    pub fn parse(text: &str) -> Result<Metrics, String> {
        let mut m = Metrics {
            text: text.to_string(),
            ..Default::default()
        };
        // Family by family (the crate's streaming entry point), so that an error can say
        // where parsing stopped.
        let mut rest = text;
        while !rest.is_empty() {
            let line = text[..text.len() - rest.len()].matches('\n').count() + 1;
            let Ok((next, family)) = nom_openmetrics::parser::family(rest) else {
                let bad = rest.lines().next().unwrap_or_default();
                return Err(format!(
                    "line {line}: not a HELP, TYPE or sample line: {bad:?}"
                ));
            };
            rest = next;
            for d in &family.descriptors {
                match d {
                    MetricDescriptor::Help { metric, help } => {
                        m.helps.insert(metric.to_string(), help.clone());
                    }
                    MetricDescriptor::Type { metric, r#type } => {
                        let t = match r#type {
                            nom_openmetrics::MetricType::Unknown(t) => t.to_string(),
                            known => known.to_string().to_ascii_lowercase(),
                        };
                        m.types.insert(metric.to_string(), t);
                    }
                    MetricDescriptor::Unit { .. } => {}
                }
            }
            // One descriptor or sample per line, so the sample's line is counted on.
            let first_sample = line + family.descriptors.len();
            for (i, s) in family.samples.iter().enumerate() {
                let mut labels = BTreeMap::new();
                for l in s.labels() {
                    // The crate takes a repeated label name; the format forbids it.
                    if labels.insert(l.name.to_string(), l.value.clone()).is_some() {
                        return Err(format!(
                            "line {}: duplicate label {} in {}",
                            first_sample + i,
                            l.name,
                            s.name()
                        ));
                    }
                }
                m.samples.push(Sample {
                    name: s.name().to_string(),
                    labels,
                    value: s.number(),
                });
            }
        }
        Ok(m)
    }

    /// All samples, in exposition order.
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// Value of the one series named exactly `name` whose labels include `labels`.
    /// None when there is none; panics when several match (use `sum` or `series`).
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let found: Vec<&Sample> = self.matching(name, labels).collect();
        match found.len() {
            0 => None,
            1 => Some(found[0].value),
            _ => panic!(
                "Metrics::get({name}, {labels:?}) is ambiguous, {} series match: {:?}",
                found.len(),
                found.iter().map(|s| &s.labels).collect::<Vec<_>>()
            ),
        }
    }

    /// Sum over all series named `name` whose labels include `labels` (0 when none).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    /// How many series named `name` have labels including `labels`.
    pub fn count(&self, name: &str, labels: &[(&str, &str)]) -> usize {
        self.matching(name, labels).count()
    }

    /// All series named exactly `name`.
    pub fn series(&self, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .map(|s| (s.labels.clone(), s.value))
            .collect()
    }

    /// True when a sample named exactly `name` exists, or a `# TYPE` declares the
    /// family `name` (e.g. a histogram's base name) and it has samples.
    pub fn has(&self, name: &str) -> bool {
        if self.samples.iter().any(|s| s.name == name) {
            return true;
        }
        self.types.contains_key(name)
            && self.samples.iter().any(|s| {
                s.name.strip_prefix(name).is_some_and(|suf| {
                    ["_bucket", "_sum", "_count", "_total", "_created"].contains(&suf)
                })
            })
    }

    /// `# TYPE` of a family.
    pub fn type_of(&self, family: &str) -> Option<&str> {
        self.types.get(family).map(String::as_str)
    }

    /// `# HELP` of a family (unescaped).
    pub fn help(&self, family: &str) -> Option<&str> {
        self.helps.get(family).map(String::as_str)
    }

    /// Distinct sample names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.samples.iter().map(|s| s.name.clone()).collect();
        v.sort();
        v.dedup();
        v
    }
}

// ---------------------------------------------------------------------------------------
// Polling
// ---------------------------------------------------------------------------------------

/// Poll `f` every `poll` until it returns true (→ true) or `timeout` passes (→ false;
/// `f` is evaluated one last time at the deadline).
pub fn wait_until(timeout: Duration, poll: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        thread::sleep(poll.min(deadline - now));
    }
}

// ---------------------------------------------------------------------------------------
// Load
// ---------------------------------------------------------------------------------------

/// How [`random_writer`] starts writeback of what it dirtied, without waiting for it.
#[derive(Clone, Copy, Debug)]
pub enum Kick {
    /// `posix_fadvise(POSIX_FADV_DONTNEED)` over the whole file.
    FadviseDontneed,
    /// `sync_file_range(SYNC_FILE_RANGE_WRITE)` over the whole file.
    SyncFileRange,
}

/// The fsync-tester load: random 4 KiB buffered writes into a 64 MiB file at `path`,
/// starting writeback (`kick`) every 2 MiB so the device queue stays full. Bounded:
/// at most `writes` writes and `limit` of time; stops early when `stop` is set.
pub fn random_writer(
    path: &Path,
    stop: Arc<AtomicBool>,
    writes: u64,
    limit: Duration,
    kick: Kick,
) -> thread::JoinHandle<()> {
    use std::os::fd::{AsFd, AsRawFd};
    let path = path.to_owned();
    thread::spawn(move || {
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(64 << 20).unwrap();
        let buf = vec![0x5au8; 4096];
        let t0 = Instant::now();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for i in 0..writes {
            if stop.load(Ordering::Relaxed) || t0.elapsed() > limit {
                break;
            }
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let off = (x % (16384 - 1)) * 4096;
            nix::sys::uio::pwrite(f.as_fd(), &buf, off as i64).unwrap();
            if i % 512 == 511 {
                match kick {
                    Kick::FadviseDontneed => nix::fcntl::posix_fadvise(
                        f.as_fd(),
                        0,
                        0,
                        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
                    )
                    .unwrap(),
                    // SAFETY: a plain syscall on a descriptor we own.
                    Kick::SyncFileRange => unsafe {
                        nix::libc::sync_file_range(
                            f.as_raw_fd(),
                            0,
                            0,
                            nix::libc::SYNC_FILE_RANGE_WRITE,
                        );
                    },
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
    })
}
