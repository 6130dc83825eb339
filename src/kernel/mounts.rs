//! Which mount a target path is on: parse mountinfo (pure) and decide whether the path is
//! still the root of the mount it should be.
//!
//! The decision uses the mount table, not `st_dev`: on btrfs a subvolume's `st_dev` is an
//! anonymous device that never appears in mountinfo, so comparing device numbers would call
//! every btrfs mount "not mounted".

use std::collections::HashMap;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use procfs::process::{MountInfo, MountInfos};
use procfs::FromBufRead;

/// Mountinfo could not be read or parsed.
#[derive(Debug, thiserror::Error)]
pub enum MountsError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: malformed mountinfo: {message}")]
    Parse { path: PathBuf, message: String },
}

/// What matters about a mount for labelling and for noticing that it changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The kernel's mount id, comparable with statx `STATX_MNT_ID` of an open descriptor.
    pub mount_id: u64,
    pub mount_point: PathBuf,
    /// `major:minor` as mountinfo gives it.
    pub maj_min: String,
    pub fstype: String,
    /// The mount source, e.g. `/dev/md0`; `none` when the kernel gives none.
    pub source: String,
    /// Per-mount options (`rw,relatime`), sorted.
    pub mount_options: String,
    /// Superblock options (`rw,attr2,inode64,nobarrier`), sorted.
    pub super_options: String,
}

impl Mount {
    fn from_info(m: &MountInfo) -> Mount {
        Mount {
            mount_id: m.mnt_id as u64,
            mount_point: m.mount_point.clone(),
            maj_min: m.majmin.clone(),
            fstype: m.fs_type.clone(),
            source: m.mount_source.clone().unwrap_or_else(|| "none".to_owned()),
            mount_options: join_options(&m.mount_options),
            super_options: join_options(&m.super_options),
        }
    }

    /// Mount and superblock options together, without duplicates, for the info label.
    pub fn options(&self) -> String {
        let mut all: Vec<&str> = self
            .mount_options
            .split(',')
            .chain(self.super_options.split(','))
            .filter(|s| !s.is_empty())
            .collect();
        all.sort_unstable();
        all.dedup();
        all.join(",")
    }

    /// True when the mount or its superblock is read-only (`ro`, or ext4's `emergency_ro`
    /// after an error shut the filesystem down).
    pub fn read_only(&self) -> bool {
        let has = |opts: &str, o: &str| opts.split(',').any(|x| x == o);
        has(&self.mount_options, "ro")
            || has(&self.super_options, "ro")
            || has(&self.super_options, "emergency_ro")
    }

    /// The same filesystem, even if remounted with other options.
    pub fn same_filesystem(&self, other: &Mount) -> bool {
        self.maj_min == other.maj_min && self.fstype == other.fstype && self.source == other.source
    }
}

fn join_options(map: &HashMap<String, Option<String>>) -> String {
    let mut v: Vec<String> = map
        .iter()
        .map(|(k, v)| match v {
            Some(v) => format!("{k}={v}"),
            None => k.clone(),
        })
        .collect();
    v.sort_unstable();
    v.join(",")
}

/// Parses the text of `/proc/PID/mountinfo`. `path` only names the source in errors.
pub fn parse_mountinfo(text: &str, path: &Path) -> Result<Vec<Mount>, MountsError> {
    // procfs panics on nothing, but it accepts an empty file; a mount table without a
    // root mount is not one we can judge paths against.
    let infos = MountInfos::from_buf_read(BufReader::new(text.as_bytes())).map_err(|e| {
        MountsError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        }
    })?;
    let mounts: Vec<Mount> = infos.0.iter().map(Mount::from_info).collect();
    if mounts.is_empty() {
        return Err(MountsError::Parse {
            path: path.to_owned(),
            message: "no mounts".to_owned(),
        });
    }
    Ok(mounts)
}

/// This process's mount table, re-read only when the kernel says it changed: mountinfo
/// signals `POLLPRI` on an open descriptor after any mount, unmount or remount in the
/// namespace, so a cycle costs one `poll` instead of reading and parsing the table.
pub struct MountTable {
    path: PathBuf,
    file: Option<std::fs::File>,
    mounts: Vec<Mount>,
    generation: u64,
}

impl MountTable {
    /// A table read from `PROC/self/mountinfo` on first use.
    pub fn new(proc_root: &Path) -> MountTable {
        MountTable {
            path: proc_root.join("self/mountinfo"),
            file: None,
            mounts: Vec::new(),
            generation: 0,
        }
    }

    /// The table as last read, without asking the kernel.
    pub fn cached(&self) -> &[Mount] {
        &self.mounts
    }

    /// Increments each time the table is read anew: what depends on the mounts (a
    /// resolved path) can be kept until it changes.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The current mounts. A read error drops the descriptor so the next call starts over.
    pub fn current(&mut self) -> Result<&[Mount], MountsError> {
        use std::io::{Read, Seek};
        let changed = match &self.file {
            None => true,
            // Changed, or the kernel cannot be asked: re-read to be safe.
            Some(f) => poll_changed(f).unwrap_or(true),
        };
        if !changed {
            return Ok(&self.mounts);
        }
        let read = |file: &mut Option<std::fs::File>| -> std::io::Result<String> {
            let f = match file {
                Some(f) => {
                    f.rewind()?;
                    f
                }
                None => file.insert(std::fs::File::open(&self.path)?),
            };
            let mut text = String::with_capacity(8192);
            f.read_to_string(&mut text)?;
            Ok(text)
        };
        let text = read(&mut self.file).map_err(|source| {
            self.file = None;
            MountsError::Read {
                path: self.path.clone(),
                source,
            }
        })?;
        match parse_mountinfo(&text, &self.path) {
            Ok(m) => {
                self.mounts = m;
                self.generation += 1;
                Ok(&self.mounts)
            }
            Err(e) => {
                self.file = None;
                Err(e)
            }
        }
    }
}

/// Whether the mounts changed since this descriptor of `mountinfo` was last polled: the
/// kernel marks each open file POLLERR|POLLPRI at a change of the mount namespace and
/// clears the mark at the poll that reports it. Does not wait.
fn poll_changed(f: &std::fs::File) -> rustix::io::Result<bool> {
    let mut fds = [rustix::event::PollFd::new(f, rustix::event::PollFlags::PRI)];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&zero)).map(|n| n != 0)
}

/// One thread's own descriptor of `PROC/self/mountinfo`, polled without a lock: the kernel
/// keeps the "changed" mark per open file and clears it at the poll that reports it, so a
/// shared descriptor would tell only one of its pollers. A thread that hears of a change
/// from its own asks the shared [`MountTable`], whose descriptor is polled and read under
/// its lock.
pub struct MountWatch {
    path: PathBuf,
    file: Option<std::fs::File>,
}

impl MountWatch {
    /// A watch on `PROC/self/mountinfo`, opened on first use.
    pub fn new(proc_root: &Path) -> MountWatch {
        MountWatch {
            path: proc_root.join("self/mountinfo"),
            file: None,
        }
    }

    /// False while the mounts are the same as at the last call; true when they changed,
    /// at the first call (the descriptor is opened then: changes from there on are
    /// seen), and whenever the kernel cannot be asked.
    pub fn changed(&mut self) -> bool {
        let Some(f) = &self.file else {
            self.file = std::fs::File::open(&self.path).ok();
            return true;
        };
        match poll_changed(f) {
            Ok(changed) => changed,
            // An error: open anew next time.
            Err(_) => {
                self.file = None;
                true
            }
        }
    }
}

/// The mount that `path` (absolute, symlinks resolved) lives on: the entry with the
/// longest mount point that contains it, the last such entry when mounts are stacked.
pub fn mount_of<'a>(mounts: &'a [Mount], path: &Path) -> Option<&'a Mount> {
    let mut best: Option<&Mount> = None;
    for m in mounts {
        if path.starts_with(&m.mount_point) {
            let longer = best
                .map(|b| m.mount_point.as_os_str().len() >= b.mount_point.as_os_str().len())
                .unwrap_or(true);
            if longer {
                best = Some(m);
            }
        }
    }
    best
}

/// The mount whose root is exactly `path`, if the topmost mount at that path is there.
pub fn mount_at<'a>(mounts: &'a [Mount], path: &Path) -> Option<&'a Mount> {
    mount_of(mounts, path).filter(|m| m.mount_point == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/proc")
            .join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn real_mountinfo_with_loop_xfs_ext4_btrfs() {
        let text = fixture("mountinfo");
        let mounts = parse_mountinfo(&text, Path::new("mountinfo")).unwrap();
        let root = mount_of(&mounts, Path::new("/etc/hostname")).unwrap();
        assert_eq!(root.mount_point, PathBuf::from("/"));
        // The fixture holds a loop XFS mounted with a space in its path (octal-escaped).
        let xfs = mounts.iter().find(|m| m.fstype == "xfs").unwrap();
        assert!(xfs.source.starts_with("/dev/loop"), "{xfs:?}");
        assert!(mount_at(&mounts, &xfs.mount_point).is_some());
        assert!(mount_at(&mounts, &xfs.mount_point.join("sub")).is_none());
        assert_eq!(
            mount_of(&mounts, &xfs.mount_point.join("sub/dir")).unwrap(),
            xfs
        );
        let btrfs = mounts.iter().find(|m| m.fstype == "btrfs").unwrap();
        assert!(mount_at(&mounts, &btrfs.mount_point).is_some());
    }

    #[test]
    fn stacked_mounts_topmost_wins_and_options() {
        let text = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
30 22 8:16 / /srv/raid0 rw,relatime shared:2 - xfs /dev/md0 rw,attr2,inode64,nobarrier
31 30 8:32 / /srv/raid0 ro,relatime shared:3 - ext4 /dev/sdc rw,emergency_ro
";
        let mounts = parse_mountinfo(text, Path::new("t")).unwrap();
        let m = mount_at(&mounts, Path::new("/srv/raid0")).unwrap();
        assert_eq!(m.source, "/dev/sdc");
        assert!(m.read_only());
        assert!(!mounts[1].read_only());
        assert!(mounts[1].options().contains("nobarrier"));
        assert!(mount_at(&mounts, Path::new("/srv")).is_none());
        assert!(!mounts[1].same_filesystem(m));
        // A prefix of a name is not a parent directory.
        assert_eq!(
            mount_of(&mounts, Path::new("/srv/raid01"))
                .unwrap()
                .mount_point,
            PathBuf::from("/")
        );
    }

    #[test]
    fn mount_table_reads_once_until_the_kernel_signals_a_change() {
        let mut t = MountTable::new(Path::new("/proc"));
        let first = t.current().unwrap().to_vec();
        assert!(mount_of(&first, Path::new("/")).is_some());
        assert_eq!(t.current().unwrap(), &first[..]);
        let mut missing = MountTable::new(Path::new("/nonexistent"));
        assert!(missing.current().is_err());
    }

    #[test]
    fn malformed_mountinfo_is_an_error_not_a_panic() {
        for bad in [
            "",
            "garbage",
            "22 1 8:1 /",
            "x y z - ext4\n",
            "22 1 8:1 / / rw shared:1 ext4 /dev/sda1 rw\n",
        ] {
            assert!(
                parse_mountinfo(bad, Path::new("bad")).is_err(),
                "{bad:?} was accepted"
            );
        }
    }

    #[test]
    fn a_watch_says_changed_first_then_only_when_the_kernel_says_so() {
        let dir = tempfile::tempdir().unwrap();
        // A regular file never signals POLLPRI: after the first call, nothing changed.
        std::fs::create_dir(dir.path().join("self")).unwrap();
        std::fs::write(dir.path().join("self/mountinfo"), "").unwrap();
        let mut w = MountWatch::new(dir.path());
        assert!(w.changed(), "the first call: the table has to be read");
        assert!(!w.changed());
        assert!(!w.changed());
        // Nothing to watch: every call says changed, so the table is always asked.
        let mut missing = MountWatch::new(&dir.path().join("nowhere"));
        assert!(missing.changed());
        assert!(missing.changed());
    }
}
