//! Reading kernel files under a chosen root: where /proc and /sys are (`--path.procfs`,
//! `--path.sysfs`), one parse error, one integer rule and one read error naming the path.
//!
//! The parsers of `vm.rs` and `blockdev.rs` are pure functions on `&str` returning
//! [`ParseError`]; [`read_parse`] joins them to the file, so every failure names the file.

use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use thiserror::Error;

/// Where procfs is mounted unless `--path.procfs` says otherwise.
pub const DEFAULT_PROCFS: &str = "/proc";
/// Where sysfs is mounted unless `--path.sysfs` says otherwise.
pub const DEFAULT_SYSFS: &str = "/sys";

/// Where the agent reads the kernel's state: the host's /proc and /sys, or (in a
/// container with the host's trees mounted elsewhere, or in tests) other directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roots {
    pub proc_root: PathBuf,
    pub sys_root: PathBuf,
}

impl Default for Roots {
    fn default() -> Roots {
        Roots {
            proc_root: PathBuf::from(DEFAULT_PROCFS),
            sys_root: PathBuf::from(DEFAULT_SYSFS),
        }
    }
}

/// Kernel text that is not in the format the kernel writes.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid {what}: {reason} (read {input:?})")]
pub struct ParseError {
    /// What was being parsed: a file (`inflight`, `sync_completed`) or a key (`nr_dirty`).
    pub what: &'static str,
    pub reason: &'static str,
    /// The offending text, cut short so a garbage file cannot flood the log.
    pub input: String,
}

impl ParseError {
    /// Longest input kept, in characters; longer input ends in `…`.
    pub const MAX_INPUT: usize = 64;

    pub fn new(what: &'static str, reason: &'static str, input: &str) -> Self {
        let input = match input.char_indices().nth(Self::MAX_INPUT) {
            Some((cut, _)) => format!("{}…", &input[..cut]),
            None => input.to_owned(),
        };
        ParseError {
            what,
            reason,
            input,
        }
    }
}

/// A kernel file that could not be read, or whose text did not parse.
#[derive(Debug, Error)]
pub enum ReadError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: {source}")]
    Parse { path: PathBuf, source: ParseError },
}

impl ReadError {
    /// The file that failed.
    pub fn path(&self) -> &Path {
        match self {
            ReadError::Io { path, .. } | ReadError::Parse { path, .. } => path,
        }
    }

    /// True when the file does not exist (an optional attribute, a vanished device).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ReadError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// The one integer rule for kernel text: unsigned decimal digits with surrounding
/// whitespace trimmed; no sign (`str::parse` alone would take `+5`), no overflow.
/// `input` is the whole text, quoted in the error.
pub fn parse_uint<T: FromStr>(
    what: &'static str,
    field: &str,
    input: &str,
) -> Result<T, ParseError> {
    let field = field.trim();
    if field.is_empty() || !field.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseError::new(
            what,
            "expected a non-negative integer",
            input,
        ));
    }
    field
        .parse()
        .map_err(|_| ParseError::new(what, "integer out of range", input))
}

/// What a read of a kernel file asks for first: /proc/vmstat (about 4.5 KiB) in one
/// read.
const FIRST_READ: usize = 8192;

/// A kernel file whole, in as few reads as its size allows. `fs::read_to_string` asks
/// the file's size first (a `statx`, which says 0 for procfs and sysfs) and then reads
/// in steps from 32 bytes up: ten reads for /proc/vmstat, which the sampler reads every
/// second.
fn read_whole(path: &Path) -> std::io::Result<String> {
    use std::io::Read as _;
    let mut f = std::fs::File::open(path)?;
    let mut buf = Vec::new();
    let len = read_to_end(&mut buf, |b, _| f.read(b))?;
    buf.truncate(len);
    String::from_utf8(buf).map_err(invalid_data)
}

/// Reads into `buf` (grown as needed, from [`FIRST_READ`] up) until `read` returns 0;
/// `read(into, offset)` reads at `offset`, the count so far. The length read.
fn read_to_end(
    buf: &mut Vec<u8>,
    mut read: impl FnMut(&mut [u8], u64) -> io::Result<usize>,
) -> io::Result<usize> {
    if buf.len() < FIRST_READ {
        buf.resize(FIRST_READ, 0);
    }
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(2 * len, 0);
        }
        match read(&mut buf[len..], len as u64) {
            Ok(0) => return Ok(len),
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Kernel text that is not UTF-8, as the read error it is reported as.
fn invalid_data(e: impl std::error::Error + Send + Sync + 'static) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Reads a kernel file whole and parses it; errors carry the path.
pub fn read_parse<T>(
    path: &Path,
    parse: impl FnOnce(&str) -> Result<T, ParseError>,
) -> Result<T, ReadError> {
    let text = read_whole(path).map_err(|source| ReadError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse(&text).map_err(|source| ReadError::Parse {
        path: path.to_owned(),
        source,
    })
}

/// A kernel file the sampler reads every second, kept open and read again from its
/// start: procfs and sysfs generate a file anew for a read at offset 0, so a `pread`
/// there gives what a fresh open would, without the path walk, the open and the close
/// (BENCHMARKS.md, "CPU at the syscall floor"). A read that fails on the kept
/// descriptor (a device removed, or removed and added again under its name) is tried
/// once more on a fresh open, whose error is the one reported.
pub struct KeptOpen {
    path: PathBuf,
    file: Option<std::fs::File>,
    /// The last read's text is `buf[..len]`; the buffer is kept for the next.
    buf: Vec<u8>,
    len: usize,
}

impl KeptOpen {
    /// Opens nothing yet: the first read does.
    pub fn new(path: PathBuf) -> KeptOpen {
        KeptOpen {
            path,
            file: None,
            buf: Vec::new(),
            len: 0,
        }
    }

    /// Reads the file whole from its start and parses it; errors carry the path.
    pub fn read_parse<T>(
        &mut self,
        parse: impl FnOnce(&str) -> Result<T, ParseError>,
    ) -> Result<T, ReadError> {
        let kept = self.file.is_some();
        let mut read = self.read_again();
        if read.is_err() && kept {
            self.file = None;
            read = self.read_again();
        }
        if let Err(source) = read {
            self.file = None;
            return Err(ReadError::Io {
                path: self.path.clone(),
                source,
            });
        }
        let text = std::str::from_utf8(&self.buf[..self.len]).map_err(|e| ReadError::Io {
            path: self.path.clone(),
            source: invalid_data(e),
        })?;
        parse(text).map_err(|source| {
            // Opened afresh next time: a file replaced under its name (a tree of plain
            // files given as --path.procfs) reads as the old one through the kept
            // descriptor.
            self.file = None;
            ReadError::Parse {
                path: self.path.clone(),
                source,
            }
        })
    }

    /// Reads the whole file into `buf` from offset 0, opening it first when not open,
    /// until a read returns 0. A short read is not the end: seq_file hands out at most
    /// one page of records per read (/proc/vmstat is about 4 KiB, more on some kernels),
    /// and the read at the end continues from where the last one stopped, so it costs
    /// one quick `pread`.
    fn read_again(&mut self) -> io::Result<()> {
        use std::os::unix::fs::FileExt as _;
        if self.file.is_none() {
            self.file = Some(std::fs::File::open(&self.path)?);
        }
        let f = self.file.as_ref().expect("opened above");
        self.len = read_to_end(&mut self.buf, |b, offset| f.read_at(b, offset))?;
        Ok(())
    }
}

/// Like [`read_parse`], with a missing file as None: attributes that only some kernels,
/// levels or devices have.
pub fn read_parse_optional<T>(
    path: &Path,
    parse: impl FnOnce(&str) -> Result<T, ParseError>,
) -> Result<Option<T>, ReadError> {
    match read_parse(path, parse) {
        Ok(value) => Ok(Some(value)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_rule() {
        let p = |s: &str| parse_uint::<u64>("n", s, s);
        assert_eq!(p("0"), Ok(0));
        assert_eq!(p(" 42\n"), Ok(42));
        assert_eq!(p("18446744073709551615"), Ok(u64::MAX));
        for bad in [
            "",
            " \n",
            "+5",
            "-1",
            "1.5",
            "0x10",
            "1 2",
            "١",
            "18446744073709551616",
        ] {
            assert!(p(bad).is_err(), "{bad:?} accepted");
        }
        let e = parse_uint::<u32>("degraded", "4294967296", "4294967296\n").unwrap_err();
        assert_eq!(e.reason, "integer out of range");
        assert_eq!(e.input, "4294967296\n");
    }

    /// A file `f` holding `text` in a fresh directory (removed when the guard drops),
    /// kept open.
    fn kept_file(text: &str) -> (tempfile::TempDir, PathBuf, KeptOpen) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, text).unwrap();
        let f = KeptOpen::new(path.clone());
        (dir, path, f)
    }

    /// The file's number, as the sampler's attributes are read.
    fn read(f: &mut KeptOpen) -> Result<u64, ReadError> {
        f.read_parse(|t| parse_uint::<u64>("f", t, t))
    }

    #[test]
    fn a_kept_file_reads_its_current_text_and_reopens_a_replaced_one() {
        let (_dir, path, mut f) = kept_file("1\n");
        assert_eq!(read(&mut f).unwrap(), 1);
        // Longer than the first read, and written in place: read again from the start.
        let long = format!("{}\n", "9".repeat(FIRST_READ + 10));
        std::fs::write(&path, &long).unwrap();
        assert_eq!(f.read_parse(|t| Ok(t.len())).unwrap(), long.len());
        std::fs::write(&path, "2\n").unwrap();
        assert_eq!(read(&mut f).unwrap(), 2);
        // Gone: the error names the path; back: opened again.
        std::fs::remove_file(&path).unwrap();
        // The kept descriptor still reads the unlinked file; a sysfs attribute of a
        // removed device fails instead (ENODEV), which is what reopening is for.
        assert_eq!(read(&mut f).unwrap(), 2);
        let mut fresh = KeptOpen::new(path.clone());
        let e = read(&mut fresh).unwrap_err();
        assert!(e.is_not_found() && e.path() == path, "{e}");
        std::fs::write(&path, "3\n").unwrap();
        assert_eq!(read(&mut fresh).unwrap(), 3);
    }

    #[test]
    fn a_kept_proc_file_is_generated_anew_at_each_read() {
        // This thread's run time, read twice through one descriptor with 20 ms of
        // spinning between: the second read must be a fresh text, not the first again.
        let mut f = KeptOpen::new(PathBuf::from("/proc/thread-self/schedstat"));
        let run_ns = |f: &mut KeptOpen| {
            f.read_parse(|t| parse_uint::<u64>("schedstat", t.split(' ').next().unwrap(), t))
                .unwrap()
        };
        let a = run_ns(&mut f);
        let t0 = std::time::Instant::now();
        while t0.elapsed() < std::time::Duration::from_millis(20) {
            std::hint::black_box(0u64);
        }
        let b = run_ns(&mut f);
        assert!(b > a, "run time {a} then {b}: not read anew");
    }

    #[test]
    fn a_kept_file_that_fails_to_parse_is_opened_afresh() {
        let (_dir, path, mut f) = kept_file("x\n");
        assert!(read(&mut f).is_err());
        // Replaced under its name, as a tree of plain files given as --path.procfs may
        // be: the kept descriptor would read the old file.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "5\n").unwrap();
        assert_eq!(read(&mut f).unwrap(), 5);
    }

    #[test]
    fn a_kept_proc_file_longer_than_a_page_is_read_whole() {
        // seq_file hands out a page of records per read: /proc/slabinfo (one line per
        // cache, ~4 KiB a read, several reads long) must come back whole, as many lines
        // as a fresh read of it has. Root only (0400); CI runs as root.
        let fresh = match std::fs::read_to_string("/proc/slabinfo") {
            Ok(t) => t,
            Err(e)
                if e.kind() == io::ErrorKind::PermissionDenied
                    && std::env::var_os("CI").is_none() =>
            {
                eprintln!("skipped: /proc/slabinfo needs root ({e})");
                return;
            }
            Err(e) => panic!("/proc/slabinfo: {e}"),
        };
        assert!(
            fresh.len() > 4096,
            "{} bytes: not longer than a page",
            fresh.len()
        );
        let mut f = KeptOpen::new(PathBuf::from("/proc/slabinfo"));
        for _ in 0..2 {
            let (len, lines) = f.read_parse(|t| Ok((t.len(), t.lines().count()))).unwrap();
            assert!(len > 4096, "{len} bytes");
            assert_eq!(lines, fresh.lines().count());
        }
    }

    #[test]
    fn a_kept_sysfs_attribute_is_generated_anew_at_each_read() {
        // The loopback device's packet counter, a kernfs attribute as a disk's
        // `inflight` is: one datagram to ourselves between two reads through one
        // descriptor must show.
        let mut f = KeptOpen::new(PathBuf::from("/sys/class/net/lo/statistics/tx_packets"));
        let packets = |f: &mut KeptOpen| f.read_parse(|t| parse_uint::<u64>("tx", t, t)).unwrap();
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let a = packets(&mut f);
        tx.send_to(b"x", rx.local_addr().unwrap()).unwrap();
        rx.recv(&mut [0u8; 8]).unwrap();
        let b = packets(&mut f);
        assert!(b > a, "tx_packets {a} then {b}: not read anew");
    }

    #[test]
    fn parse_error_cuts_long_input_on_a_char_boundary() {
        let e = ParseError::new("x", "bad", &"é".repeat(1000));
        assert_eq!(e.input.chars().count(), ParseError::MAX_INPUT + 1);
        assert!(e.input.ends_with('…'));
        assert_eq!(ParseError::new("x", "bad", "short").input, "short");
        assert_eq!(
            ParseError::new("inflight", "expected two counts", "7\n").to_string(),
            r#"invalid inflight: expected two counts (read "7\n")"#
        );
    }

    #[test]
    fn read_errors_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let e = read_parse(&missing, |t| parse_uint::<u64>("nope", t, t)).unwrap_err();
        assert!(e.is_not_found());
        assert_eq!(e.path(), missing);
        assert!(e
            .to_string()
            .starts_with(&format!("{}: ", missing.display())));
        assert_eq!(
            read_parse_optional(&missing, |t| parse_uint::<u64>("nope", t, t)).unwrap(),
            None
        );

        let bad = dir.path().join("bad");
        std::fs::write(&bad, "+5\n").unwrap();
        let e = read_parse_optional(&bad, |t| parse_uint::<u64>("bad", t, t)).unwrap_err();
        assert!(!e.is_not_found());
        assert_eq!(
            e.to_string(),
            format!(
                r#"{}: invalid bad: expected a non-negative integer (read "+5\n")"#,
                bad.display()
            )
        );
        std::fs::write(&bad, "17\n").unwrap();
        assert_eq!(
            read_parse(&bad, |t| parse_uint::<u64>("bad", t, t)).unwrap(),
            17
        );
    }

    #[test]
    fn default_roots_are_the_host_mounts() {
        let r = Roots::default();
        assert_eq!(r.proc_root, Path::new("/proc"));
        assert_eq!(r.sys_root, Path::new("/sys"));
    }
}
