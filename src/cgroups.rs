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
use std::fs;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use crate::kernfs::{self, ParseError};

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
    /// Directories visited over all hierarchies.
    pub walked: usize,
    /// Whether a hierarchy had more cgroups than [`MAX_CGROUPS`].
    pub capped: bool,
    /// Files that existed but did not parse (a cgroup vanishing mid-read is not one).
    pub errors: usize,
}

/// Reads every cgroup's dirty, writeback and written bytes on `devices`.
pub fn read(h: &Hierarchies, devices: &[DevNum], cap: usize) -> CgroupReading {
    let mut out = CgroupReading::default();
    let mut buf = String::new();
    if let Some(root) = &h.v2_memory {
        walk(
            root,
            "memory.stat",
            cap,
            &mut out,
            &mut buf,
            true,
            |s, t| {
                let (dirty, writeback) = parse_memory_stat_v2(t)?;
                s.dirty = dirty;
                s.writeback = writeback;
                Ok(())
            },
        );
    } else if let Some(root) = &h.v1_memory {
        walk(
            root,
            "memory.stat",
            cap,
            &mut out,
            &mut buf,
            false,
            |s, t| {
                let (dirty, writeback) = parse_memory_stat_v1(t)?;
                s.dirty = dirty;
                s.writeback = writeback;
                Ok(())
            },
        );
    }
    if devices.is_empty() {
        return out;
    }
    if let Some(root) = &h.v2_io {
        walk(root, "io.stat", cap, &mut out, &mut buf, true, |s, t| {
            s.written = sum_on(&parse_io_stat(t)?, devices);
            Ok(())
        });
    } else if let Some(root) = &h.v1_blkio {
        let file = "blkio.throttle.io_service_bytes";
        walk(root, file, cap, &mut out, &mut buf, false, |s, t| {
            s.written = sum_on(&parse_blkio_service_bytes(t)?, devices);
            Ok(())
        });
    }
    out
}

fn sum_on(per_device: &[(DevNum, u64)], devices: &[DevNum]) -> u64 {
    per_device
        .iter()
        .filter(|(d, _)| devices.contains(d))
        .map(|(_, v)| *v)
        .fold(0, u64::saturating_add)
}

/// The figures one hierarchy's file gives, before v2's own shares are worked out.
struct Node {
    path: String,
    parent: Option<usize>,
    stat: CgroupStat,
}

/// Walks one hierarchy depth first, reading `file` in each cgroup with `parse` and
/// merging the figures it sets into `out`. `recursive`: the kernel's figures include the
/// descendants (v2), so the children's are subtracted.
#[allow(clippy::too_many_arguments)]
fn walk(
    root: &Path,
    file: &str,
    cap: usize,
    out: &mut CgroupReading,
    buf: &mut String,
    recursive: bool,
    parse: impl Fn(&mut CgroupStat, &str) -> Result<(), ParseError>,
) {
    let mut nodes: Vec<Node> = Vec::new();
    let mut stack: Vec<(PathBuf, String, Option<usize>)> =
        vec![(root.to_owned(), "/".into(), None)];
    while let Some((dir, path, parent)) = stack.pop() {
        if nodes.len() == cap {
            out.capped = true;
            break;
        }
        out.walked += 1;
        let mut stat = CgroupStat::default();
        buf.clear();
        let read = fs::File::open(dir.join(file)).and_then(|mut f| f.read_to_string(buf));
        let present = match read {
            Ok(_) => match parse(&mut stat, buf) {
                Ok(()) => true,
                Err(_) => {
                    out.errors += 1;
                    false
                }
            },
            // Removed meanwhile, or a controller not enabled for this subtree.
            Err(_) => false,
        };
        let index = nodes.len();
        nodes.push(Node {
            path: path.clone(),
            parent,
            stat,
        });
        if !present {
            // No figures here: the parent must not lose its children's share to it.
            nodes[index].parent = None;
        }
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            // Cgroups are directories; the interface files are not. file_type() comes from
            // the directory entry, without a stat per file.
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = e.file_name();
            let name = name.to_string_lossy();
            let child = if path == "/" {
                format!("/{name}")
            } else {
                format!("{path}/{name}")
            };
            stack.push((e.path(), child, present.then_some(index)));
        }
    }
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
/// with an integer value, and every key must be there.
fn keyed<const N: usize>(
    what: &'static str,
    keys: [&'static str; N],
    text: &str,
) -> Result<[u64; N], ParseError> {
    let mut found = [None; N];
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        let mut parts = line.split_ascii_whitespace();
        let (Some(key), Some(value), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(ParseError::new(what, "expected KEY VALUE", line));
        };
        let value: u64 = kernfs::parse_uint(what, value, line)?;
        if let Some(i) = keys.iter().position(|k| *k == key) {
            found[i] = Some(value);
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
