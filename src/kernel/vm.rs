//! The kernel's dirty-page and writeback state: parsers for `/proc/vmstat`,
//! `/proc/pressure/io` and the `vm.dirty_*` sysctls (pure), and one sample read from a
//! given procfs root.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::kernel::kernfs::{self, KeptOpen, ParseError, ReadError};

/// The writeback counters of `/proc/vmstat`, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VmCounters {
    pub dirty_bytes: u64,
    pub writeback_bytes: u64,
    pub dirty_threshold_bytes: u64,
    pub dirty_background_threshold_bytes: u64,
    pub dirtied_bytes: u64,
    pub written_bytes: u64,
}

/// `/proc/pressure/io` totals, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct IoPressureTotals {
    pub some_seconds: f64,
    pub full_seconds: f64,
}

/// The `vm.dirty_*` sysctls in base units: ratios 0–1, bytes, seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DirtySysctls {
    pub dirty_ratio: f64,
    pub dirty_background_ratio: f64,
    pub dirty_bytes: u64,
    pub dirty_background_bytes: u64,
    pub dirty_expire_seconds: f64,
    pub dirty_writeback_seconds: f64,
}

/// One reading of the kernel's state.
#[derive(Debug, Clone, Copy)]
pub struct VmSample {
    pub at: Instant,
    pub counters: VmCounters,
    /// None on kernels without PSI (or with it disabled).
    pub pressure: Option<IoPressureTotals>,
    pub sysctls: Option<DirtySysctls>,
}

/// Parses `/proc/vmstat` text; `page_size` converts pages to bytes.
pub fn parse_vmstat(text: &str, page_size: u64) -> Result<VmCounters, ParseError> {
    // A scan for the six keys, not a map of all ~200: the sampler runs every second.
    const KEYS: [&str; 6] = [
        "nr_dirty",
        "nr_writeback",
        "nr_dirty_threshold",
        "nr_dirty_background_threshold",
        "nr_dirtied",
        "nr_written",
    ];
    let mut found: [Option<u64>; 6] = [None; 6];
    for line in text.lines() {
        let mut parts = line.split_ascii_whitespace();
        let (Some(key), Some(value)) = (parts.next(), parts.next()) else {
            if line.trim().is_empty() {
                continue;
            }
            return Err(ParseError::new("vmstat", "expected KEY VALUE", line));
        };
        let Some(i) = KEYS.iter().position(|k| *k == key) else {
            continue;
        };
        let pages: u64 = kernfs::parse_uint(KEYS[i], value, line)?;
        let bytes = pages
            .checked_mul(page_size)
            .ok_or_else(|| ParseError::new(KEYS[i], "out of range in bytes", line))?;
        found[i] = Some(bytes);
    }
    let get = |i: usize| found[i].ok_or_else(|| ParseError::new(KEYS[i], "missing", text));
    Ok(VmCounters {
        dirty_bytes: get(0)?,
        writeback_bytes: get(1)?,
        dirty_threshold_bytes: get(2)?,
        dirty_background_threshold_bytes: get(3)?,
        dirtied_bytes: get(4)?,
        written_bytes: get(5)?,
    })
}

/// Parses `/proc/pressure/io` text (totals are in microseconds there).
///
/// Parsed here rather than by procfs, whose parser slices lines by byte offset and
/// panics on a short or non-ASCII line.
pub fn parse_pressure(text: &str) -> Result<IoPressureTotals, ParseError> {
    const WHAT: &str = "pressure/io";
    let total = |kind: &str| -> Result<u64, ParseError> {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(kind))
            .ok_or_else(|| ParseError::new(WHAT, "expected a `some` and a `full` line", text))?;
        let value = line
            .split_whitespace()
            .find_map(|f| f.strip_prefix("total="))
            .ok_or_else(|| ParseError::new(WHAT, "line without total=", line))?;
        kernfs::parse_uint(WHAT, value, line)
    };
    Ok(IoPressureTotals {
        some_seconds: total("some")? as f64 / 1e6,
        full_seconds: total("full")? as f64 / 1e6,
    })
}

/// Reads the `vm.dirty_*` sysctls from `PROC/sys/vm`.
pub fn read_sysctls(proc_root: &Path) -> Result<DirtySysctls, ReadError> {
    let dir = proc_root.join("sys/vm");
    let get = |name: &'static str| -> Result<u64, ReadError> {
        kernfs::read_parse(&dir.join(name), |t| kernfs::parse_uint(name, t, t))
    };
    Ok(DirtySysctls {
        dirty_ratio: get("dirty_ratio")? as f64 / 100.0,
        dirty_background_ratio: get("dirty_background_ratio")? as f64 / 100.0,
        dirty_bytes: get("dirty_bytes")?,
        dirty_background_bytes: get("dirty_background_bytes")?,
        dirty_expire_seconds: get("dirty_expire_centisecs")? as f64 / 100.0,
        dirty_writeback_seconds: get("dirty_writeback_centisecs")? as f64 / 100.0,
    })
}

/// The files under `PROC` read at every sample, kept open between samples.
pub struct VmFiles {
    proc_root: PathBuf,
    vmstat: KeptOpen,
    pressure: KeptOpen,
}

impl VmFiles {
    pub fn new(proc_root: &Path) -> VmFiles {
        VmFiles {
            proc_root: proc_root.to_owned(),
            vmstat: KeptOpen::new(proc_root.join("vmstat")),
            pressure: KeptOpen::new(proc_root.join("pressure/io")),
        }
    }
}

/// Takes one sample of the files under `PROC`. vmstat is required; pressure and sysctls are
/// optional (a kernel without PSI, a container hiding /proc/sys), so their absence is
/// not an error.
/// `with_sysctls` false skips the six sysctl files: they change rarely, and the
/// thresholds that follow from them are in vmstat every time.
pub fn sample(
    files: &mut VmFiles,
    page_size: u64,
    with_sysctls: bool,
) -> Result<VmSample, ReadError> {
    let counters = files.vmstat.read_parse(|t| parse_vmstat(t, page_size))?;
    let pressure = files.pressure.read_parse(parse_pressure).ok();
    let sysctls = if with_sysctls {
        read_sysctls(&files.proc_root).ok()
    } else {
        None
    };
    Ok(VmSample {
        at: Instant::now(),
        counters,
        pressure,
        sysctls,
    })
}

/// The system's page size, for converting vmstat's page counts.
pub fn page_size() -> u64 {
    rustix::param::page_size() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/proc")
    }

    #[test]
    fn vmstat_fixture() {
        let text = std::fs::read_to_string(fixtures().join("vmstat")).unwrap();
        let c = parse_vmstat(&text, 4096).unwrap();
        assert!(c.dirty_threshold_bytes > 0);
        assert!(c.dirty_background_threshold_bytes > 0);
        assert!(c.dirty_background_threshold_bytes <= c.dirty_threshold_bytes);
        assert!(c.dirtied_bytes >= c.dirty_bytes);
        assert_eq!(c.dirty_bytes % 4096, 0);
    }

    #[test]
    fn vmstat_literal_and_page_size() {
        let text = "nr_dirty 3\nnr_writeback 1\nnr_dirty_threshold 100\n\
                    nr_dirty_background_threshold 50\nnr_dirtied 1000\nnr_written 900\n";
        let c = parse_vmstat(text, 16384).unwrap();
        assert_eq!(c.dirty_bytes, 3 * 16384);
        assert_eq!(c.writeback_bytes, 16384);
        assert_eq!(c.dirty_threshold_bytes, 100 * 16384);
        assert_eq!(c.written_bytes, 900 * 16384);
    }

    #[test]
    fn vmstat_malformed() {
        for bad in [
            "",
            "nr_dirty 3\n",
            "nr_dirty x\n",
            "nr_dirty\n",
            "nr_dirty -3\nnr_writeback 1\nnr_dirty_threshold 100\nnr_dirty_background_threshold 50\nnr_dirtied 1\nnr_written 1\n",
            // Overflows u64 once in bytes (found by tests/it/fuzz.rs).
            "nr_dirty 9223372036854775807\nnr_writeback 1\nnr_dirty_threshold 100\nnr_dirty_background_threshold 50\nnr_dirtied 1\nnr_written 1\n",
        ] {
            assert!(parse_vmstat(bad, 4096).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn pressure_fixture_and_literal() {
        let text = std::fs::read_to_string(fixtures().join("pressure/io")).unwrap();
        let p = parse_pressure(&text).unwrap();
        assert!(p.some_seconds >= p.full_seconds);
        let p = parse_pressure(
            "some avg10=1.00 avg60=0.50 avg300=0.10 total=2500000\n\
             full avg10=0.50 avg60=0.20 avg300=0.05 total=1500000\n",
        )
        .unwrap();
        assert_eq!(p.some_seconds, 2.5);
        assert_eq!(p.full_seconds, 1.5);
    }

    #[test]
    fn pressure_malformed() {
        for bad in [
            "",
            "some avg10=1.00 avg60=0.50 avg300=0.10 total=1\n",
            "some total=x\nfull total=y\n",
            "garbage\nmore garbage\n",
            // procfs panicked on these (found by tests/it/fuzz.rs).
            "some\nfull\n",
            "some avg10=0.00 total=1\nfull\u{a1} avg10=0.00 total=2\n",
        ] {
            assert!(parse_pressure(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn sysctls_in_base_units() {
        let s = read_sysctls(&fixtures()).unwrap();
        assert!(s.dirty_ratio > 0.0 && s.dirty_ratio <= 1.0);
        assert!(s.dirty_expire_seconds > 0.0);
        let parse_num = |t: &str| kernfs::parse_uint::<u64>("dirty_ratio", t, t);
        assert!(parse_num("-1").is_err());
        assert!(parse_num("").is_err());
    }

    #[test]
    fn sysctl_of_another_format_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let vm = dir.path().join("sys/vm");
        std::fs::create_dir_all(&vm).unwrap();
        for f in std::fs::read_dir(fixtures().join("sys/vm")).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, vm.join(f.file_name().unwrap())).unwrap();
        }
        read_sysctls(dir.path()).unwrap();
        for bad in ["-1\n", "", "+20\n", "20 %\n"] {
            std::fs::write(vm.join("dirty_ratio"), bad).unwrap();
            let e = read_sysctls(dir.path()).unwrap_err();
            assert!(e.path().ends_with("sys/vm/dirty_ratio"), "{e}");
            assert!(e.to_string().contains("invalid dirty_ratio"), "{e}");
        }
    }

    #[test]
    fn vmstat_errors_name_the_key() {
        let full = "nr_dirty 3\nnr_writeback 1\nnr_dirty_threshold 100\n\
                    nr_dirty_background_threshold 50\nnr_dirtied 1000\nnr_written 900\n";
        // The one integer rule: no sign, not even `+`.
        let e = parse_vmstat(&full.replace("nr_dirty 3", "nr_dirty +3"), 4096).unwrap_err();
        assert_eq!(e.what, "nr_dirty");
        assert_eq!(e.input, "nr_dirty +3");
        let e = parse_vmstat(&full.replace("nr_written 900\n", ""), 4096).unwrap_err();
        assert_eq!((e.what, e.reason), ("nr_written", "missing"));
    }

    #[test]
    fn sample_from_fixture_root_and_missing_root() {
        let s = sample(&mut VmFiles::new(&fixtures()), 4096, true).unwrap();
        assert!(s.pressure.is_some());
        assert!(s.sysctls.is_some());
        let e = sample(&mut VmFiles::new(Path::new("/nonexistent")), 4096, true).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/vmstat"));
    }
}
