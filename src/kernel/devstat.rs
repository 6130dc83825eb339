//! What a block device did and what it is: the I/O counters of `SYS/block/DEV/stat`,
//! its queue depth (`queue/nr_requests`), its device number, and its facts (rotational,
//! write cache mode, FUA, I/O scheduler) from `queue/`.
//!
//! Partitions are found through `SYS/class/block/NAME` like whole disks; their queue
//! attributes are their disk's.

use std::path::{Path, PathBuf};

use crate::kernel::cgroups::DevNum;
use crate::kernel::kernfs::{self, read_parse, read_parse_optional, ParseError, ReadError};

/// Bytes per sector in `stat`: always 512, whatever the device's block size
/// (Documentation/block/stat.rst).
pub const SECTOR_BYTES: u64 = 512;

/// The counters of `SYS/block/DEV/stat`, in the kernel's order and units (ms for ticks).
/// Kernels before 4.18 have 11 fields, before 5.5 15 (no flush fields).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStat {
    pub read_ios: u64,
    pub read_merges: u64,
    pub read_sectors: u64,
    pub read_ticks_ms: u64,
    pub write_ios: u64,
    pub write_merges: u64,
    pub write_sectors: u64,
    pub write_ticks_ms: u64,
    pub in_flight: u64,
    /// Time the device had I/O in flight: its busy time.
    pub io_ticks_ms: u64,
    pub time_in_queue_ms: u64,
    pub discard_ios: Option<u64>,
    pub discard_merges: Option<u64>,
    pub discard_sectors: Option<u64>,
    pub discard_ticks_ms: Option<u64>,
    pub flush_ios: Option<u64>,
    pub flush_ticks_ms: Option<u64>,
}

/// Parses `stat`: 11, 15 or 17 unsigned integers separated by spaces.
pub fn parse_stat(text: &str) -> Result<DiskStat, ParseError> {
    const WHAT: &str = "stat";
    let mut v = [0u64; 17];
    let mut n = 0;
    for field in text.split_ascii_whitespace() {
        if n == v.len() {
            return Err(ParseError::new(WHAT, "expected 11, 15 or 17 fields", text));
        }
        v[n] = kernfs::parse_uint(WHAT, field, text)?;
        n += 1;
    }
    if !matches!(n, 11 | 15 | 17) {
        return Err(ParseError::new(WHAT, "expected 11, 15 or 17 fields", text));
    }
    let opt = |i: usize| (i < n).then_some(v[i]);
    Ok(DiskStat {
        read_ios: v[0],
        read_merges: v[1],
        read_sectors: v[2],
        read_ticks_ms: v[3],
        write_ios: v[4],
        write_merges: v[5],
        write_sectors: v[6],
        write_ticks_ms: v[7],
        in_flight: v[8],
        io_ticks_ms: v[9],
        time_in_queue_ms: v[10],
        discard_ios: opt(11),
        discard_merges: opt(12),
        discard_sectors: opt(13),
        discard_ticks_ms: opt(14),
        flush_ios: opt(15),
        flush_ticks_ms: opt(16),
    })
}

/// `queue/write_cache`: whether the device acknowledges writes from a volatile cache (so
/// the kernel sends flushes) or only once they are on stable media.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteCache {
    WriteBack,
    WriteThrough,
}

impl WriteCache {
    /// The kernel's spelling, also the label value.
    pub fn as_str(self) -> &'static str {
        match self {
            WriteCache::WriteBack => "write back",
            WriteCache::WriteThrough => "write through",
        }
    }
}

/// Parses `queue/write_cache`.
pub fn parse_write_cache(text: &str) -> Result<WriteCache, ParseError> {
    match text.trim() {
        "write back" => Ok(WriteCache::WriteBack),
        "write through" => Ok(WriteCache::WriteThrough),
        _ => Err(ParseError::new("write_cache", "unknown cache mode", text)),
    }
}

/// Parses a 0/1 attribute (`queue/rotational`, `queue/fua`).
pub fn parse_flag(what: &'static str, text: &str) -> Result<bool, ParseError> {
    match text.trim() {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(ParseError::new(what, "expected 0 or 1", text)),
    }
}

/// Parses `queue/scheduler`: the bracketed name among those offered (`[none] mq-deadline
/// kyber bfq`), or the single name of a queue without a choice (`none`).
pub fn parse_scheduler(text: &str) -> Result<String, ParseError> {
    const WHAT: &str = "scheduler";
    let names: Vec<&str> = text.split_ascii_whitespace().collect();
    let chosen: Vec<&str> = names
        .iter()
        .filter_map(|n| n.strip_prefix('[').and_then(|n| n.strip_suffix(']')))
        .collect();
    let name = match (&chosen[..], &names[..]) {
        ([one], _) => *one,
        ([], [only]) => *only,
        _ => {
            return Err(ParseError::new(
                WHAT,
                "expected one [chosen] scheduler",
                text,
            ))
        }
    };
    let valid = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !valid {
        return Err(ParseError::new(WHAT, "not a scheduler name", text));
    }
    Ok(name.to_owned())
}

/// What a device is, for `stallwatch_device_info`: each None where the kernel has no
/// such attribute (older kernels have no `queue/fua`, bio-based devices no scheduler).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceFacts {
    pub rotational: Option<bool>,
    pub write_cache: Option<WriteCache>,
    pub fua: Option<bool>,
    pub scheduler: Option<String>,
}

/// The directory of a disk or partition: `SYS/block/NAME`, else `SYS/class/block/NAME`.
pub fn device_dir(sys_root: &Path, name: &str) -> PathBuf {
    let disk = sys_root.join("block").join(name);
    if disk.symlink_metadata().is_ok() {
        disk
    } else {
        sys_root.join("class/block").join(name)
    }
}

/// The whole disk a device belongs to: the parent of a partition, else the device.
pub fn disk_of(sys_root: &Path, name: &str) -> String {
    let dir = device_dir(sys_root, name);
    if dir.join("partition").is_file() {
        if let Some(parent) = std::fs::canonicalize(&dir)
            .ok()
            .and_then(|d| d.parent().and_then(|p| p.file_name()).map(|n| n.to_owned()))
        {
            return parent.to_string_lossy().into_owned();
        }
    }
    name.to_owned()
}

fn valid_name(name: &str) -> bool {
    !(name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']))
}

fn bad_name(sys_root: &Path, name: &str) -> ReadError {
    ReadError::Parse {
        path: sys_root.join("block"),
        source: ParseError::new("device name", "not a device name", name),
    }
}

/// Reads a disk's or partition's `stat`.
pub fn read_stat(sys_root: &Path, name: &str) -> Result<DiskStat, ReadError> {
    if !valid_name(name) {
        return Err(bad_name(sys_root, name));
    }
    read_parse(&device_dir(sys_root, name).join("stat"), parse_stat)
}

/// Reads `queue/nr_requests` of the device's disk; None for devices without a request
/// queue of their own (md, dm on older kernels).
pub fn read_nr_requests(sys_root: &Path, name: &str) -> Result<Option<u64>, ReadError> {
    if !valid_name(name) {
        return Err(bad_name(sys_root, name));
    }
    let disk = disk_of(sys_root, name);
    read_parse_optional(
        &device_dir(sys_root, &disk).join("queue/nr_requests"),
        |t| kernfs::parse_uint("nr_requests", t, t),
    )
}

/// Reads the device number in `dev` (`7:3`).
pub fn read_dev(sys_root: &Path, name: &str) -> Result<DevNum, ReadError> {
    if !valid_name(name) {
        return Err(bad_name(sys_root, name));
    }
    read_parse(&device_dir(sys_root, name).join("dev"), |t| {
        DevNum::parse("dev", t, t)
    })
}

/// Reads the facts of the whole disk `name` from its `queue/` directory.
pub fn read_facts(sys_root: &Path, name: &str) -> Result<DeviceFacts, ReadError> {
    if !valid_name(name) {
        return Err(bad_name(sys_root, name));
    }
    let q = device_dir(sys_root, name).join("queue");
    Ok(DeviceFacts {
        rotational: read_parse_optional(&q.join("rotational"), |t| parse_flag("rotational", t))?,
        write_cache: read_parse_optional(&q.join("write_cache"), parse_write_cache)?,
        fua: read_parse_optional(&q.join("fua"), |t| parse_flag("fua", t))?,
        scheduler: read_parse_optional(&q.join("scheduler"), parse_scheduler)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_17_15_and_11_fields() {
        let s = parse_stat("     146        1     2814       11       60       69    49960       23        0       32       50        2        0   524290        0        9       16\n").unwrap();
        assert_eq!(
            s,
            DiskStat {
                read_ios: 146,
                read_merges: 1,
                read_sectors: 2814,
                read_ticks_ms: 11,
                write_ios: 60,
                write_merges: 69,
                write_sectors: 49960,
                write_ticks_ms: 23,
                in_flight: 0,
                io_ticks_ms: 32,
                time_in_queue_ms: 50,
                discard_ios: Some(2),
                discard_merges: Some(0),
                discard_sectors: Some(524290),
                discard_ticks_ms: Some(0),
                flush_ios: Some(9),
                flush_ticks_ms: Some(16),
            }
        );
        let s15 = parse_stat("1 2 3 4 5 6 7 8 9 10 11 12 13 14 15\n").unwrap();
        assert_eq!((s15.discard_ticks_ms, s15.flush_ios), (Some(15), None));
        let s11 = parse_stat("1 2 3 4 5 6 7 8 9 10 11\n").unwrap();
        assert_eq!((s11.time_in_queue_ms, s11.discard_ios), (11, None));
    }

    #[test]
    fn stat_refuses_broken_text() {
        for bad in [
            "",
            "1 2 3 4 5 6 7 8 9 10\n",
            "1 2 3 4 5 6 7 8 9 10 11 12\n",
            "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18\n",
            "1 2 3 4 5 6 7 8 -9 10 11\n",
            "1 2 3 4 5 6 7 8 x 10 11\n",
        ] {
            assert!(parse_stat(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn queue_attributes() {
        assert_eq!(parse_write_cache("write back\n"), Ok(WriteCache::WriteBack));
        assert_eq!(
            parse_write_cache("write through\n"),
            Ok(WriteCache::WriteThrough)
        );
        assert!(parse_write_cache("writeback\n").is_err());
        assert_eq!(parse_flag("fua", "1\n"), Ok(true));
        assert!(parse_flag("fua", "2\n").is_err());
        assert_eq!(
            parse_scheduler("[none] mq-deadline kyber bfq \n").as_deref(),
            Ok("none")
        );
        assert_eq!(
            parse_scheduler("none [mq-deadline]\n").as_deref(),
            Ok("mq-deadline")
        );
        assert_eq!(parse_scheduler("none\n").as_deref(), Ok("none"));
        for bad in [
            "",
            "none mq-deadline\n",
            "[none] [bfq]\n",
            "[]\n",
            "[a\"b]\n",
        ] {
            assert!(parse_scheduler(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn reads_the_fixture_tree() {
        let sys = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sys/md-raid5-resync");
        let f = read_facts(&sys, "sdb").unwrap();
        assert_eq!(
            f,
            DeviceFacts {
                rotational: Some(true),
                write_cache: Some(WriteCache::WriteBack),
                fua: Some(false),
                scheduler: Some("mq-deadline".into()),
            }
        );
        let md = read_facts(&sys, "md0").unwrap();
        assert_eq!(md.scheduler.as_deref(), Some("none"));
        assert_eq!(read_nr_requests(&sys, "sdb").unwrap(), Some(64));
        assert_eq!(
            read_dev(&sys, "md0").unwrap(),
            DevNum { major: 9, minor: 0 }
        );
        assert_eq!(read_stat(&sys, "sdb").unwrap().write_ios, 1520);
        assert!(read_stat(&sys, "../x").is_err());
        let part = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sys/partition");
        assert_eq!(disk_of(&part, "sda1"), "sda");
        assert_eq!(disk_of(&part, "sda"), "sda");
    }
}
