//! `stallwatch probe` driven end to end: the real binary on XFS loop filesystems (and on
//! tmpfs and ramfs for direct I/O), its text and JSON output, its exit codes, the live
//! notice while a call is blocked by an fsfreeze, and Ctrl-C.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::cmd::{run, run_cmd};
use crate::support::loopfs::LoopFs;
use crate::support::machine;
use crate::support::mounts::mounted_at;
use crate::support::root::require_root;
use crate::support::wait::wait_until;

const BIN: &str = env!("CARGO_BIN_EXE_stallwatch");

/// The ops each mode times, in order (`--sync fsync`).
const MODES: [(&str, &[&str]); 4] = [
    ("create", &["create", "close", "unlink"]),
    ("overwrite", &["write", "fsync"]),
    ("direct", &["write"]),
    (
        "replace",
        &["create", "write", "fsync", "rename", "dirsync"],
    ),
];

const SUMMARY_FIELDS: [&str; 7] = ["count", "min", "mean", "p50", "p90", "p99", "max"];

// ---------------------------------------------------------------------------------------
// The probe process
// ---------------------------------------------------------------------------------------

/// Lines of one output stream, each with the moment the test read it.
type Lines = Arc<Mutex<Vec<(Instant, String)>>>;

fn collect(stream: impl Read + Send + 'static) -> (Lines, JoinHandle<()>) {
    let lines: Lines = Arc::default();
    let sink = Arc::clone(&lines);
    let h = thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            sink.lock().unwrap().push((Instant::now(), line));
        }
    });
    (lines, h)
}

/// `stallwatch probe ARGS` running in the background, its output read line by line.
/// Dropping it kills it; a child blocked in a frozen filesystem cannot die before the
/// thaw, so it is then reaped by a background thread instead of waited for.
struct Probe {
    child: Option<Child>,
    pid: u32,
    out: Lines,
    err: Lines,
    readers: Vec<JoinHandle<()>>,
}

/// A finished run.
#[derive(Debug)]
struct Done {
    code: Option<i32>,
    out: String,
    err: String,
}

impl Probe {
    fn start(args: &[&str]) -> Probe {
        let mut child = Command::new(BIN)
            .arg("probe")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
        let (out, h1) = collect(child.stdout.take().unwrap());
        let (err, h2) = collect(child.stderr.take().unwrap());
        Probe {
            pid: child.id(),
            child: Some(child),
            out,
            err,
            readers: vec![h1, h2],
        }
    }

    fn text(lines: &Lines) -> String {
        let v = lines.lock().unwrap();
        v.iter().map(|(_, l)| format!("{l}\n")).collect()
    }

    fn stdout(&self) -> String {
        Probe::text(&self.out)
    }

    fn stderr(&self) -> String {
        Probe::text(&self.err)
    }

    /// The first line of stdout (or stderr) matching `pred`, waiting up to `timeout`.
    fn wait_line(
        &self,
        stderr: bool,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Option<(Instant, String)> {
        let lines = if stderr { &self.err } else { &self.out };
        let mut found = None;
        wait_until(timeout, Duration::from_millis(20), || {
            found = lines.lock().unwrap().iter().find(|(_, l)| pred(l)).cloned();
            found.is_some()
        });
        found
    }

    fn count_lines(&self, pred: impl Fn(&str) -> bool) -> usize {
        self.out
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, l)| pred(l))
            .count()
    }

    fn try_status(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    fn sigint(&self) {
        let pid = rustix::process::Pid::from_raw(self.pid as i32).expect("a child's pid");
        rustix::process::kill_process(pid, rustix::process::Signal::INT).expect("kill -INT");
    }

    /// Waits up to `timeout` for the exit; panics (with the output so far) when it
    /// does not come.
    fn finish(mut self, timeout: Duration) -> Done {
        let mut status = None;
        wait_until(timeout, Duration::from_millis(20), || {
            status = self.try_status();
            status.is_some()
        });
        let Some(status) = status else {
            panic!(
                "probe did not exit within {timeout:?}\nstdout:\n{}\nstderr:\n{}",
                self.stdout(),
                self.stderr()
            );
        };
        self.child = None;
        for h in self.readers.drain(..) {
            let _ = h.join();
        }
        Done {
            code: status.code(),
            out: self.stdout(),
            err: self.stderr(),
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = child.kill();
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        thread::spawn(move || {
            let _ = child.wait();
        });
    }
}

/// Runs `stallwatch probe ARGS` to the end (at most 60 s).
fn probe(args: &[&str]) -> Done {
    Probe::start(args).finish(Duration::from_secs(60))
}

// ---------------------------------------------------------------------------------------
// Reading the output
// ---------------------------------------------------------------------------------------

/// `85.2 us` / `1.23 ms` / `2.50 s` in seconds.
fn seconds(value: &str, unit: &str) -> f64 {
    let v: f64 = value
        .parse()
        .unwrap_or_else(|e| panic!("latency {value:?}: {e}"));
    match unit {
        "us" => v * 1e-6,
        "ms" => v * 1e-3,
        "s" => v,
        u => panic!("unknown latency unit {u:?}"),
    }
}

/// The `cycle N: ...` lines.
fn cycle_lines(out: &str) -> Vec<&str> {
    out.lines().filter(|l| l.starts_with("cycle ")).collect()
}

/// The timed ops of a cycle line with their latencies in seconds, in printed order
/// (whatever follows `FAILED:` is not an op).
fn cycle_ops(line: &str) -> Vec<(String, f64)> {
    let (_, rest) = line.split_once(':').expect("cycle N:");
    let rest = rest.split("FAILED:").next().unwrap();
    let t: Vec<&str> = rest.split_whitespace().collect();
    assert_eq!(t.len() % 3, 0, "not `op value unit` triples: {line:?}");
    t.chunks(3)
        .map(|c| (c[0].to_string(), seconds(c[1], c[2])))
        .collect()
}

/// The summary table: op -> (count, [min, mean, p50, p90, p99, max] in seconds), or
/// None for the statistics of an op that never completed (printed as `-`).
fn summary_table(out: &str) -> BTreeMap<String, (u64, Option<[f64; 6]>)> {
    let mut lines = out.lines();
    let header = ["op", "count", "min", "mean", "p50", "p90", "p99", "max"];
    lines
        .by_ref()
        .find(|l| l.split_whitespace().eq(header.iter().copied()))
        .unwrap_or_else(|| panic!("no summary header {header:?} in:\n{out}"));
    let mut table = BTreeMap::new();
    for l in lines {
        let t: Vec<&str> = l.split_whitespace().collect();
        if t.is_empty() {
            break;
        }
        let count: u64 = t[1].parse().unwrap_or_else(|_| panic!("count in {l:?}"));
        let stats = if t[2..] == ["-"; 6] {
            None
        } else {
            assert_eq!(t.len(), 14, "summary row {l:?}");
            let mut s = [0.0; 6];
            for (i, pair) in t[2..].chunks(2).enumerate() {
                s[i] = seconds(pair[0], pair[1]);
            }
            Some(s)
        };
        table.insert(t[0].to_string(), (count, stats));
    }
    table
}

fn assert_ordered(what: &str, s: [f64; 6]) {
    let [min, mean, p50, p90, p99, max] = s;
    assert!(
        min <= p50 && p50 <= p90 && p90 <= p99 && p99 <= max,
        "{what}: percentiles out of order: {s:?}"
    );
    assert!(
        min <= mean && mean <= max,
        "{what}: mean outside min..max: {s:?}"
    );
    assert!(min > 0.0, "{what}: zero latency: {s:?}");
}

fn json(out: &str) -> Value {
    serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{out}"))
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .cloned()
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// Checks the JSON contract: exactly `summary` and `cycles`; each summary entry exactly
/// the seven fields, numbers, ordered; each cycle exactly `ops`, numbers in seconds;
/// summary and cycles agreeing. Returns the number of cycles.
fn check_json(v: &Value, ops: &BTreeSet<String>, count: usize) {
    assert_eq!(keys(v), set(&["cycles", "summary"]), "top level: {v}");
    let summary = &v["summary"];
    assert_eq!(&keys(summary), ops, "summary ops: {v}");
    let cycles = v["cycles"].as_array().expect("cycles is an array");
    assert_eq!(cycles.len(), count, "cycles: {v}");
    for c in cycles {
        assert_eq!(&keys(c), ops, "cycle ops: {c}");
        for (op, secs) in c.as_object().unwrap() {
            let s = secs
                .as_f64()
                .unwrap_or_else(|| panic!("{op}: {secs} not a number"));
            assert!(
                s > 0.0 && s < 10.0,
                "{op}: {s} s is not a latency in seconds"
            );
        }
    }
    for op in ops {
        let e = &summary[op];
        assert_eq!(keys(e), set(&SUMMARY_FIELDS), "summary[{op}]: {e}");
        assert_eq!(
            e["count"].as_u64(),
            Some(count as u64),
            "summary[{op}]: {e}"
        );
        let f = |k: &str| e[k].as_f64().unwrap_or_else(|| panic!("{op}.{k}: {e}"));
        assert_ordered(
            op,
            [f("min"), f("mean"), f("p50"), f("p90"), f("p99"), f("max")],
        );
        let per_cycle: Vec<f64> = cycles.iter().map(|c| c[op].as_f64().unwrap()).collect();
        let min = per_cycle.iter().copied().fold(f64::INFINITY, f64::min);
        let max = per_cycle.iter().copied().fold(0.0, f64::max);
        assert_eq!((f("min"), f("max")), (min, max), "summary[{op}] vs cycles");
    }
}

fn probe_dir(path: &Path) -> PathBuf {
    path.join(".stallwatch")
}

fn assert_cleaned(path: &Path, what: &str) {
    assert!(
        probe_dir(path).symlink_metadata().is_err(),
        "{what}: {} left behind",
        probe_dir(path).display()
    );
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// `mount -o remount,ro` of the loop filesystem, retried: it fails with EBUSY while the
/// probe holds a file open for writing (a few milliseconds per cycle).
fn remount_ro_while_probing(fs: &mut LoopFs) {
    let mnt = s(fs.path()).to_string();
    let ours = mounted_at(fs.path()).is_some_and(|m| m.mount_source.as_deref() == Some(fs.dev()));
    assert!(ours, "{mnt} is not our loop filesystem");
    let mut last = String::new();
    for _ in 0..50 {
        match run_cmd("mount", &["-o", "remount,ro", &mnt]) {
            Ok(_) => {
                fs.remount_ro(); // already read-only: records the state for the guard
                return;
            }
            Err(e) => last = e,
        }
        thread::sleep(Duration::from_millis(20));
    }
    panic!("remount,ro kept failing: {last}");
}

/// A tmpfs or ramfs mounted in a temporary directory, unmounted on drop.
struct MemFs {
    mnt: PathBuf,
    fstype: &'static str,
    _dir: tempfile::TempDir,
}

impl MemFs {
    fn new(fstype: &'static str) -> MemFs {
        let dir = tempfile::Builder::new()
            .prefix("stallwatch-memfs-")
            .tempdir()
            .unwrap();
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let opts = if fstype == "tmpfs" {
            "size=16m,mode=0755"
        } else {
            "mode=0755"
        };
        run("mount", &["-t", fstype, "-o", opts, fstype, s(&mnt)]);
        MemFs {
            mnt,
            fstype,
            _dir: dir,
        }
    }

    /// Whether the kernel lets a file here be opened with O_DIRECT.
    fn accepts_o_direct(&self) -> Result<(), std::io::Error> {
        let f = self.mnt.join("odirect-check");
        let r = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
            .open(&f);
        let _ = std::fs::remove_file(&f);
        r.map(drop)
    }
}

impl Drop for MemFs {
    fn drop(&mut self) {
        if mounted_at(&self.mnt).is_some_and(|m| m.fs_type == self.fstype) {
            if let Err(e) = run_cmd("umount", &[s(&self.mnt)]) {
                eprintln!("MemFs drop: {e}; lazy unmount");
                let _ = run_cmd("umount", &["-l", s(&self.mnt)]);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

#[test]
fn bad_arguments_exit_2_and_write_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = s(tmp.path());
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&[dir, "--mode", "bogus"], "unknown mode"),
        (&[dir, "--count", "0"], "at least 1"),
        (&[dir, "--count", "many"], "--count"),
        (&[dir, "--size", "4bananas"], "invalid size"),
        (&[dir, "--size", "0"], "greater than zero"),
        (&[dir, "--size", "65MiB"], "64MiB"),
        (&[dir, "--interval", "soon"], "invalid duration"),
        (&[dir, "--interval", "10"], "invalid duration"),
        (&[dir, "--sync", "fsink"], "unknown sync"),
        (
            &[dir, "--mode", "create", "--mode", "create"],
            "given twice",
        ),
        (&["/nonexistent/stallwatch-probe-test"], "No such file"),
        (&[s(&file)], "not a directory"),
        (&[], "PATH"),
    ];
    for (args, why) in cases {
        let r = probe(args);
        assert_eq!(r.code, Some(2), "{args:?}: {r:?}");
        assert!(r.err.contains(why), "{args:?}: stderr lacks {why:?}: {r:?}");
        assert!(r.out.is_empty(), "{args:?}: printed to stdout: {r:?}");
    }
    let entries: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert_eq!(
        entries.len(),
        1,
        "bad arguments wrote into {dir}: {entries:?}"
    );
}

#[test]
fn every_mode_on_xfs_prints_cycles_and_summary_and_cleans_up() {
    if !require_root("every_mode_on_xfs_prints_cycles_and_summary_and_cleans_up") {
        return;
    }
    let _machine = machine::shared();
    let fs = LoopFs::new("xfs", 320);
    let path = s(fs.path());
    for (mode, ops) in MODES {
        let r = probe(&[path, "--mode", mode, "--count", "3", "--interval", "0"]);
        assert_eq!(r.code, Some(0), "{mode}: {r:?}");
        assert!(r.err.is_empty(), "{mode}: stderr: {r:?}");
        let sync = if mode == "overwrite" { "; fsync" } else { "" };
        assert_eq!(
            r.out.lines().next(),
            Some(format!("probing {path} ({mode}; 4096 bytes{sync}), 3 cycles every 0s").as_str()),
            "{mode}: header"
        );
        let cycles = cycle_lines(&r.out);
        assert_eq!(cycles.len(), 3, "{mode}: {r:?}");
        for (i, line) in cycles.iter().enumerate() {
            assert!(line.starts_with(&format!("cycle {}:", i + 1)), "{line:?}");
            let got = cycle_ops(line);
            let names: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(names, ops, "{mode}: {line:?}");
            for (op, secs) in &got {
                assert!(*secs > 0.0 && *secs < 5.0, "{mode} {op}: {secs} s");
            }
        }
        let table = summary_table(&r.out);
        let names: BTreeSet<String> = table.keys().cloned().collect();
        assert_eq!(names, set(ops), "{mode}: {r:?}");
        for (op, (count, stats)) in &table {
            assert_eq!(*count, 3, "{mode} {op}");
            assert_ordered(&format!("{mode} {op}"), stats.expect("statistics"));
        }
        assert_cleaned(fs.path(), mode);
        let left: Vec<_> = std::fs::read_dir(fs.path()).unwrap().collect();
        assert!(left.is_empty(), "{mode}: files left in the mount: {left:?}");
    }

    // All four together: ops two modes share are told apart by their mode.
    let r = probe(&[
        path,
        "--mode",
        "create",
        "--mode",
        "overwrite",
        "--mode",
        "direct",
        "--mode",
        "replace",
        "--count",
        "2",
        "--interval",
        "0",
    ]);
    assert_eq!(r.code, Some(0), "{r:?}");
    let expected = [
        "create.create",
        "close",
        "unlink",
        "overwrite.write",
        "overwrite.fsync",
        "direct.write",
        "replace.create",
        "replace.write",
        "replace.fsync",
        "rename",
        "dirsync",
    ];
    for line in cycle_lines(&r.out) {
        let names: Vec<String> = cycle_ops(line).into_iter().map(|(k, _)| k).collect();
        assert_eq!(names, expected, "{line:?}");
    }
    let table = summary_table(&r.out);
    assert_eq!(table.len(), expected.len(), "{r:?}");
    assert!(table.values().all(|(c, _)| *c == 2), "{r:?}");
    assert_cleaned(fs.path(), "all modes");
}

#[test]
fn json_has_exactly_summary_and_cycles_in_seconds() {
    if !require_root("json_has_exactly_summary_and_cycles_in_seconds") {
        return;
    }
    let _machine = machine::shared();
    let fs = LoopFs::new("xfs", 320);
    let path = s(fs.path());
    for (mode, ops) in MODES {
        let r = probe(&[
            path,
            "--mode",
            mode,
            "--count",
            "4",
            "--interval",
            "0",
            "--json",
        ]);
        assert_eq!(r.code, Some(0), "{mode}: {r:?}");
        assert!(r.err.is_empty(), "{mode}: stderr: {r:?}");
        check_json(&json(&r.out), &set(ops), 4);
        assert_cleaned(fs.path(), mode);
    }

    let r = probe(&[
        path,
        "--mode",
        "overwrite",
        "--sync",
        "fdatasync",
        "--count",
        "3",
        "--interval",
        "0",
        "--json",
    ]);
    assert_eq!(r.code, Some(0), "{r:?}");
    check_json(&json(&r.out), &set(&["write", "fdatasync"]), 3);

    let r = probe(&[
        path,
        "--mode",
        "overwrite",
        "--mode",
        "replace",
        "--count",
        "2",
        "--interval",
        "10ms",
        "--json",
    ]);
    assert_eq!(r.code, Some(0), "{r:?}");
    let ops = [
        "overwrite.write",
        "overwrite.fsync",
        "create",
        "replace.write",
        "replace.fsync",
        "rename",
        "dirsync",
    ];
    check_json(&json(&r.out), &set(&ops), 2);
    assert_cleaned(fs.path(), "json");
}

/// The byte counts the probe's `pwrite64` calls asked for, in order, under strace.
fn traced_pwrites(args: &[&str], trace: &Path) -> (Done, Vec<u64>, String) {
    let mut full = vec![
        "-f",
        "-qq",
        "-e",
        "trace=openat,pwrite64",
        "-o",
        s(trace),
        BIN,
    ];
    full.push("probe");
    full.extend_from_slice(args);
    let out = Command::new("strace")
        .args(&full)
        .stdin(Stdio::null())
        .output()
        .expect("strace is needed for this test (apt-get install strace; scripts/test does)");
    let done = Done {
        code: out.status.code(),
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    let text = std::fs::read_to_string(trace).expect("strace output");
    let sizes = text
        .lines()
        .filter(|l| l.contains("pwrite64("))
        .map(|l| {
            // pid pwrite64(3, "\0\0"..., 4096, 0) = 4096
            let args = l.rsplit_once(") =").expect("completed call").0;
            let mut it = args.rsplit(", ");
            let _offset = it.next();
            it.next()
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{l}"))
        })
        .collect();
    (done, sizes, text)
}

#[test]
fn size_reaches_the_system_calls_and_direct_writes_are_aligned() {
    if !require_root("size_reaches_the_system_calls_and_direct_writes_are_aligned") {
        return;
    }
    let _machine = machine::shared();
    let fs = LoopFs::new("xfs", 320);
    let path = s(fs.path());
    let tmp = tempfile::tempdir().unwrap();
    let trace = tmp.path().join("trace");

    let (r, sizes, _) = traced_pwrites(
        &[
            path,
            "--mode",
            "overwrite",
            "--size",
            "1MiB",
            "--count",
            "2",
            "--interval",
            "0",
        ],
        &trace,
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.out.contains("1048576 bytes"), "{r:?}");
    // Preallocation, then one timed write per cycle, all of the asked size.
    assert_eq!(sizes, [1 << 20; 3], "{r:?}");

    let (r, sizes, _) = traced_pwrites(
        &[
            path,
            "--mode",
            "replace",
            "--size",
            "8KiB",
            "--count",
            "2",
            "--interval",
            "0",
        ],
        &trace,
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    assert_eq!(sizes, [8192; 2], "{r:?}");

    // O_DIRECT: the size is rounded up to the alignment the filesystem reports for the
    // file (statx STATX_DIOALIGN), here the loop device's logical block size.
    let dev = fs.dev().trim_start_matches("/dev/");
    let lbs: u64 = std::fs::read_to_string(format!("/sys/block/{dev}/queue/logical_block_size"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let (r, sizes, text) = traced_pwrites(
        &[
            path,
            "--mode",
            "direct",
            "--size",
            "1000",
            "--count",
            "2",
            "--interval",
            "0",
        ],
        &trace,
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(
        text.lines()
            .any(|l| l.contains("direct.dat") && l.contains("O_DIRECT") && l.contains("O_DSYNC")),
        "no O_DIRECT|O_DSYNC open of direct.dat:\n{text}"
    );
    let want = 1000u64.div_ceil(lbs) * lbs;
    assert_eq!(sizes.last(), Some(&want), "timed direct writes: {sizes:?}");
    assert_eq!(
        sizes.iter().filter(|&&n| n == want).count(),
        2,
        "one direct write of {want} bytes per cycle: {sizes:?}"
    );
    assert_cleaned(fs.path(), "strace runs");
}

#[test]
fn read_only_filesystem_fails_cycles_with_exit_1() {
    if !require_root("read_only_filesystem_fails_cycles_with_exit_1") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("xfs", 320);
    let path = s(fs.path()).to_string();

    // Read-only from the start: the probe directory cannot be made.
    fs.remount_ro();
    let r = probe(&[&path, "--count", "2", "--interval", "0"]);
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(r.err.contains("EROFS"), "{r:?}");
    fs.remount_rw();
    assert_cleaned(fs.path(), "read-only start");

    // Read-only in the middle of a run: later cycles fail, the run goes on to the end.
    let p = Probe::start(&[&path, "--count", "8", "--interval", "300ms"]);
    p.wait_line(false, Duration::from_secs(10), |l| {
        l.starts_with("cycle 2:")
    })
    .unwrap_or_else(|| panic!("no cycle 2: {}{}", p.stdout(), p.stderr()));
    remount_ro_while_probing(&mut fs);
    let r = p.finish(Duration::from_secs(30));
    assert_eq!(r.code, Some(1), "{r:?}");
    let cycles = cycle_lines(&r.out);
    assert_eq!(cycles.len(), 8, "{r:?}");
    let ok = cycles.iter().filter(|l| !l.contains("FAILED")).count();
    assert!((2..8).contains(&ok), "{r:?}");
    assert!(
        cycles[7].contains("FAILED") && cycles[7].contains("EROFS"),
        "last cycle: {:?}",
        cycles[7]
    );
    assert!(
        r.out.contains(&format!("{} of 8 cycles failed", 8 - ok)),
        "{r:?}"
    );
    for (op, (count, _)) in summary_table(&r.out) {
        assert_eq!(count, ok as u64, "{op}: {r:?}");
    }
    assert!(r.err.contains("could not remove"), "{r:?}");

    // Writable again: the next run removes the leftovers and cleans up.
    fs.remount_rw();
    assert!(probe_dir(fs.path()).exists());
    let r = probe(&[&path, "--count", "1"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert_cleaned(fs.path(), "run after the read-only one");
}

/// `cycle N: OP still blocked after X s` → (N, OP, X).
fn parse_notice(line: &str) -> (u64, String, f64) {
    let parsed = (|| {
        let (cycle, rest) = line.split_once(": ")?;
        let n = cycle.strip_prefix("cycle ")?.parse().ok()?;
        let (op, after) = rest.split_once(" still blocked after ")?;
        let secs = after.strip_suffix(" s")?.parse().ok()?;
        Some((n, op.to_string(), secs))
    })();
    parsed.unwrap_or_else(|| panic!("notice {line:?}"))
}

#[test]
fn live_notice_while_a_freeze_blocks_a_write() {
    if !require_root("live_notice_while_a_freeze_blocks_a_write") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("xfs", 320);
    let path = s(fs.path()).to_string();
    let p = Probe::start(&[
        &path,
        "--mode",
        "overwrite",
        "--count",
        "3",
        "--interval",
        "1s",
    ]);
    p.wait_line(false, Duration::from_secs(10), |l| {
        l.starts_with("cycle 1:")
    })
    .unwrap_or_else(|| panic!("no cycle 1: {}{}", p.stdout(), p.stderr()));
    fs.freeze();
    let frozen = Instant::now();
    // Cycle 2 starts within 1 s, its write blocks; the notice comes 1 s later.
    let (seen, line) = p
        .wait_line(true, Duration::from_secs(4), |l| {
            l.contains("still blocked after")
        })
        .unwrap_or_else(|| panic!("no live notice: {}{}", p.stdout(), p.stderr()));
    let (cycle, op, age) = parse_notice(&line);
    assert_eq!((cycle, op.as_str()), (2, "write"), "{line:?}");
    assert!(
        (1.0..1.5).contains(&age),
        "first notice at {age} s: {line:?}"
    );
    assert!(
        seen - frozen < Duration::from_millis(2700),
        "notice came late"
    );
    // Keep it frozen long enough for a second notice, two seconds after the first.
    let second = p
        .wait_line(true, Duration::from_secs(4), |l| l.contains("after 3."))
        .unwrap_or_else(|| panic!("no second notice: {}", p.stderr()));
    assert!(second.0 - seen >= Duration::from_millis(1800), "{second:?}");
    let thawed = Instant::now();
    fs.thaw();
    let r = p.finish(Duration::from_secs(20));
    assert_eq!(r.code, Some(0), "{r:?}");
    let notices = r
        .err
        .lines()
        .filter(|l| l.contains("still blocked"))
        .count();
    assert_eq!(notices, 2, "one notice at 1 s, one at 3 s: {r:?}");
    let cycles = cycle_lines(&r.out);
    assert_eq!(cycles.len(), 3, "{r:?}");
    let write = cycle_ops(cycles[1])[0].clone();
    assert_eq!(write.0, "write");
    // It was at least `age` old when the notice was read, and blocked until the thaw.
    let blocked_at_least = age + (thawed - seen).as_secs_f64();
    assert!(
        write.1 >= blocked_at_least - 0.05 && write.1 >= 3.0,
        "blocked write reported {} s, blocked for at least {blocked_at_least} s",
        write.1
    );
    let (count, stats) = summary_table(&r.out)["write"];
    assert_eq!(count, 3);
    assert!(
        (stats.unwrap()[5] - write.1).abs() < 0.01,
        "max is the blocked write"
    );
    assert_cleaned(fs.path(), "freeze");
}

#[test]
fn live_notice_when_frozen_before_start_and_json_stays_clean() {
    if !require_root("live_notice_when_frozen_before_start_and_json_stays_clean") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("xfs", 320);
    let path = s(fs.path()).to_string();
    fs.freeze();
    let p = Probe::start(&[
        &path,
        "--mode",
        "create",
        "--count",
        "2",
        "--interval",
        "0",
        "--json",
    ]);
    let (_, line) = p
        .wait_line(true, Duration::from_secs(3), |l| {
            l.contains("still blocked after")
        })
        .unwrap_or_else(|| panic!("no live notice: {}{}", p.stdout(), p.stderr()));
    assert!(
        line.starts_with(&format!(
            "set-up of {path}/.stallwatch still blocked after 1."
        )),
        "{line:?}"
    );
    assert!(
        p.stdout().is_empty(),
        "JSON mode printed early: {}",
        p.stdout()
    );
    fs.thaw();
    let r = p.finish(Duration::from_secs(20));
    assert_eq!(r.code, Some(0), "{r:?}");
    check_json(&json(&r.out), &set(&["create", "close", "unlink"]), 2);
    assert_cleaned(fs.path(), "frozen start");
}

#[test]
fn ctrl_c_prints_the_summary_so_far() {
    if !require_root("ctrl_c_prints_the_summary_so_far") {
        return;
    }
    let _machine = machine::shared();
    let fs = LoopFs::new("xfs", 320);
    let path = s(fs.path()).to_string();

    // Back to back, so Ctrl-C nearly always lands while a call is in flight.
    let p = Probe::start(&[&path, "--count", "100000", "--interval", "0"]);
    assert!(wait_until(
        Duration::from_secs(10),
        Duration::from_millis(10),
        || p.count_lines(|l| l.starts_with("cycle ")) >= 5
    ));
    p.sigint();
    let sent = Instant::now();
    let r = p.finish(Duration::from_secs(20));
    assert!(sent.elapsed() < Duration::from_secs(3), "slow to stop");
    assert_eq!(r.code, Some(0), "{r:?}");
    let n = cycle_lines(&r.out).len();
    assert!((5..100000).contains(&n), "{n} cycles");
    assert!(
        r.out.contains(&format!("interrupted after {n} cycles")),
        "{}",
        r.out
    );
    let table = summary_table(&r.out);
    assert_eq!(table.len(), 5, "{}", r.out);
    for (op, (count, _)) in table {
        assert_eq!(count, n as u64, "{op}");
    }
    assert_cleaned(fs.path(), "Ctrl-C");

    // The same in JSON: the document covers the cycles run so far.
    let p = Probe::start(&[&path, "--count", "100000", "--interval", "0", "--json"]);
    thread::sleep(Duration::from_millis(700));
    p.sigint();
    let r = p.finish(Duration::from_secs(20));
    assert_eq!(r.code, Some(0), "{r:?}");
    let v = json(&r.out);
    let n = v["cycles"].as_array().unwrap().len();
    assert!((1..100000).contains(&n), "{n} cycles");
    check_json(
        &v,
        &set(&["create", "close", "unlink", "write", "fsync"]),
        n,
    );
    assert!(
        r.err.contains(&format!("interrupted after {n} cycles")),
        "{r:?}"
    );
    assert_cleaned(fs.path(), "Ctrl-C, JSON");
}

#[test]
fn ctrl_c_while_a_freeze_blocks_reports_at_once() {
    if !require_root("ctrl_c_while_a_freeze_blocks_reports_at_once") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("xfs", 320);
    let path = s(fs.path()).to_string();
    let mut p = Probe::start(&[
        &path,
        "--mode",
        "overwrite",
        "--count",
        "50",
        "--interval",
        "200ms",
    ]);
    p.wait_line(false, Duration::from_secs(10), |l| {
        l.starts_with("cycle 2:")
    })
    .unwrap_or_else(|| panic!("no cycle 2: {}{}", p.stdout(), p.stderr()));
    fs.freeze();
    p.wait_line(true, Duration::from_secs(4), |l| {
        l.contains("still blocked after")
    })
    .unwrap_or_else(|| panic!("no live notice: {}{}", p.stdout(), p.stderr()));
    p.sigint();
    // The summary comes while the write is still blocked, not after the thaw.
    let (_, line) = p
        .wait_line(false, Duration::from_secs(3), |l| {
            l.starts_with("interrupted after")
        })
        .unwrap_or_else(|| panic!("no summary while frozen: {}{}", p.stdout(), p.stderr()));
    let n: usize = line.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(n >= 2, "{line:?}");
    assert!(
        p.wait_line(true, Duration::from_secs(1), |l| l
            .contains("cannot be interrupted"))
            .is_some(),
        "{}",
        p.stderr()
    );
    let _ = p.try_status();
    fs.thaw();
    let r = p.finish(Duration::from_secs(20));
    assert_eq!(r.code, Some(1), "{r:?}");
    let table = summary_table(&r.out);
    assert_eq!(table["write"].0, n as u64, "{}", r.out);
    // The probe could not clean up under the freeze; the next run does.
    let r = probe(&[&path, "--count", "1"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert_cleaned(fs.path(), "after the interrupted frozen run");
}

#[test]
fn direct_mode_on_tmpfs_does_what_this_kernel_does() {
    if !require_root("direct_mode_on_tmpfs_does_what_this_kernel_does") {
        return;
    }
    let _machine = machine::shared();
    let fs = MemFs::new("tmpfs");
    let path = s(&fs.mnt);
    let r = probe(&[path, "--mode", "direct", "--count", "3", "--interval", "0"]);
    match fs.accepts_o_direct() {
        // Linux 6.6+ (commit e88e0d366f9c, "tmpfs: trivial support for direct IO").
        Ok(()) => {
            eprintln!("this kernel accepts O_DIRECT on tmpfs: the probe must run");
            assert_eq!(r.code, Some(0), "{r:?}");
            assert_eq!(cycle_lines(&r.out).len(), 3, "{r:?}");
            assert_eq!(summary_table(&r.out)["write"].0, 3, "{r:?}");
            assert!(
                r.err.contains("is tmpfs, which accepts O_DIRECT")
                    && r.err.contains("not a device"),
                "no note that tmpfs direct I/O is a memory copy: {r:?}"
            );
        }
        Err(e) => {
            eprintln!("this kernel refuses O_DIRECT on tmpfs ({e}): the probe must say so");
            assert_eq!(r.code, Some(1), "{r:?}");
            assert!(r.out.contains("does not support direct I/O"), "{r:?}");
        }
    }
    assert!(!r.err.contains("panicked"), "{r:?}");
    assert_cleaned(&fs.mnt, "tmpfs");
}

#[test]
fn direct_mode_refused_on_ramfs_says_so_and_exits_1() {
    if !require_root("direct_mode_refused_on_ramfs_says_so_and_exits_1") {
        return;
    }
    let _machine = machine::shared();
    let fs = MemFs::new("ramfs");
    let e = fs
        .accepts_o_direct()
        .expect_err("ramfs accepted O_DIRECT; this test needs a filesystem that refuses it");
    assert_eq!(
        e.raw_os_error(),
        Some(rustix::io::Errno::INVAL.raw_os_error()),
        "{e}"
    );
    let path = s(&fs.mnt);

    let r = probe(&[path, "--mode", "direct", "--count", "2", "--interval", "0"]);
    assert_eq!(r.code, Some(1), "{r:?}");
    let cycles = cycle_lines(&r.out);
    assert_eq!(cycles.len(), 2, "{r:?}");
    for line in &cycles {
        assert!(
            line.contains("FAILED: direct prepare: this filesystem does not support direct I/O")
                && line.contains("EINVAL"),
            "{line:?}"
        );
    }
    assert_eq!(summary_table(&r.out)["write"], (0, None), "{r:?}");
    assert!(r.out.contains("2 of 2 cycles failed"), "{r:?}");
    assert!(!r.err.contains("panicked"), "{r:?}");
    assert_cleaned(&fs.mnt, "ramfs");

    // JSON keeps its shape: no latencies, and the reason on stderr.
    let r = probe(&[
        path,
        "--mode",
        "direct",
        "--count",
        "2",
        "--interval",
        "0",
        "--json",
    ]);
    assert_eq!(r.code, Some(1), "{r:?}");
    assert_eq!(
        json(&r.out),
        serde_json::json!({"summary": {}, "cycles": [{}, {}]})
    );
    let failed = r
        .err
        .lines()
        .filter(|l| l.contains("does not support direct I/O"));
    assert_eq!(failed.count(), 2, "{r:?}");
    assert_cleaned(&fs.mnt, "ramfs JSON");
}
