//! Per-process bytes written, from `PROC/PID/io` (`write_bytes`: the bytes the process
//! caused to be sent to storage, counted when it dirties page cache for buffered writes).
//!
//! The file is readable only with ptrace access to the process: all of them as root, the
//! agent's own user's otherwise. Unreadable processes are skipped and counted; nothing
//! here is required for the rest of the evidence.

use std::collections::HashMap;
use std::io::Read as _;
use std::path::Path;

use crate::kernel::kernfs::{self, ParseError};

/// The most processes read per pass.
pub const MAX_PROCESSES: usize = 32768;

/// Parses `io`: `write_bytes` less `cancelled_write_bytes` (dirty pages truncated before
/// writeback were never written). Every line must be `key: value`.
pub fn parse_io(text: &str) -> Result<u64, ParseError> {
    const WHAT: &str = "io";
    let (mut write, mut cancelled) = (None, None);
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            return Err(ParseError::new(WHAT, "expected key: value", line));
        };
        let value: u64 = kernfs::parse_uint(WHAT, value, line)?;
        match key {
            "write_bytes" => write = Some(value),
            "cancelled_write_bytes" => cancelled = Some(value),
            _ => {}
        }
    }
    let write = write.ok_or_else(|| ParseError::new("write_bytes", "missing", text))?;
    Ok(write.saturating_sub(cancelled.unwrap_or(0)))
}

/// One pass over the processes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcReading {
    /// PID → bytes written since the process started.
    pub written: HashMap<u32, u64>,
    /// Processes whose `io` could not be read (no permission) or parsed.
    pub unreadable: usize,
    pub capped: bool,
}

/// Reads `write_bytes` of every process under `proc_root`, up to `cap`.
pub fn read(proc_root: &Path, cap: usize) -> ProcReading {
    let mut out = ProcReading::default();
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return out;
    };
    let mut buf = String::new();
    let mut path = proc_root.to_path_buf();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if out.written.len() + out.unreadable == cap {
            out.capped = true;
            break;
        }
        path.push(&name);
        path.push("io");
        buf.clear();
        let read = std::fs::File::open(&path).and_then(|mut f| f.read_to_string(&mut buf));
        path.pop();
        path.pop();
        match read.ok().and_then(|_| parse_io(&buf).ok()) {
            Some(w) => {
                out.written.insert(pid, w);
            }
            None => out.unreadable += 1,
        }
    }
    out
}

/// The process's command name (`comm`), or `?` when it is gone.
pub fn comm(proc_root: &Path, pid: u32) -> String {
    std::fs::read_to_string(proc_root.join(pid.to_string()).join("comm"))
        .map(|c| c.trim_end_matches('\n').to_owned())
        .unwrap_or_else(|_| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const IO: &str = "rchar: 4294\nwchar: 104857600\nsyscr: 12\nsyscw: 25600\nread_bytes: 0\nwrite_bytes: 104857600\ncancelled_write_bytes: 4096\n";

    #[test]
    fn io_write_bytes_less_cancelled() {
        assert_eq!(parse_io(IO), Ok(104853504));
        assert_eq!(parse_io("write_bytes: 7\n"), Ok(7));
        for bad in [
            "",
            "rchar: 1\n",
            "write_bytes 7\n",
            "write_bytes: -7\n",
            "write_bytes: 7\nwchar: x\n",
        ] {
            assert!(parse_io(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn reads_a_fake_proc_tree() {
        let dir = tempfile::tempdir().unwrap();
        for (pid, io) in [("1", IO), ("22", "write_bytes: 5\n"), ("333", "garbage\n")] {
            std::fs::create_dir(dir.path().join(pid)).unwrap();
            std::fs::write(dir.path().join(pid).join("io"), io).unwrap();
        }
        std::fs::write(dir.path().join("22/comm"), "dd\n").unwrap();
        std::fs::create_dir(dir.path().join("self")).unwrap();
        let r = read(dir.path(), MAX_PROCESSES);
        assert_eq!(r.written, HashMap::from([(1, 104853504), (22, 5)]));
        assert_eq!(r.unreadable, 1);
        assert!(!r.capped);
        assert_eq!(comm(dir.path(), 22), "dd");
        assert_eq!(comm(dir.path(), 4), "?");
        assert!(read(dir.path(), 1).capped);
    }
}
