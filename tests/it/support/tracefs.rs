//! The kernel's own timing of system calls, independent of the agent: a tracefs instance
//! of the test's own with `raw_syscalls/sys_enter` and `sys_exit` filtered on syscall
//! numbers (TESTBED.md), read at the end and paired per thread. The instance is removed
//! on drop, whatever happened; nothing outside it is touched.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// x86-64 syscall numbers.
pub const NR_FSYNC: u64 = 74;
pub const NR_FDATASYNC: u64 = 75;

/// A tracefs instance tracing the syscalls `nrs` of every thread from its start.
pub struct SyscallTrace {
    dir: PathBuf,
}

/// One traced call: the thread, the syscall, its enter and exit (seconds, the
/// monotonic clock).
#[derive(Debug, Clone, Copy)]
pub struct Call {
    pub tid: u32,
    pub nr: u64,
    pub enter: f64,
    pub exit: f64,
}

impl Call {
    pub fn seconds(&self) -> f64 {
        self.exit - self.enter
    }
}

fn tracefs() -> PathBuf {
    let root = Path::new("/sys/kernel/tracing");
    if !root.join("instances").is_dir() {
        let _ = std::process::Command::new("mount")
            .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
            .status();
    }
    assert!(
        root.join("instances").is_dir(),
        "tracefs is not mounted at /sys/kernel/tracing and could not be"
    );
    root.to_owned()
}

fn write(path: &Path, value: &str) {
    std::fs::write(path, value).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

impl SyscallTrace {
    /// Starts tracing the syscalls `nrs` in a new instance `name` (with this process's
    /// pid appended), `buffer_kb` per CPU.
    pub fn start(name: &str, nrs: &[u64], buffer_kb: u32) -> SyscallTrace {
        let dir = tracefs()
            .join("instances")
            .join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let t = SyscallTrace { dir };
        write(&t.dir.join("trace_clock"), "mono");
        write(&t.dir.join("buffer_size_kb"), &buffer_kb.to_string());
        let filter = nrs
            .iter()
            .map(|n| format!("id == {n}"))
            .collect::<Vec<_>>()
            .join(" || ");
        for ev in ["sys_enter", "sys_exit"] {
            let e = t.dir.join("events/raw_syscalls").join(ev);
            write(&e.join("filter"), &filter);
            write(&e.join("enable"), "1");
        }
        write(&t.dir.join("tracing_on"), "1");
        t
    }

    /// Stops tracing; every complete call traced, in the order of their exits.
    pub fn stop(&self) -> Vec<Call> {
        write(&self.dir.join("tracing_on"), "0");
        let text = std::fs::read_to_string(self.dir.join("trace")).unwrap();
        let mut open: HashMap<u32, (u64, f64)> = HashMap::new();
        let mut calls = Vec::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            if let Some((tid, t, kind, nr)) = parse(line) {
                match kind {
                    "sys_enter" => {
                        open.insert(tid, (nr, t));
                    }
                    _ => {
                        if let Some((n, enter)) = open.remove(&tid) {
                            if n == nr {
                                calls.push(Call {
                                    tid,
                                    nr,
                                    enter,
                                    exit: t,
                                });
                            }
                        }
                    }
                }
            }
        }
        // The ring overwrites its oldest events when full: then fewer are in the buffer
        // than were written (`# entries-in-buffer/entries-written: 812/812   #P:2`).
        let counts = text
            .lines()
            .find_map(|l| l.strip_prefix("# entries-in-buffer/entries-written: "))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|c| c.split_once('/'))
            .expect("the trace's entries line");
        assert!(
            counts.0 == counts.1 && !text.contains("LOST"),
            "the trace buffer lost events ({}/{}): raise buffer_kb",
            counts.0,
            counts.1
        );
        calls
    }
}

/// `  p0-overwrite-4242 [001] ..... 1234.567890: sys_enter: NR 74 (3, 0, …)` →
/// (4242, 1234.567890, "sys_enter", 74).
fn parse(line: &str) -> Option<(u32, f64, &str, u64)> {
    let (head, rest) = line.split_once("]")?;
    let task = head.rsplit_once('[')?.0.trim_end();
    let tid = task.rsplit_once('-')?.1.parse().ok()?;
    let mut words = rest.split_whitespace();
    // The flags column, then the timestamp with its colon.
    let t: f64 = loop {
        let w = words.next()?;
        if let Some(ts) = w.strip_suffix(':') {
            if let Ok(t) = ts.parse() {
                break t;
            }
        }
    };
    let kind = words.next()?.strip_suffix(':')?;
    if words.next()? != "NR" {
        return None;
    }
    let nr = words.next()?.parse().ok()?;
    Some((tid, t, kind, nr))
}

impl Drop for SyscallTrace {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("tracing_on"), "0");
        for ev in ["sys_enter", "sys_exit"] {
            let _ = std::fs::write(
                self.dir.join("events/raw_syscalls").join(ev).join("enable"),
                "0",
            );
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[test]
fn trace_lines_parse() {
    let enter = "  p0-overwrite-4242 [001] ..... 1234.567890: sys_enter: NR 74 (3, 0, 0, 0, 0, 0)";
    let exit = "  p0-overwrite-4242 [000] d.... 1234.569890: sys_exit: NR 74 = 0";
    assert_eq!(parse(enter), Some((4242, 1234.567890, "sys_enter", 74)));
    assert_eq!(parse(exit), Some((4242, 1234.569890, "sys_exit", 74)));
}
