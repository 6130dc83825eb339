//! A scratch filesystem on a loop device, and the blkio throttles on that device.

use std::path::{Path, PathBuf};
use std::thread;
use std::time::Duration;

use tempfile::TempDir;

use super::cmd::{run, run_cmd, run_cmd_timeout};
use super::mounts::mounted_at;
use super::wait::wait_until;

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
    /// Declare the guard after whatever reads through it (e.g. an
    /// [`Agent`](super::agent::Agent) started from this filesystem): it is dropped first,
    /// so the reader is killed and reaped after the limit is gone, not while its page
    /// faults crawl.
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

    /// `mount -o remount,ro`. The kernel refuses it ("mount point is busy") while a file
    /// is open for writing, as a probe's file is for a moment each cycle: retried for up
    /// to 5 s.
    pub fn remount_ro(&mut self) {
        self.ensure_ours("remount_ro");
        assert!(!self.frozen, "LoopFs::remount_ro: thaw first");
        let mut last = String::new();
        let done = wait_until(
            Duration::from_secs(5),
            Duration::from_millis(50),
            || match run_cmd("mount", &["-o", "remount,ro", p(&self.mnt)]) {
                Ok(_) => true,
                Err(e) => {
                    last = e;
                    false
                }
            },
        );
        assert!(done, "remount read-only for 5 s: {last}");
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
