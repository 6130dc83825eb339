//! Block devices beneath a filesystem, from sysfs: which disk, loop file, md arrays and member
//! disks lie under a major:minor, the sync state of md arrays and the requests in flight.
//!
//! Every function takes the sysfs root (`/sys` in production, a fixture tree in tests), and
//! each file format has its own `parse_*` function on `&str`, kept apart from the reading.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use strum::VariantArray as _;
use thiserror::Error;

pub use crate::kernel::kernfs::ParseError;
use crate::kernel::kernfs::{self, read_parse, read_parse_optional, ReadError};

/// A block device and what it sits on, as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockDevice {
    /// Kernel name of the device itself: `sda1`, `loop3`, `md0p1`, `dm-0`.
    pub name: String,
    /// The whole disk holding it: `sda` for `sda1`, `md0` for `md0p1`, itself for a disk.
    pub disk: String,
    /// The file behind a loop device, as the kernel prints it (may end in ` (deleted)`).
    pub loop_backing_file: Option<PathBuf>,
    /// md arrays this device is, or sits on through stacked devices, top first.
    pub md_arrays: Vec<String>,
    /// The leaf devices beneath it, following `slaves/` down: `sdb1`, `sdc1` for a RAID1 md0.
    /// Empty for a device that sits directly on hardware (or a file).
    pub slaves: Vec<String>,
}

/// What an md array's sync thread is doing (`md/sync_action`); the strings are the
/// kernel's spelling, also used as label values.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::Display,
    strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
pub enum SyncAction {
    Idle,
    Resync,
    Recover,
    Check,
    Repair,
    Frozen,
    Reshape,
}

impl SyncAction {
    /// Every action, for metrics that export one series per possible value: strum's
    /// variant list as an array, so call sites iterate values, not references.
    pub const ALL: [SyncAction; Self::VARIANTS.len()] = match Self::VARIANTS.first_chunk() {
        Some(all) => *all,
        None => unreachable!(),
    };

    /// The kernel's spelling, also used as label value.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// State of an md array (`md/array_state`), as listed in the kernel's md.rst; the kernel
/// spells the two-word states with a hyphen (`read-auto`, `write-pending`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::Display,
    strum::VariantArray,
)]
#[strum(serialize_all = "kebab-case")]
pub enum ArrayState {
    Clear,
    Inactive,
    Suspended,
    Readonly,
    ReadAuto,
    Clean,
    Active,
    WritePending,
    ActiveIdle,
    Broken,
}

impl ArrayState {
    /// The kernel's spelling.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Whether a personality is running, so the level's sync files should exist.
    fn is_running(self) -> bool {
        !matches!(self, ArrayState::Clear | ArrayState::Inactive)
    }
}

/// Sync state of one md array, read from `SYS/block/mdX/md/`.
#[derive(Debug, Clone, PartialEq)]
pub struct MdState {
    /// The array's kernel name, `md0`.
    pub name: String,
    /// `raid1`, `raid5`, `raid0`, `linear`…; empty for an array without a level yet.
    pub level: String,
    /// Member slots; during a reshape the new count. 0 when the kernel has none yet.
    pub raid_disks: u32,
    pub array_state: ArrayState,
    /// None where the kernel has no sync thread: raid0, linear, arrays not running.
    pub sync_action: Option<SyncAction>,
    /// Sectors done and to do of the running sync; None when idle or delayed.
    pub sync_completed: Option<(u64, u64)>,
    /// `sync_completed` as a fraction in 0..=1.
    pub sync_fraction: Option<f64>,
    /// Missing members; None on levels without redundancy.
    pub degraded: Option<u32>,
}

/// Failure to find or read a block device in sysfs.
#[derive(Debug, Error)]
pub enum BlockdevError {
    /// Major 0 is the kernel's anonymous device space: tmpfs, overlay, NFS, btrfs subvolumes.
    #[error("device {major}:{minor} is anonymous (tmpfs, overlay, network fs, btrfs subvolume): no block device behind it")]
    NoBlockDevice { major: u32, minor: u32 },
    /// A device name that cannot be a single sysfs entry (empty, `.`, `..`, contains `/`).
    #[error("invalid block device name {name:?}")]
    InvalidName { name: String },
    /// A sysfs file that could not be read or parsed; names the file.
    #[error(transparent)]
    Read(#[from] ReadError),
}

/// Finds the block device of a filesystem's `st_dev` (or mountinfo major:minor) through
/// `SYS/dev/block/MAJ:MIN`, with its disk, loop backing file, md arrays and leaf devices.
pub fn resolve(sys_root: &Path, major: u32, minor: u32) -> Result<BlockDevice, BlockdevError> {
    if major == 0 {
        return Err(BlockdevError::NoBlockDevice { major, minor });
    }
    let link = sys_root.join("dev/block").join(format!("{major}:{minor}"));
    let dir = fs::canonicalize(&link).map_err(io_error(&link))?;
    let name = file_name(&dir);
    let disk_dir = whole_disk(&dir);
    let disk = file_name(&disk_dir);

    let loop_backing_file =
        read_parse_optional(&disk_dir.join("loop/backing_file"), parse_backing_file)?;

    let mut below = Below::default();
    below.walk(&disk_dir)?;
    below.slaves.sort();
    below.slaves.dedup();

    Ok(BlockDevice {
        name,
        disk,
        loop_backing_file,
        md_arrays: below.md_arrays,
        slaves: below.slaves,
    })
}

/// Reads the level, state and sync progress of md array `md` (`md0`, not `md0p1`).
///
/// The sync files exist only for levels with redundancy while the array runs; there they are
/// required, so a missing `sync_action` on a running RAID1 is an error, on RAID0 it is None.
pub fn md_state(sys_root: &Path, md: &str) -> Result<MdState, BlockdevError> {
    check_name(md)?;
    let dir = sys_root.join("block").join(md).join("md");
    let level = read_parse(&dir.join("level"), parse_level)?;
    let raid_disks = read_parse(&dir.join("raid_disks"), parse_raid_disks)?;
    let array_state = read_parse(&dir.join("array_state"), parse_array_state)?;

    let required = is_redundant(&level) && array_state.is_running();
    let sync_action = read_sync_file(&dir.join("sync_action"), required, parse_sync_action)?;
    let sync_completed =
        read_sync_file(&dir.join("sync_completed"), required, parse_sync_completed)?.flatten();
    let degraded = read_sync_file(&dir.join("degraded"), required, parse_degraded)?;

    Ok(MdState {
        name: md.to_owned(),
        level,
        raid_disks,
        array_state,
        sync_action,
        sync_completed,
        sync_fraction: sync_completed.and_then(sync_fraction),
        degraded,
    })
}

/// Reads the requests in flight `(reads, writes)` of a disk, partition or md array.
pub fn inflight(sys_root: &Path, name: &str) -> Result<(u64, u64), BlockdevError> {
    Ok(read_parse(&inflight_path(sys_root, name)?, parse_inflight)?)
}

/// The `inflight` file of block device `name`, for a reader that keeps it open.
pub fn inflight_path(sys_root: &Path, name: &str) -> Result<PathBuf, BlockdevError> {
    check_name(name)?;
    // SYS/block lists whole disks only; partitions sit in their disk's directory and are
    // reachable by name through SYS/class/block.
    let disk = sys_root.join("block").join(name);
    let dir = if disk.symlink_metadata().is_ok() {
        disk
    } else {
        sys_root.join("class/block").join(name)
    };
    Ok(dir.join("inflight"))
}

/// Parses `inflight`: two counts, reads then writes, space-padded (`"       0        3\n"`).
pub fn parse_inflight(text: &str) -> Result<(u64, u64), ParseError> {
    const WHAT: &str = "inflight";
    let mut fields = text.split_whitespace();
    let (Some(reads), Some(writes), None) = (fields.next(), fields.next(), fields.next()) else {
        return Err(ParseError::new(WHAT, "expected two counts", text));
    };
    Ok((
        kernfs::parse_uint(WHAT, reads, text)?,
        kernfs::parse_uint(WHAT, writes, text)?,
    ))
}

/// Parses `md/sync_action`.
pub fn parse_sync_action(text: &str) -> Result<SyncAction, ParseError> {
    text.trim()
        .parse()
        .map_err(|_| ParseError::new("sync_action", "unknown action", text))
}

/// Parses `md/sync_completed`: `none` or `delayed` (no sync running yet) → None,
/// `DONE / TOTAL` in sectors → Some.
pub fn parse_sync_completed(text: &str) -> Result<Option<(u64, u64)>, ParseError> {
    const WHAT: &str = "sync_completed";
    let trimmed = text.trim();
    // "delayed": the sync waits for another array sharing the disks.
    if trimmed == "none" || trimmed == "delayed" {
        return Ok(None);
    }
    let Some((done, total)) = trimmed.split_once('/') else {
        return Err(ParseError::new(WHAT, "expected DONE / TOTAL", text));
    };
    Ok(Some((
        kernfs::parse_uint(WHAT, done, text)?,
        kernfs::parse_uint(WHAT, total, text)?,
    )))
}

/// Parses `md/degraded`: the number of missing members.
pub fn parse_degraded(text: &str) -> Result<u32, ParseError> {
    kernfs::parse_uint("degraded", text, text)
}

/// Parses `md/level`. Empty is valid: the kernel writes nothing for an array without a level.
pub fn parse_level(text: &str) -> Result<String, ParseError> {
    let level = text.trim();
    let valid = level
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !valid {
        return Err(ParseError::new("level", "not a level name", text));
    }
    Ok(level.to_owned())
}

/// Parses `md/raid_disks`: `4`, or `5 (4)` during a reshape (new count first, kept).
/// Empty means 0: the kernel writes nothing while the array has no disks.
pub fn parse_raid_disks(text: &str) -> Result<u32, ParseError> {
    const WHAT: &str = "raid_disks";
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Ok(0);
    }
    let (new, old) = match trimmed.split_once(' ') {
        Some((new, old)) => (new, Some(old)),
        None => (trimmed, None),
    };
    if let Some(old) = old {
        let inner = old
            .strip_prefix('(')
            .and_then(|o| o.strip_suffix(')'))
            .ok_or_else(|| ParseError::new(WHAT, "expected N or N (OLD)", text))?;
        kernfs::parse_uint::<u32>(WHAT, inner, text)?;
    }
    kernfs::parse_uint(WHAT, new, text)
}

/// Parses `md/array_state`.
pub fn parse_array_state(text: &str) -> Result<ArrayState, ParseError> {
    text.trim()
        .parse()
        .map_err(|_| ParseError::new("array_state", "unknown state", text))
}

/// Parses `loop/backing_file`: a path, kept byte for byte but for the final newline,
/// since file names may hold spaces.
pub fn parse_backing_file(text: &str) -> Result<PathBuf, ParseError> {
    let path = text.strip_suffix('\n').unwrap_or(text);
    if path.is_empty() || path.contains('\n') || path.contains('\0') {
        return Err(ParseError::new("backing_file", "expected one path", text));
    }
    Ok(PathBuf::from(path))
}

/// Accumulates what lies beneath a device while walking `slaves/` links down.
#[derive(Default)]
struct Below {
    md_arrays: Vec<String>,
    slaves: Vec<String>,
    // Canonical directories already walked: a malformed tree must not loop forever.
    seen: HashSet<PathBuf>,
}

impl Below {
    fn walk(&mut self, disk_dir: &Path) -> Result<(), BlockdevError> {
        if !self.seen.insert(disk_dir.to_owned()) {
            return Ok(());
        }
        if disk_dir.join("md").is_dir() {
            let name = file_name(disk_dir);
            if !self.md_arrays.contains(&name) {
                self.md_arrays.push(name);
            }
        }
        for (slave, link) in slave_links(disk_dir)? {
            // A link that vanished (device being removed) still names the leaf it was.
            let Ok(target) = fs::canonicalize(&link) else {
                self.slaves.push(slave);
                continue;
            };
            // A slave may be a partition of a stacked device (dm on md0p1): what lies beneath
            // is recorded on the whole disk.
            let slave_disk = whole_disk(&target);
            if slave_disk.join("md").is_dir() || !slave_links(&slave_disk)?.is_empty() {
                self.walk(&slave_disk)?;
            } else {
                self.slaves.push(slave);
            }
        }
        Ok(())
    }
}

/// The entries of `DIR/slaves`, sorted; none when the directory is absent (partitions have
/// none, and git cannot store the empty ones of the fixtures).
fn slave_links(dir: &Path) -> Result<Vec<(String, PathBuf)>, BlockdevError> {
    let slaves = dir.join("slaves");
    let entries = match fs::read_dir(&slaves) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error(&slaves)(e)),
    };
    let mut links = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_error(&slaves))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // Kernel names never start with a dot; such entries are placeholders, not devices.
        if !name.starts_with('.') {
            links.push((name, entry.path()));
        }
    }
    links.sort();
    Ok(links)
}

/// The disk directory of a device directory: its parent for a partition, itself otherwise.
fn whole_disk(dir: &Path) -> PathBuf {
    match dir.parent() {
        Some(parent) if dir.join("partition").is_file() => parent.to_owned(),
        _ => dir.to_owned(),
    }
}

/// Levels whose personality has a sync thread, hence `sync_action`, `sync_completed` and
/// `degraded` (the kernel's md_redundancy_group).
fn is_redundant(level: &str) -> bool {
    matches!(level, "raid1" | "raid4" | "raid5" | "raid6" | "raid10")
}

fn sync_fraction((done, total): (u64, u64)) -> Option<f64> {
    // Precision loss above 2^53 sectors (4 EiB) does not matter for a progress ratio.
    (total > 0).then(|| (done as f64 / total as f64).min(1.0))
}

fn file_name(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn check_name(name: &str) -> Result<(), BlockdevError> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(BlockdevError::InvalidName {
            name: name.to_owned(),
        });
    }
    Ok(())
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> BlockdevError + '_ {
    move |source| {
        BlockdevError::Read(ReadError::Io {
            path: path.to_owned(),
            source,
        })
    }
}

/// A file of the md redundancy group: missing is an error only where the level has one.
fn read_sync_file<T>(
    path: &Path,
    required: bool,
    parse: fn(&str) -> Result<T, ParseError>,
) -> Result<Option<T>, ReadError> {
    if required {
        read_parse(path, parse).map(Some)
    } else {
        read_parse_optional(path, parse)
    }
}

/// The devices beneath a target's mount, for the device metrics and its stalls' context.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TargetDevices {
    pub disk: Option<String>,
    pub arrays: Vec<String>,
    /// The filesystem's own device (`sda1`; the disk itself when unpartitioned).
    pub device: Option<String>,
    /// The leaf devices beneath md arrays or other stacked devices (`sdb1`, `sdc`).
    pub members: Vec<String>,
}

impl TargetDevices {
    /// The disk and md arrays beneath the mount of device `maj_min` (`8:17`, as
    /// mountinfo has it); none for tmpfs, btrfs (anonymous device numbers) and network
    /// filesystems.
    pub fn beneath(sys_root: &Path, maj_min: &str) -> TargetDevices {
        let parsed = maj_min
            .split_once(':')
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
        let Some((major, minor)) = parsed else {
            return TargetDevices::default();
        };
        match resolve(sys_root, major, minor) {
            Ok(d) => TargetDevices {
                disk: Some(d.disk),
                arrays: d.md_arrays,
                device: Some(d.name),
                members: d.slaves,
            },
            Err(_) => TargetDevices::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(scenario: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/sys")
            .join(scenario)
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn assert_not_found(err: BlockdevError, suffix: &str) {
        match err {
            BlockdevError::Read(ReadError::Io { path, source }) => {
                assert!(path.ends_with(suffix), "{} vs {suffix}", path.display());
                assert_eq!(source.kind(), io::ErrorKind::NotFound);
            }
            other => panic!("expected Io NotFound for {suffix}, got {other:?}"),
        }
    }

    // ---- resolve, md_state, inflight on each fixture tree ----

    #[test]
    fn partition_resolves_to_its_disk() {
        let sys = fixture("partition");
        let dev = resolve(&sys, 8, 1).unwrap();
        assert_eq!(
            dev,
            BlockDevice {
                name: "sda1".into(),
                disk: "sda".into(),
                loop_backing_file: None,
                md_arrays: vec![],
                slaves: vec![],
            }
        );
        assert_eq!(resolve(&sys, 8, 0).unwrap().disk, "sda");
        // Stripping digits would give "nvme0n"; the sysfs parent gives the real disk.
        let nvme = resolve(&sys, 259, 2).unwrap();
        assert_eq!(
            (nvme.name.as_str(), nvme.disk.as_str()),
            ("nvme0n1p2", "nvme0n1")
        );
    }

    #[test]
    fn partition_and_disk_inflight() {
        let sys = fixture("partition");
        assert_eq!(inflight(&sys, "sda").unwrap(), (2, 7));
        assert_eq!(inflight(&sys, "sda1").unwrap(), (2, 7));
        assert_eq!(inflight(&sys, "sda2").unwrap(), (0, 0));
        assert_eq!(inflight(&sys, "nvme0n1").unwrap(), (0, 31));
        assert_eq!(inflight(&sys, "nvme0n1p2").unwrap(), (1, 30));
        assert_not_found(
            inflight(&sys, "sdz").unwrap_err(),
            "class/block/sdz/inflight",
        );
    }

    #[test]
    fn loop_device_has_backing_file() {
        let sys = fixture("loop");
        let dev = resolve(&sys, 7, 3).unwrap();
        assert_eq!(dev.name, "loop3");
        assert_eq!(dev.disk, "loop3");
        assert_eq!(
            dev.loop_backing_file,
            Some(PathBuf::from("/var/lib/machines/build image.raw"))
        );
        assert!(dev.md_arrays.is_empty() && dev.slaves.is_empty());
        assert_eq!(inflight(&sys, "loop3").unwrap(), (0, 1));
    }

    #[test]
    fn loop_partition_and_unbound_loop() {
        let sys = fixture("loop");
        let part = resolve(&sys, 259, 1).unwrap();
        assert_eq!(
            (part.name.as_str(), part.disk.as_str()),
            ("loop0p2", "loop0")
        );
        assert_eq!(
            part.loop_backing_file,
            Some(PathBuf::from("/var/tmp/sw-loop.img"))
        );
        // An unbound loop device has no loop/ directory at all.
        assert_eq!(resolve(&sys, 7, 5).unwrap().loop_backing_file, None);
    }

    #[test]
    fn md_raid1_idle() {
        let sys = fixture("md-raid1-idle");
        let dev = resolve(&sys, 9, 0).unwrap();
        assert_eq!(dev.name, "md0");
        assert_eq!(dev.disk, "md0");
        assert_eq!(dev.md_arrays, names(&["md0"]));
        assert_eq!(dev.slaves, names(&["sdb1", "sdc1"]));

        let md = md_state(&sys, "md0").unwrap();
        assert_eq!(
            md,
            MdState {
                name: "md0".into(),
                level: "raid1".into(),
                raid_disks: 2,
                array_state: ArrayState::Clean,
                sync_action: Some(SyncAction::Idle),
                sync_completed: None,
                sync_fraction: None,
                degraded: Some(0),
            }
        );
        assert_eq!(inflight(&sys, "md0").unwrap(), (3, 12));
    }

    #[test]
    fn lvm_on_md_finds_the_array_beneath() {
        let sys = fixture("md-raid1-idle");
        let dev = resolve(&sys, 253, 0).unwrap();
        assert_eq!(dev.name, "dm-0");
        assert_eq!(dev.md_arrays, names(&["md0"]));
        assert_eq!(dev.slaves, names(&["sdb1", "sdc1"]));
    }

    #[test]
    fn md_member_is_not_on_an_array() {
        // sdb1 is beneath md0 (holders/), not on top of it.
        let dev = resolve(&fixture("md-raid1-idle"), 8, 17).unwrap();
        assert_eq!((dev.name.as_str(), dev.disk.as_str()), ("sdb1", "sdb"));
        assert!(dev.md_arrays.is_empty() && dev.slaves.is_empty());
    }

    #[test]
    fn md_raid5_resync_in_progress() {
        let sys = fixture("md-raid5-resync");
        let dev = resolve(&sys, 9, 0).unwrap();
        assert_eq!(dev.slaves, names(&["sdb", "sdc", "sdd", "sde"]));

        let md = md_state(&sys, "md0").unwrap();
        assert_eq!(md.level, "raid5");
        assert_eq!(md.raid_disks, 4);
        assert_eq!(md.array_state, ArrayState::Active);
        assert_eq!(md.sync_action, Some(SyncAction::Resync));
        assert_eq!(md.sync_completed, Some((123_456, 7_814_037_168)));
        let fraction = md.sync_fraction.unwrap();
        assert!((fraction - 123_456.0 / 7_814_037_168.0).abs() < 1e-12);
        assert_eq!(md.degraded, Some(0));
        assert_eq!(inflight(&sys, "md0").unwrap(), (0, 17));
        assert_eq!(inflight(&sys, "sdb").unwrap(), (0, 5));
    }

    #[test]
    fn md_raid6_check() {
        let sys = fixture("md-raid6-check");
        let dev = resolve(&sys, 9, 127).unwrap();
        assert_eq!(dev.md_arrays, names(&["md127"]));
        assert_eq!(
            dev.slaves,
            names(&["sdb1", "sdc1", "sdd1", "sde1", "sdf1", "sdg1"])
        );

        let md = md_state(&sys, "md127").unwrap();
        assert_eq!(md.level, "raid6");
        assert_eq!(md.raid_disks, 6);
        assert_eq!(md.sync_action, Some(SyncAction::Check));
        assert_eq!(md.sync_completed, Some((2_930_135_040, 5_860_270_080)));
        assert_eq!(md.sync_fraction, Some(0.5));
        assert_eq!(inflight(&sys, "md127").unwrap(), (9, 2));
    }

    #[test]
    fn md_raid1_recover_degraded() {
        let sys = fixture("md-raid1-recover");
        let md = md_state(&sys, "md0").unwrap();
        assert_eq!(md.sync_action, Some(SyncAction::Recover));
        assert_eq!(md.degraded, Some(1));
        assert_eq!(md.array_state, ArrayState::Clean);
        assert_eq!(md.sync_completed, Some((524_288, 3_906_762_752)));
        // The spare being rebuilt is still a slave of the array.
        assert_eq!(
            resolve(&sys, 9, 0).unwrap().slaves,
            names(&["sdb1", "sdc1"])
        );
    }

    #[test]
    fn md_partition_resolves_to_array() {
        let sys = fixture("md-partitioned");
        let dev = resolve(&sys, 259, 1).unwrap();
        assert_eq!(dev.name, "md0p2");
        assert_eq!(dev.disk, "md0");
        assert_eq!(dev.md_arrays, names(&["md0"]));
        assert_eq!(dev.slaves, names(&["sda", "sdb"]));
        assert_eq!(
            md_state(&sys, &dev.disk).unwrap().sync_action,
            Some(SyncAction::Idle)
        );
        assert_eq!(inflight(&sys, "md0p2").unwrap(), (0, 6));
        assert_eq!(inflight(&sys, "md0").unwrap(), (0, 6));
    }

    #[test]
    fn md_raid0_has_no_sync_state() {
        let sys = fixture("md-raid0");
        assert_eq!(
            resolve(&sys, 9, 0).unwrap().slaves,
            names(&["nvme0n1", "nvme1n1"])
        );
        let md = md_state(&sys, "md0").unwrap();
        assert_eq!(md.level, "raid0");
        assert_eq!(md.sync_action, None);
        assert_eq!(md.sync_completed, None);
        assert_eq!(md.degraded, None);
    }

    #[test]
    fn md_missing_sync_action_is_an_error() {
        let sys = fixture("md-broken");
        let err = md_state(&sys, "md0").unwrap_err();
        assert!(err.to_string().contains("md/sync_action"), "{err}");
        assert_not_found(err, "block/md0/md/sync_action");
        // The device itself still resolves.
        assert_eq!(resolve(&sys, 9, 0).unwrap().md_arrays, names(&["md0"]));
    }

    #[test]
    fn anonymous_device_has_no_block_device() {
        let err = resolve(&fixture("partition"), 0, 42).unwrap_err();
        assert!(matches!(
            err,
            BlockdevError::NoBlockDevice {
                major: 0,
                minor: 42
            }
        ));
    }

    #[test]
    fn unknown_device_names_the_missing_path() {
        let err = resolve(&fixture("partition"), 8, 99).unwrap_err();
        assert_not_found(err, "dev/block/8:99");
    }

    #[test]
    fn md_state_of_plain_disk_fails_on_level() {
        let err = md_state(&fixture("partition"), "sda").unwrap_err();
        assert_not_found(err, "block/sda/md/level");
    }

    #[test]
    fn names_cannot_escape_sysfs() {
        let sys = fixture("partition");
        for bad in ["", ".", "..", "../sda", "sda/inflight"] {
            assert!(
                matches!(inflight(&sys, bad), Err(BlockdevError::InvalidName { .. })),
                "{bad:?}"
            );
            assert!(
                matches!(md_state(&sys, bad), Err(BlockdevError::InvalidName { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn fixture_symlinks_stay_inside_their_tree() {
        // Guards against a checkout that flattened symlinks or a link that points outside.
        fn visit(root: &Path, dir: &Path, count: &mut usize) {
            for entry in fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                let meta = path.symlink_metadata().unwrap();
                if meta.file_type().is_symlink() {
                    *count += 1;
                    let target = fs::canonicalize(&path)
                        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                    assert!(
                        target.starts_with(root),
                        "{} leaves the tree",
                        path.display()
                    );
                } else if meta.is_dir() {
                    visit(root, &path, count);
                }
            }
        }
        let root = fs::canonicalize(fixture("")).unwrap();
        let mut count = 0;
        visit(&root, &root, &mut count);
        assert!(
            count > 100,
            "only {count} symlinks: fixtures not checked out as links?"
        );
    }

    #[test]
    fn real_root_filesystem() {
        use std::os::unix::fs::MetadataExt;
        let dev = fs::metadata("/").unwrap().dev();
        let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
        let sys = Path::new("/sys");
        match resolve(sys, major, minor) {
            Err(BlockdevError::NoBlockDevice { .. }) => {
                eprintln!("skipped: / is on anonymous device {major}:{minor}");
            }
            Err(e) => panic!("resolving / ({major}:{minor}): {e:#?}"),
            Ok(found) => {
                assert!(!found.name.is_empty() && !found.disk.is_empty());
                assert!(sys.join("block").join(&found.disk).exists());
                inflight(sys, &found.name).unwrap();
                inflight(sys, &found.disk).unwrap();
                for md in &found.md_arrays {
                    md_state(sys, md).unwrap();
                }
            }
        }
    }

    // ---- parsers on literal text and on broken input ----

    #[test]
    fn parse_inflight_cases() {
        assert_eq!(parse_inflight("       0        0\n"), Ok((0, 0)));
        assert_eq!(parse_inflight("      12      345\n"), Ok((12, 345)));
        assert_eq!(parse_inflight("1 2"), Ok((1, 2)));
        for bad in [
            "",
            "\n",
            "7\n",
            "1 2 3\n",
            "-1 0\n",
            "+1 0\n",
            "a b\n",
            "1.5 2\n",
            "99999999999999999999 0\n",
        ] {
            assert!(parse_inflight(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parse_sync_action_cases() {
        for action in SyncAction::ALL {
            assert_eq!(parse_sync_action(&format!("{action}\n")), Ok(action));
        }
        for bad in ["", "\n", "Idle\n", "resyncing\n", "idle check\n", "-1\n"] {
            assert!(parse_sync_action(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn enum_strings_are_the_kernels_spelling() {
        let actions: Vec<&str> = SyncAction::ALL.iter().map(|a| a.as_str()).collect();
        assert_eq!(
            actions,
            ["idle", "resync", "recover", "check", "repair", "frozen", "reshape"]
        );
        let states: Vec<String> = ArrayState::VARIANTS.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            states,
            [
                "clear",
                "inactive",
                "suspended",
                "readonly",
                "read-auto",
                "clean",
                "active",
                "write-pending",
                "active-idle",
                "broken"
            ]
        );
        for s in ArrayState::VARIANTS {
            assert_eq!(parse_array_state(&format!("{s}\n")), Ok(*s));
        }
    }

    #[test]
    fn parse_sync_completed_cases() {
        assert_eq!(parse_sync_completed("none\n"), Ok(None));
        assert_eq!(parse_sync_completed("delayed\n"), Ok(None));
        assert_eq!(
            parse_sync_completed("123456 / 7814037168\n"),
            Ok(Some((123_456, 7_814_037_168)))
        );
        assert_eq!(parse_sync_completed("0 / 0\n"), Ok(Some((0, 0))));
        for bad in [
            "",
            "\n",
            "12345\n",
            "12 / \n",
            " / 34\n",
            "-1 / 10\n",
            "1 / 2 / 3\n",
            "a / b\n",
            "50%\n",
        ] {
            assert!(parse_sync_completed(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sync_fraction_is_clamped_and_total_zero_is_none() {
        assert_eq!(sync_fraction((0, 0)), None);
        assert_eq!(sync_fraction((5, 10)), Some(0.5));
        assert_eq!(sync_fraction((11, 10)), Some(1.0));
    }

    #[test]
    fn parse_degraded_cases() {
        assert_eq!(parse_degraded("0\n"), Ok(0));
        assert_eq!(parse_degraded("2\n"), Ok(2));
        for bad in ["", "\n", "-1\n", "one\n", "1 2\n", "4294967296\n"] {
            assert!(parse_degraded(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parse_level_cases() {
        assert_eq!(parse_level("raid6\n"), Ok("raid6".into()));
        assert_eq!(parse_level("linear\n"), Ok("linear".into()));
        // The kernel writes nothing at all for an array whose level is not set yet.
        assert_eq!(parse_level(""), Ok(String::new()));
        for bad in ["raid 5\n", "RAID5\n", "raid5\nraid6\n", "\u{1b}[1m\n"] {
            assert!(parse_level(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parse_raid_disks_cases() {
        assert_eq!(parse_raid_disks("4\n"), Ok(4));
        assert_eq!(parse_raid_disks("5 (4)\n"), Ok(5));
        // The kernel writes nothing while the array has no disks.
        assert_eq!(parse_raid_disks(""), Ok(0));
        for bad in ["-2\n", "two\n", "5 4\n", "5 (x)\n", "5 (4\n", "(4)\n"] {
            assert!(parse_raid_disks(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parse_array_state_cases() {
        assert_eq!(parse_array_state("clean\n"), Ok(ArrayState::Clean));
        assert_eq!(parse_array_state("read-auto\n"), Ok(ArrayState::ReadAuto));
        assert_eq!(
            parse_array_state("write-pending\n"),
            Ok(ArrayState::WritePending)
        );
        for bad in ["", "\n", "Clean\n", "clean active\n", "-1\n"] {
            assert!(parse_array_state(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parse_backing_file_cases() {
        assert_eq!(
            parse_backing_file("/var/lib/a b.img\n"),
            Ok(PathBuf::from("/var/lib/a b.img"))
        );
        assert_eq!(
            parse_backing_file("/tmp/x.img (deleted)\n"),
            Ok(PathBuf::from("/tmp/x.img (deleted)"))
        );
        for bad in ["", "\n", "/a\n/b\n", "/a\0b\n"] {
            assert!(parse_backing_file(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn errors_name_the_path_and_cut_long_input() {
        let dir = tempfile::tempdir().unwrap();
        let md = dir.path().join("block/md9/md");
        fs::create_dir_all(&md).unwrap();
        fs::write(md.join("level"), "raid1\n").unwrap();
        fs::write(md.join("raid_disks"), "2\n").unwrap();
        fs::write(md.join("array_state"), "clean\n").unwrap();
        fs::write(md.join("sync_action"), "x".repeat(1000)).unwrap();
        let err = md_state(dir.path(), "md9").unwrap_err();
        let BlockdevError::Read(ReadError::Parse { path, source }) = &err else {
            panic!("expected Parse, got {err:?}");
        };
        assert!(path.ends_with("md9/md/sync_action"));
        assert!(source.input.chars().count() <= 65, "{}", source.input);
        assert!(err.to_string().contains("md9/md/sync_action"));
    }
}
