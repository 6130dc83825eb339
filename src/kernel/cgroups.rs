//! Who is dirtying: per-cgroup dirty and writeback memory and bytes written to given
//! devices, from cgroupfs (v2 `memory.stat` + `io.stat`; v1 `memory.stat` + blkio).
//!
//! cgroupfs is found under the sysfs root (`SYS/fs/cgroup`), by the files each
//! hierarchy's root holds, not from the mount table: `--path.sysfs` relocates sysfs (a
//! container with the host's /sys mounted elsewhere, a fixture tree) and the mount table
//! would still name the agent's own `/sys/fs/cgroup`. Every figure is the cgroup's own,
//! without its descendants, so the ranking never puts a parent slice above the service
//! that does the writing: v1 has own counters (`dirty`, not the hierarchical
//! `total_dirty`; `blkio.throttle.io_service_bytes`, not `…_recursive`), v2 counts
//! recursively, so a cgroup's own share is its figure less its children's.

use std::collections::HashMap;
use std::ffi::CString;
use std::fs;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};

use crate::kernel::kernfs::{self, ParseError};

/// The most cgroups walked in one hierarchy per read: a host with tens of thousands of
/// cgroups gets a partial reading (counted in the event), not a second of CPU.
pub const MAX_CGROUPS: usize = 4096;

/// A block device number, as cgroupfs keys its per-device lines (`8:16`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevNum {
    pub major: u32,
    pub minor: u32,
}

impl DevNum {
    /// Parses `MAJ:MIN` (a `dev` attribute or the key of an io.stat line).
    pub fn parse(what: &'static str, field: &str, input: &str) -> Result<DevNum, ParseError> {
        let Some((major, minor)) = field.trim().split_once(':') else {
            return Err(ParseError::new(what, "expected MAJ:MIN", input));
        };
        Ok(DevNum {
            major: kernfs::parse_uint(what, major, input)?,
            minor: kernfs::parse_uint(what, minor, input)?,
        })
    }
}

impl std::fmt::Display for DevNum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// The cgroup hierarchies that can tell who dirties and who writes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hierarchies {
    /// The v2 hierarchy when its root offers the memory controller.
    pub v2_memory: Option<PathBuf>,
    /// The v2 hierarchy when its root offers the io controller.
    pub v2_io: Option<PathBuf>,
    /// A v1 hierarchy with the memory controller.
    pub v1_memory: Option<PathBuf>,
    /// A v1 hierarchy with the blkio controller.
    pub v1_blkio: Option<PathBuf>,
}

impl Hierarchies {
    /// Finds the hierarchies under `SYS/fs/cgroup`: the unified hierarchy itself
    /// (`cgroup.controllers` at the top), or in hybrid and legacy layouts the
    /// subdirectories (`unified`, `memory`, `blkio`, co-mounted `memory,blkio`...). v2 is
    /// preferred for a controller it offers. Nothing mounted: all None.
    pub fn find(sys_root: &Path) -> Hierarchies {
        let base = sys_root.join("fs/cgroup");
        let mut h = Hierarchies::default();
        let mut dirs = vec![base.clone()];
        if let Ok(entries) = fs::read_dir(&base) {
            let mut sub: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            sub.sort();
            dirs.extend(sub);
        }
        for dir in dirs {
            if let Ok(c) = fs::read_to_string(dir.join("cgroup.controllers")) {
                let has = |name: &str| c.split_whitespace().any(|w| w == name);
                if has("memory") && h.v2_memory.is_none() {
                    h.v2_memory = Some(dir.clone());
                }
                if has("io") && h.v2_io.is_none() {
                    h.v2_io = Some(dir.clone());
                }
                // The unified root at the top: no v1 hierarchy below it.
                if dir == base {
                    break;
                }
                continue;
            }
            if dir == base {
                continue;
            }
            if h.v1_memory.is_none() && dir.join("memory.use_hierarchy").is_file() {
                h.v1_memory = Some(dir.clone());
            }
            if h.v1_blkio.is_none() && dir.join("blkio.throttle.io_service_bytes").is_file() {
                h.v1_blkio = Some(dir);
            }
        }
        h
    }

    /// The cgroup version the dirty figures come from; None without a memory controller.
    pub fn memory_version(&self) -> Option<u8> {
        match (&self.v2_memory, &self.v1_memory) {
            (Some(_), _) => Some(2),
            (None, Some(_)) => Some(1),
            (None, None) => None,
        }
    }

    /// The root of the hierarchy the dirty figures come from.
    pub fn memory_root(&self) -> Option<&Path> {
        self.v2_memory.as_deref().or(self.v1_memory.as_deref())
    }

    /// True when no hierarchy can give any figure.
    pub fn is_empty(&self) -> bool {
        self == &Hierarchies::default()
    }
}

/// One cgroup's own figures in a reading.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupStat {
    /// Dirty page cache charged to the cgroup, bytes.
    pub dirty: u64,
    /// Page cache under writeback charged to the cgroup, bytes.
    pub writeback: u64,
    /// Bytes written to the devices asked for since the cgroup was created (a counter).
    pub written: u64,
}

/// One pass over the hierarchies.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CgroupReading {
    /// Path relative to the hierarchy root (`/` for the root, `/system.slice/x.service`).
    pub cgroups: HashMap<String, CgroupStat>,
    /// Directories visited, over all hierarchies walked (one on v2; memory and blkio on
    /// v1, each walked once).
    pub walked: usize,
    /// Whether a hierarchy had more cgroups than [`MAX_CGROUPS`].
    pub capped: bool,
    /// Files that existed but did not parse (a cgroup vanishing mid-read is not one).
    pub errors: usize,
}

/// What one cgroup file gives: parses its text into the figures it sets.
type Parse<'a> = &'a dyn Fn(&mut CgroupStat, &str) -> Result<(), ParseError>;

/// Reads every cgroup's dirty, writeback and written bytes on `devices`. On v2 both
/// files are read in one walk of the one hierarchy.
pub fn read(h: &Hierarchies, devices: &[DevNum], cap: usize) -> CgroupReading {
    let mut out = CgroupReading::default();
    let mem_v2: Parse = &|s, t| {
        (s.dirty, s.writeback) = parse_memory_stat_v2(t)?;
        Ok(())
    };
    let mem_v1: Parse = &|s, t| {
        (s.dirty, s.writeback) = parse_memory_stat_v1(t)?;
        Ok(())
    };
    let io_v2: Parse = &|s, t| {
        s.written = sum_on(&parse_io_stat(t)?, devices);
        Ok(())
    };
    let io_v1: Parse = &|s, t| {
        s.written = sum_on(&parse_blkio_service_bytes(t)?, devices);
        Ok(())
    };
    // (hierarchy, recursive, files): v2 counts descendants in, v1 does not.
    let mut walks: Walks = Vec::new();
    if let Some(root) = &h.v2_memory {
        add(&mut walks, root, true, "memory.stat", mem_v2);
    } else if let Some(root) = &h.v1_memory {
        add(&mut walks, root, false, "memory.stat", mem_v1);
    }
    if !devices.is_empty() {
        if let Some(root) = &h.v2_io {
            add(&mut walks, root, true, "io.stat", io_v2);
        } else if let Some(root) = &h.v1_blkio {
            add(
                &mut walks,
                root,
                false,
                "blkio.throttle.io_service_bytes",
                io_v1,
            );
        }
    }
    let mut buf = Vec::new();
    for (root, recursive, files) in walks {
        walk(root, &files, recursive, cap, &mut out, &mut buf);
    }
    out
}

type Walks<'a> = Vec<(&'a Path, bool, Vec<(&'static str, Parse<'a>)>)>;

/// Adds `file` to the walk of `root`, one walk per hierarchy.
fn add<'a>(
    walks: &mut Walks<'a>,
    root: &'a Path,
    recursive: bool,
    file: &'static str,
    parse: Parse<'a>,
) {
    match walks.iter_mut().find(|w| w.0 == root) {
        Some(w) => w.2.push((file, parse)),
        None => walks.push((root, recursive, vec![(file, parse)])),
    }
}

fn sum_on(per_device: &[(DevNum, u64)], devices: &[DevNum]) -> u64 {
    per_device
        .iter()
        .filter(|(d, _)| devices.contains(d))
        .map(|(_, v)| *v)
        .fold(0, u64::saturating_add)
}

/// One cgroup's figures as read, before v2's own shares are worked out.
struct Node {
    path: String,
    parent: Option<usize>,
    stat: CgroupStat,
}

/// A walk of one hierarchy. Every open is relative to the directory's descriptor (no
/// path lookup from the root per file) and a file is read with as few calls as it takes:
/// a stall on a host with thousands of cgroups must not cost a second of CPU.
struct Walker<'a, 'b> {
    files: &'a [(&'static str, Parse<'b>)],
    cap: usize,
    nodes: Vec<Node>,
    buf: Vec<u8>,
    /// For the directory listings.
    dirbuf: Vec<MaybeUninit<u8>>,
    out: &'a mut CgroupReading,
}

impl Walker<'_, '_> {
    fn visit(&mut self, dir: OwnedFd, path: String, parent: Option<usize>) {
        if self.nodes.len() == self.cap {
            self.out.capped = true;
            return;
        }
        self.out.walked += 1;
        let mut stat = CgroupStat::default();
        for (file, parse) in self.files {
            // Missing: removed meanwhile, or a controller not enabled for this subtree.
            if let Some(text) = read_at(&dir, file, &mut self.buf) {
                if parse(&mut stat, text).is_err() {
                    self.out.errors += 1;
                }
            }
        }
        let index = self.nodes.len();
        let children = subdirectories(&dir, &mut self.dirbuf);
        self.nodes.push(Node {
            path: path.clone(),
            parent,
            stat,
        });
        for name in children {
            if self.out.capped {
                return;
            }
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let Ok(child) = rustix::fs::openat(&dir, name.as_c_str(), flags, Mode::empty()) else {
                continue;
            };
            let name = name.to_string_lossy();
            let child_path = if path == "/" {
                format!("/{name}")
            } else {
                format!("{path}/{name}")
            };
            self.visit(child, child_path, Some(index));
        }
    }
}

/// The names of the directories in `dir` (cgroups; the interface files are not), by
/// the entries' own types, without a stat per entry: `getdents64` on the directory's
/// own descriptor into `buf`, reused across the walk.
fn subdirectories(dir: &OwnedFd, buf: &mut Vec<MaybeUninit<u8>>) -> Vec<CString> {
    if buf.len() < 32 << 10 {
        buf.resize(32 << 10, MaybeUninit::uninit());
    }
    let mut out = Vec::new();
    let mut entries = rustix::fs::RawDir::new(dir, buf.as_mut_slice());
    while let Some(Ok(e)) = entries.next() {
        let n = e.file_name().to_bytes();
        // Unknown: a filesystem without d_type; opening it as a directory decides.
        if matches!(e.file_type(), FileType::Directory | FileType::Unknown)
            && n != b"."
            && n != b".."
        {
            out.push(e.file_name().to_owned());
        }
    }
    out
}

/// Reads `name` in `dir` whole into `buf`; None when it cannot be opened or read or is
/// not UTF-8. A short read is the end: kernfs and seq_file give a file's text in one
/// read when the buffer holds it.
fn read_at<'a>(dir: &OwnedFd, name: &str, buf: &'a mut Vec<u8>) -> Option<&'a str> {
    let fd = rustix::fs::openat(dir, name, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    if buf.len() < 16 << 10 {
        buf.resize(16 << 10, 0);
    }
    let mut len = 0;
    loop {
        let n = rustix::io::read(&fd, &mut buf[len..]).ok()?;
        len += n;
        if n == 0 || len < buf.len() {
            break;
        }
        // Full: there may be more. Files of a cgroup are small; bound the growth anyway.
        if buf.len() >= 1 << 20 {
            return None;
        }
        buf.resize(buf.len() * 2, 0);
    }
    std::str::from_utf8(&buf[..len]).ok()
}

/// Walks one hierarchy depth first, reading `files` in each cgroup and merging the
/// figures they set into `out`. `recursive`: the kernel's figures include the
/// descendants (v2), so each parent loses its children's. A file missing in a cgroup
/// gives zeros.
fn walk(
    root: &Path,
    files: &[(&'static str, Parse<'_>)],
    recursive: bool,
    cap: usize,
    out: &mut CgroupReading,
    buf: &mut Vec<u8>,
) {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let Ok(dir) = rustix::fs::open(root, flags, Mode::empty()) else {
        return;
    };
    let mut w = Walker {
        files,
        cap,
        nodes: Vec::new(),
        buf: std::mem::take(buf),
        dirbuf: Vec::new(),
        out,
    };
    w.visit(dir, "/".into(), None);
    let Walker {
        mut nodes, buf: b, ..
    } = w;
    *buf = b;
    if recursive {
        // Each parent loses its children's recursive figures, as read (not their own
        // shares, which are worked out in the same pass).
        let read: Vec<CgroupStat> = nodes.iter().map(|n| n.stat).collect();
        for (i, c) in read.iter().enumerate() {
            if let Some(p) = nodes[i].parent {
                let s = &mut nodes[p].stat;
                s.dirty = s.dirty.saturating_sub(c.dirty);
                s.writeback = s.writeback.saturating_sub(c.writeback);
                s.written = s.written.saturating_sub(c.written);
            }
        }
    }
    for n in nodes {
        let e = out.cgroups.entry(n.path).or_default();
        e.dirty = e.dirty.max(n.stat.dirty);
        e.writeback = e.writeback.max(n.stat.writeback);
        e.written = e.written.max(n.stat.written);
    }
}

/// The processes of `cgroup` (a path as [`read`] names it) in the hierarchy at `root`,
/// from its `cgroup.procs`; none when it is gone.
pub fn procs(root: &Path, cgroup: &str) -> Vec<u32> {
    let dir = root.join(cgroup.trim_start_matches('/'));
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Picks `KEYS` out of a `KEY VALUE` per line file; every line must be one such pair
/// with an unsigned decimal value, and every key must be there. Byte by byte: v2's
/// memory.stat has some 50 lines, read for every cgroup once a second during a stall.
fn keyed<const N: usize>(
    what: &'static str,
    keys: [&'static str; N],
    text: &str,
) -> Result<[u64; N], ParseError> {
    let mut found = [None; N];
    for line in text.split('\n') {
        let bytes = line.as_bytes();
        let Some(sp) = bytes.iter().position(|b| b.is_ascii_whitespace()) else {
            if bytes.is_empty() {
                continue;
            }
            return Err(ParseError::new(what, "expected KEY VALUE", line));
        };
        let (key, value) = (&line[..sp], line[sp..].trim_ascii());
        if key.is_empty() {
            if value.is_empty() {
                continue;
            }
            return Err(ParseError::new(what, "expected KEY VALUE", line));
        }
        if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ParseError::new(
                what,
                "expected a non-negative integer",
                line,
            ));
        }
        if let Some(i) = keys.iter().position(|k| *k == key) {
            found[i] = Some(kernfs::parse_uint(what, value, line)?);
        }
    }
    let mut out = [0; N];
    for (i, f) in found.iter().enumerate() {
        out[i] = f.ok_or_else(|| ParseError::new(keys[i], "missing", text))?;
    }
    Ok(out)
}

/// Parses v2 `memory.stat`: `(file_dirty, file_writeback)` in bytes, descendants included.
pub fn parse_memory_stat_v2(text: &str) -> Result<(u64, u64), ParseError> {
    let [d, w] = keyed("memory.stat", ["file_dirty", "file_writeback"], text)?;
    Ok((d, w))
}

/// Parses v1 `memory.stat`: `(dirty, writeback)` in bytes, the cgroup's own (not the
/// `total_*` lines, which include the descendants).
pub fn parse_memory_stat_v1(text: &str) -> Result<(u64, u64), ParseError> {
    let [d, w] = keyed("memory.stat", ["dirty", "writeback"], text)?;
    Ok((d, w))
}

/// Parses v2 `io.stat`: written bytes per device. Lines are `MAJ:MIN key=value...`;
/// `wbytes` is required, other keys (io.latency's `depth=max`, iocost's `cost.*`) may
/// have any value.
pub fn parse_io_stat(text: &str) -> Result<Vec<(DevNum, u64)>, ParseError> {
    const WHAT: &str = "io.stat";
    let mut out = Vec::new();
    for line in text.lines() {
        let mut parts = line.split_ascii_whitespace();
        let Some(dev) = parts.next() else {
            continue;
        };
        let dev = DevNum::parse(WHAT, dev, line)?;
        let mut wbytes = None;
        for kv in parts {
            let Some((k, v)) = kv.split_once('=') else {
                return Err(ParseError::new(WHAT, "expected key=value", line));
            };
            if matches!(k, "rbytes" | "wbytes" | "rios" | "wios" | "dbytes" | "dios") {
                let v: u64 = kernfs::parse_uint(WHAT, v, line)?;
                if k == "wbytes" {
                    wbytes = Some(v);
                }
            }
        }
        let wbytes = wbytes.ok_or_else(|| ParseError::new(WHAT, "no wbytes", line))?;
        out.push((dev, wbytes));
    }
    Ok(out)
}

/// Parses v1 `blkio.throttle.io_service_bytes`: the `Write` bytes per device. Lines are
/// `MAJ:MIN OP BYTES` for OP in Read, Write, Sync, Async, Discard, Total, then a last
/// `Total BYTES`.
pub fn parse_blkio_service_bytes(text: &str) -> Result<Vec<(DevNum, u64)>, ParseError> {
    const WHAT: &str = "blkio.throttle.io_service_bytes";
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_ascii_whitespace().collect();
        match fields[..] {
            [] => {}
            ["Total", v] => {
                kernfs::parse_uint::<u64>(WHAT, v, line)?;
            }
            [dev, op, v] => {
                let dev = DevNum::parse(WHAT, dev, line)?;
                let v: u64 = kernfs::parse_uint(WHAT, v, line)?;
                match op {
                    "Write" => out.push((dev, v)),
                    "Read" | "Sync" | "Async" | "Discard" | "Total" => {}
                    _ => return Err(ParseError::new(WHAT, "unknown operation", line)),
                }
            }
            _ => return Err(ParseError::new(WHAT, "expected MAJ:MIN OP BYTES", line)),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const V2_STAT: &str = "anon 1060864\nfile 294912\nkernel 1548288\nfile_mapped 0\nfile_dirty 8192\nfile_writeback 4096\nswapcached 0\ninactive_file 1159168\nworkingset_refault_anon 0\npgfault 4419\n";
    const V1_STAT: &str = "cache 59908096\nrss 11186176\ndirty 110592\nwriteback 0\nswap 0\nhierarchical_memory_limit 9223372036854771712\ntotal_cache 19493568512\ntotal_dirty 38305792\ntotal_writeback 4096\n";

    #[test]
    fn memory_stat_v2_and_v1() {
        assert_eq!(parse_memory_stat_v2(V2_STAT), Ok((8192, 4096)));
        // The own lines, not total_dirty / total_writeback.
        assert_eq!(parse_memory_stat_v1(V1_STAT), Ok((110592, 0)));
        // A v1 file has no file_dirty, a v2 file no dirty.
        assert_eq!(
            parse_memory_stat_v2(V1_STAT).unwrap_err().what,
            "file_dirty"
        );
        assert_eq!(parse_memory_stat_v1(V2_STAT).unwrap_err().what, "dirty");
    }

    #[test]
    fn memory_stat_refuses_broken_text() {
        for bad in [
            "file_dirty 8192\nfile_writeback\n",
            "file_dirty -1\nfile_writeback 0\n",
            "file_dirty 1 2\nfile_writeback 0\n",
            "file_dirty 0x10\nfile_writeback 0\n",
            "file_dirty 1\nfile_writeback 0\nanon 1 2\n",
            "file_dirty 1\nfile_writeback 0\nanon\n",
            "file_dirty 1\nfile_writeback 0\n 5\n",
            "",
        ] {
            assert!(parse_memory_stat_v2(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn io_stat_wbytes_per_device() {
        let text = "8:16 rbytes=1459200 wbytes=314773504 rios=192 wios=353 dbytes=0 dios=0\n\
                    253:0 rbytes=0 wbytes=4096 rios=0 wios=1 dbytes=0 dios=0 depth=max avg_lat=0 cost.vrate=100.00\n";
        assert_eq!(
            parse_io_stat(text).unwrap(),
            vec![
                (
                    DevNum {
                        major: 8,
                        minor: 16
                    },
                    314773504
                ),
                (
                    DevNum {
                        major: 253,
                        minor: 0
                    },
                    4096
                )
            ]
        );
        assert_eq!(parse_io_stat("").unwrap(), vec![]);
        for bad in [
            "8:16 rbytes=1\n",
            "8-16 wbytes=1\n",
            "8:16 wbytes=-1\n",
            "8:16 wbytes\n",
            "x:1 wbytes=1\n",
        ] {
            assert!(parse_io_stat(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn blkio_write_bytes_per_device() {
        let text = "7:3 Read 4096\n7:3 Write 52428800\n7:3 Sync 0\n7:3 Async 52432896\n7:3 Discard 0\n7:3 Total 52432896\n8:0 Write 7\nTotal 52432903\n";
        assert_eq!(
            parse_blkio_service_bytes(text).unwrap(),
            vec![
                (DevNum { major: 7, minor: 3 }, 52428800),
                (DevNum { major: 8, minor: 0 }, 7)
            ]
        );
        assert_eq!(parse_blkio_service_bytes("Total 0\n").unwrap(), vec![]);
        for bad in [
            "7:3 Write\n",
            "7:3 Writes 1\n",
            "7:3 Write 1 2\n",
            "Total x\n",
        ] {
            assert!(parse_blkio_service_bytes(bad).is_err(), "{bad:?} accepted");
        }
    }

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/cgroup")
            .join(name)
    }

    #[test]
    fn v2_fixture_own_shares() {
        let sys = fixture("v2");
        let h = Hierarchies::find(&sys);
        assert_eq!(h.memory_version(), Some(2));
        assert!(h.v1_memory.is_none() && h.v1_blkio.is_none());
        let r = read(
            &h,
            &[DevNum {
                major: 8,
                minor: 16,
            }],
            MAX_CGROUPS,
        );
        assert_eq!(r.errors, 1, "broken.service has a broken memory.stat");
        assert!(!r.capped);
        let backup = r.cgroups["/system.slice/backup.service"];
        assert_eq!(
            backup,
            CgroupStat {
                dirty: 1_181_116_006,
                writeback: 52_428_800,
                written: 314_773_504
            }
        );
        // system.slice's figures include backup.service's and cron.service's: its own
        // share is what is left.
        let slice = r.cgroups["/system.slice"];
        assert_eq!(
            slice,
            CgroupStat {
                dirty: 0,
                writeback: 0,
                written: 0
            }
        );
        assert_eq!(r.cgroups["/system.slice/cron.service"].dirty, 4096);
        assert_eq!(
            r.cgroups["/"].dirty, 8192,
            "root's own: 1181128294 less children"
        );
        // A cap smaller than the tree: counted.
        let r = read(&h, &[], 2);
        assert!(r.capped);
        assert_eq!(r.cgroups.len(), 2);
    }

    #[test]
    fn v1_fixture_own_counters_merged_from_two_hierarchies() {
        let sys = fixture("v1");
        let h = Hierarchies::find(&sys);
        assert_eq!(h.memory_version(), Some(1));
        assert!(
            h.v2_memory.is_none(),
            "the hybrid unified root offers no memory"
        );
        let r = read(&h, &[DevNum { major: 7, minor: 3 }], MAX_CGROUPS);
        assert_eq!(
            r.cgroups["/writer"],
            CgroupStat {
                dirty: 41_943_040,
                writeback: 1_048_576,
                written: 0
            }
        );
        assert_eq!(
            r.cgroups["/"].written, 52_428_800,
            "v1 writeback is charged to root"
        );
        assert_eq!(r.cgroups["/idle"], CgroupStat::default());
        assert_eq!(r.errors, 0);
    }

    #[test]
    fn no_cgroupfs_reads_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let h = Hierarchies::find(dir.path());
        assert!(h.is_empty());
        assert_eq!(read(&h, &[], MAX_CGROUPS), CgroupReading::default());
    }
}
