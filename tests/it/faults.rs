//! Behaviour under trouble (SPEC), on real filesystems: faults counted by errno and
//! cleared by themselves, hostile probe directories, leftovers, and shutdown with and
//! without a probe blocked in the kernel.
//!
//! Every test runs a second, healthy target next to the faulty one and checks that it
//! keeps being probed without an error: a fault on one target never touches another.
//! All tests need root (loop devices, mount, fsfreeze, xfs_io, strace).

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::TcpStream;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use crate::support::agent::Agent;
use crate::support::cmd::{run, run_cmd};
use crate::support::loopfs::LoopFs;
use crate::support::machine;
use crate::support::metrics::Metrics;
use crate::support::root::require_root;
use crate::support::wait::wait_until;

/// How long any expected change may take to show (several cycles of 300 ms).
const WAIT: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(50);

/// One target in the agent's configuration.
fn target(name: &str, path: &Path, interval: &str, modes: &str) -> String {
    format!(
        "  - path: {}\n    name: {name}\n    interval: {interval}\n    modes: [{modes}]\n",
        path.display()
    )
}

fn config(targets: &[String]) -> String {
    format!("vm_interval: 1s\ntargets:\n{}", targets.concat())
}

/// The healthy companion every test runs: an ext4 probed at the same pace.
fn healthy_target(fs: &LoopFs, interval: &str) -> String {
    target("healthy", fs.path(), interval, "create, overwrite")
}

fn up(m: &Metrics, t: &str) -> Option<f64> {
    m.get("stallwatch_target_up", &[("target", t)])
}

fn read_only(m: &Metrics, t: &str) -> Option<f64> {
    m.get("stallwatch_target_read_only", &[("target", t)])
}

fn errors(m: &Metrics, t: &str, errno: &str) -> f64 {
    m.sum(
        "stallwatch_probe_errors_total",
        &[("target", t), ("errno", errno)],
    )
}

fn all_errors(m: &Metrics, t: &str) -> f64 {
    m.sum("stallwatch_probe_errors_total", &[("target", t)])
}

fn cycles(m: &Metrics, t: &str) -> f64 {
    m.sum("stallwatch_probes_total", &[("target", t)])
}

/// The error series of a target, for failure messages and the test log.
fn error_series(m: &Metrics, t: &str) -> String {
    m.series("stallwatch_probe_errors_total")
        .into_iter()
        .filter(|(l, _)| l.get("target").map(String::as_str) == Some(t))
        .map(|(l, v)| {
            format!(
                "{{mode={},op={},errno={}}} {v}",
                l["mode"], l["op"], l["errno"]
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Scrapes until `pred` holds; panics with the agent's log after `WAIT`.
fn wait_metrics(agent: &Agent, what: &str, pred: impl Fn(&Metrics) -> bool) -> Metrics {
    let deadline = Instant::now() + WAIT;
    loop {
        let m = agent.scrape();
        if pred(&m) {
            return m;
        }
        if Instant::now() >= deadline {
            panic!(
                "timed out after {WAIT:?} waiting for: {what}\nagent log tail:\n{}",
                agent.log_tail(30)
            );
        }
        thread::sleep(POLL);
    }
}

/// True when a logfmt line carries `key=value` as a whole field.
fn has_field(line: &str, key: &str, value: &str) -> bool {
    let f = format!("{key}={value}");
    line.split(' ').any(|w| w == f)
}

/// Log lines about target `t` containing every one of `words`.
fn log_count(agent: &Agent, t: &str, words: &[&str]) -> usize {
    agent
        .logs()
        .iter()
        .filter(|l| has_field(l, "target", t) && words.iter().all(|w| l.contains(w)))
        .count()
}

/// How many lines about target `t` containing every one of `words` each lane (the
/// `mode` field) logged.
fn log_count_per_lane(agent: &Agent, t: &str, words: &[&str]) -> BTreeMap<String, usize> {
    let mut per_lane = BTreeMap::new();
    for l in agent.logs() {
        if has_field(&l, "target", t) && words.iter().all(|w| l.contains(w)) {
            let mode = l
                .split(' ')
                .find_map(|w| w.strip_prefix("mode="))
                .unwrap_or("none")
                .to_owned();
            *per_lane.entry(mode).or_insert(0) += 1;
        }
    }
    per_lane
}

/// A fault was logged, once by each lane it hit, not every cycle.
fn assert_logged_once_per_lane(agent: &Agent, t: &str, words: &[&str]) {
    let per_lane = log_count_per_lane(agent, t, words);
    assert!(
        !per_lane.is_empty() && per_lane.values().all(|&n| n == 1),
        "{t}: expected one line with {words:?} per lane that failed, got {per_lane:?}; log:\n{}",
        agent.log_tail(30)
    );
}

/// The healthy target kept going: more cycles than before, up, and no error ever.
fn assert_healthy(agent: &Agent, before: &Metrics) {
    let now = wait_metrics(agent, "the healthy target to complete more cycles", |m| {
        cycles(m, "healthy") >= cycles(before, "healthy") + 2.0
    });
    assert_eq!(up(&now, "healthy"), Some(1.0), "healthy target not up");
    assert_eq!(
        all_errors(&now, "healthy"),
        0.0,
        "the healthy target has errors: {}",
        error_series(&now, "healthy")
    );
    assert_eq!(
        log_count(agent, "healthy", &["probe cycle failed"]),
        0,
        "the healthy target logged a failure"
    );
}

/// A persisting fault keeps being counted, every cycle, but is logged only once.
fn assert_persists_logged_once(agent: &Agent, t: &str, errno: &str) {
    let a = agent.scrape();
    let more = wait_metrics(agent, &format!("{t}: more {errno} errors"), |m| {
        errors(m, t, errno) >= errors(&a, t, errno) + 3.0
    });
    assert_eq!(up(&more, t), Some(0.0), "{t} came up during the fault");
    // A persisting fault is logged once by each lane it hits, not every cycle.
    assert_logged_once_per_lane(agent, t, &["probe cycle failed"]);
}

fn probe_dir(fs: &LoopFs) -> PathBuf {
    fs.path().join(".stallwatch")
}

/// Unmounts, retrying: a cycle holding the directory open for a few milliseconds makes
/// `umount` fail with EBUSY, which is the agent being careful, not stuck.
fn umount_retry(fs: &mut LoopFs) {
    for _ in 0..10 {
        if catch_unwind(AssertUnwindSafe(|| fs.umount())).is_ok() {
            return;
        }
        thread::sleep(Duration::from_millis(37));
    }
    fs.umount();
}

// ---------------------------------------------------------------------------------------
// Faults counted by errno, with recovery
// ---------------------------------------------------------------------------------------

/// A full filesystem. Rewriting the preallocated overwrite file needs no new blocks and
/// keeps succeeding (as a database rewriting its pages does); what fails is a probe that
/// allocates: replace writes a new file every cycle.
#[test]
fn full_filesystem_is_enospc_and_clears_when_space_is_freed() {
    if !require_root("full_filesystem_is_enospc_and_clears_when_space_is_freed") {
        return;
    }
    let _machine = machine::shared();
    let mut full = LoopFs::new("ext4", 64);
    let healthy = LoopFs::new("ext4", 64);
    let agent = Agent::start(&config(&[
        target("full", full.path(), "300ms", "create, overwrite, replace"),
        healthy_target(&healthy, "300ms"),
    ]));
    let before = wait_metrics(&agent, "both targets up", |m| {
        up(m, "full") == Some(1.0) && up(m, "healthy") == Some(1.0)
    });

    full.fill();
    // dd's last 1 MiB write ends short of the last blocks; take those too.
    let topup = full.path().join("stallwatch-test-topup");
    let of = format!("of={}", topup.display());
    let _ = run_cmd("dd", &["if=/dev/zero", &of, "bs=4k"]);
    run("sync", &["-f", full.path().to_str().unwrap()]);

    let m = wait_metrics(&agent, "ENOSPC counted and full down", |m| {
        errors(m, "full", "ENOSPC") > 0.0 && up(m, "full") == Some(0.0)
    });
    eprintln!("full filesystem: {}", error_series(&m, "full"));
    assert_persists_logged_once(&agent, "full", "ENOSPC");
    assert_healthy(&agent, &before);

    full.free_fill();
    std::fs::remove_file(&topup).unwrap();
    run("sync", &["-f", full.path().to_str().unwrap()]);
    let m = wait_metrics(&agent, "full up again", |m| up(m, "full") == Some(1.0));
    let n = errors(&m, "full", "ENOSPC");
    thread::sleep(Duration::from_millis(1000));
    let later = agent.scrape();
    assert_eq!(errors(&later, "full", "ENOSPC"), n, "ENOSPC still counted");
    assert_eq!(up(&later, "full"), Some(1.0));
    assert_eq!(log_count(&agent, "full", &["target up"]), 2);
    assert_healthy(&agent, &before);
}

#[test]
fn read_only_remount_is_erofs_and_clears_when_writable_again() {
    if !require_root("read_only_remount_is_erofs_and_clears_when_writable_again") {
        return;
    }
    let _machine = machine::shared();
    let mut ro = LoopFs::new("ext4", 64);
    let healthy = LoopFs::new("ext4", 64);
    let agent = Agent::start(&config(&[
        target("ro", ro.path(), "300ms", "create, overwrite"),
        healthy_target(&healthy, "300ms"),
    ]));
    let before = wait_metrics(&agent, "both targets up", |m| {
        up(m, "ro") == Some(1.0) && up(m, "healthy") == Some(1.0)
    });
    assert_eq!(read_only(&before, "ro"), Some(0.0));

    ro.remount_ro();
    let m = wait_metrics(&agent, "EROFS counted, ro down and read-only", |m| {
        errors(m, "ro", "EROFS") > 0.0
            && up(m, "ro") == Some(0.0)
            && read_only(m, "ro") == Some(1.0)
    });
    eprintln!("read-only filesystem: {}", error_series(&m, "ro"));
    assert_persists_logged_once(&agent, "ro", "EROFS");
    assert_eq!(log_count(&agent, "ro", &["the filesystem is read-only"]), 1);
    assert_healthy(&agent, &before);

    ro.remount_rw();
    wait_metrics(&agent, "ro up and writable again", |m| {
        up(m, "ro") == Some(1.0) && read_only(m, "ro") == Some(0.0)
    });
    assert_eq!(
        log_count(&agent, "ro", &["the filesystem is writable again"]),
        1
    );
    assert_eq!(log_count(&agent, "ro", &["target up"]), 2);
    assert_healthy(&agent, &before);
}

/// An XFS shut down (as after a metadata I/O error) answers EIO to everything until it
/// is unmounted: the agent reports it down for as long as that lasts, and not probing
/// while unmounted, and up again once it is mounted anew.
#[test]
fn xfs_shutdown_is_eio_until_unmounted_and_mounted_again() {
    if !require_root("xfs_shutdown_is_eio_until_unmounted_and_mounted_again") {
        return;
    }
    let _machine = machine::shared();
    let mut xfs = LoopFs::new("xfs", 320);
    let healthy = LoopFs::new("ext4", 64);
    let agent = Agent::start(&config(&[
        target("xfs", xfs.path(), "300ms", "create, overwrite"),
        healthy_target(&healthy, "300ms"),
    ]));
    let before = wait_metrics(&agent, "both targets up", |m| {
        up(m, "xfs") == Some(1.0) && up(m, "healthy") == Some(1.0)
    });

    xfs.shutdown();
    let m = wait_metrics(&agent, "EIO counted and xfs down", |m| {
        errors(m, "xfs", "EIO") > 0.0 && up(m, "xfs") == Some(0.0)
    });
    eprintln!("shut-down XFS: {}", error_series(&m, "xfs"));
    // It does not come back by itself: a shut-down XFS stays so until unmounted.
    assert_persists_logged_once(&agent, "xfs", "EIO");
    thread::sleep(Duration::from_secs(1));
    assert_eq!(up(&agent.scrape(), "xfs"), Some(0.0));
    assert_healthy(&agent, &before);

    umount_retry(&mut xfs);
    let skipped = |m: &Metrics| {
        m.get(
            "stallwatch_probes_skipped_total",
            &[("target", "xfs"), ("reason", "not_mounted")],
        )
        .unwrap_or(0.0)
    };
    let m = wait_metrics(&agent, "xfs skipped as not mounted", |m| skipped(m) > 0.0);
    let eio = errors(&m, "xfs", "EIO");
    assert!(
        !probe_dir(&xfs).exists(),
        "wrote into the directory under the unmounted filesystem"
    );
    assert_eq!(log_count(&agent, "xfs", &["not a mount point"]), 1);

    xfs.mount_again();
    let m = wait_metrics(&agent, "xfs up after mounting again", |m| {
        up(m, "xfs") == Some(1.0)
    });
    assert_eq!(
        errors(&m, "xfs", "EIO"),
        eio,
        "EIO counted after the remount"
    );
    assert_eq!(log_count(&agent, "xfs", &["target up"]), 2);
    assert_healthy(&agent, &before);
}

/// The probe directory deleted by someone else. Between two cycles nothing fails: the
/// next cycle creates it again and says so in the log, nothing is counted. During a
/// cycle (here: while the overwrite's fsync is held up by a throttled device) the
/// following create fails with ENOENT in the deleted directory, and that is counted.
#[test]
fn probe_directory_removed_is_recreated_and_counted_when_it_breaks_a_cycle() {
    if !require_root("probe_directory_removed_is_recreated_and_counted_when_it_breaks_a_cycle") {
        return;
    }
    let _machine = machine::shared();
    let mut gone = LoopFs::new("ext4", 64);
    let healthy = LoopFs::new("ext4", 64);
    // One lane, so "during a cycle" is one lane's cycle: replace holds the directory's
    // descriptor from its create to its rename.
    let mut t = target("gone", gone.path(), "1s", "replace");
    t.push_str("    size: 64KiB\n");
    let agent = Agent::start(&config(&[t, healthy_target(&healthy, "1s")]));
    let before = wait_metrics(&agent, "both targets up", |m| {
        up(m, "gone") == Some(1.0) && up(m, "healthy") == Some(1.0)
    });

    // Right after a cycle ended, so the removal falls between two cycles, 1 s apart.
    let done = |m: &Metrics| {
        m.get(
            "stallwatch_probes_total",
            &[("target", "gone"), ("mode", "replace")],
        )
        .unwrap_or(0.0)
    };
    let n = done(&agent.scrape());
    wait_metrics(&agent, "a cycle to end", |m| done(m) > n);
    std::fs::remove_dir_all(probe_dir(&gone)).unwrap();
    assert!(wait_until(WAIT, POLL, || probe_dir(&gone).is_dir()));
    assert!(agent.wait_log("had vanished", WAIT));
    let m = wait_metrics(&agent, "another cycle", |m| done(m) > n + 1.0);
    assert_eq!(up(&m, "gone"), Some(1.0));
    assert_eq!(
        all_errors(&m, "gone"),
        0.0,
        "counted: {}",
        error_series(&m, "gone")
    );
    assert_eq!(log_count(&agent, "gone", &["had vanished"]), 1);
    assert_eq!(log_count(&agent, "gone", &["probe cycle failed"]), 0);

    // Now under a cycle: hold the fsync of the temp file up, delete the directory
    // meanwhile; the rename into the deleted directory then fails.
    gone.throttle_write_bps(64 << 10);
    let fsync_blocked = |m: &Metrics| {
        m.get(
            "stallwatch_probe_inflight_seconds",
            &[("target", "gone"), ("mode", "replace"), ("op", "fsync")],
        )
        .unwrap_or(0.0)
            > 0.2
    };
    wait_metrics(&agent, "an fsync held up by the throttle", fsync_blocked);
    std::fs::remove_dir_all(probe_dir(&gone)).unwrap();
    gone.unthrottle();
    let m = wait_metrics(&agent, "ENOENT counted under rename", |m| {
        m.get(
            "stallwatch_probe_errors_total",
            &[
                ("target", "gone"),
                ("mode", "replace"),
                ("op", "rename"),
                ("errno", "ENOENT"),
            ],
        )
        .unwrap_or(0.0)
            > 0.0
    });
    eprintln!(
        "directory removed during a cycle: {}",
        error_series(&m, "gone")
    );
    wait_metrics(&agent, "gone up again", |m| up(m, "gone") == Some(1.0));
    assert!(probe_dir(&gone).is_dir());
    assert_logged_once_per_lane(&agent, "gone", &["probe cycle failed"]);
    assert_healthy(&agent, &before);
}

/// The extents of a file as (byte offset on the device, length), from FIEMAP.
fn extents(file: &Path) -> Vec<(u64, u64)> {
    let out = run("xfs_io", &["-r", "-c", "fiemap -v", file.to_str().unwrap()]);
    // " 0: [0..7]: 80..87  8 0x1" — 512-byte units.
    let mut v = Vec::new();
    for line in out.lines().skip(1) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() < 3 || cols[2] == "hole" {
            continue;
        }
        let Some((a, b)) = cols[2].trim_end_matches(':').split_once("..") else {
            continue;
        };
        let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
        v.push((a * 512, (b + 1 - a) * 512));
    }
    assert!(!v.is_empty(), "no extents for {}: {out}", file.display());
    v
}

/// True when `offset` of `file` is a hole (nothing allocated there).
fn is_hole(file: &Path, offset: u64) -> bool {
    use rustix::fs::{seek, SeekFrom};
    let f = std::fs::File::open(file).unwrap();
    match seek(&f, SeekFrom::Hole(offset)) {
        Ok(h) => h == offset,
        Err(e) => panic!("SEEK_HOLE on {}: {e}", file.display()),
    }
}

/// Writes zeroes into `file` (appending) until the filesystem is full.
fn fill_file(file: &Path) {
    let of = format!("of={}", file.display());
    let _ = run_cmd(
        "dd",
        &[
            "if=/dev/zero",
            &of,
            "bs=64k",
            "oflag=append",
            "conv=notrunc",
        ],
    );
}

/// One strace event on the probe file: (syscall, fd, failed). Lines as `strace -y`
/// writes them, with or without a leading thread id.
fn trace_events(text: &str, file: &str) -> Vec<(String, i64, bool)> {
    let mut v = Vec::new();
    for line in text.lines() {
        let line = line.trim_start_matches(|c: char| c.is_ascii_digit() || c == ' ');
        let Some((call, rest)) = line.split_once('(') else {
            continue;
        };
        let call = call.trim().to_owned();
        if !matches!(
            call.as_str(),
            "openat" | "pwrite64" | "fsync" | "fdatasync" | "close"
        ) || !line.contains(file)
        {
            continue;
        }
        // ")   = 0", ") = -1 ENOSPC (No space left on device)", ") = 7</path>"
        let result = line.rsplit_once(" = ").map(|(_, r)| r.trim()).unwrap_or("");
        let failed = result.starts_with("-1");
        let fd: i64 = if call == "openat" {
            result
                .split('<')
                .next()
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(-1)
        } else {
            rest.split('<').next().unwrap().trim().parse().unwrap_or(-1)
        };
        v.push((call, fd, failed));
    }
    v
}

/// Checks one thread's trace: the last thing done on a descriptor before each fsync of
/// `file` must be a write on it. A retried fsync (fsync after fsync) or a reopen to
/// "check" (fsync right after openat) breaks that. Returns (fsyncs, failed fsyncs).
fn check_fsync_discipline(text: &str, file: &str) -> Result<(u32, u32), String> {
    let (mut fsyncs, mut failed_fsyncs) = (0, 0);
    let mut last: std::collections::HashMap<i64, String> = Default::default();
    for (call, fd, failed) in trace_events(text, file) {
        match call.as_str() {
            "fsync" | "fdatasync" => {
                fsyncs += 1;
                failed_fsyncs += failed as u32;
                if last.get(&fd).map(String::as_str) != Some("pwrite64") {
                    return Err(format!(
                        "{call} on fd {fd} not preceded by a write on it (after {:?}): a retry or a reopen to check",
                        last.get(&fd)
                    ));
                }
            }
            "close" => {
                last.remove(&fd);
                continue;
            }
            _ => {}
        }
        last.insert(fd, call);
    }
    Ok((fsyncs, failed_fsyncs))
}

/// The checker itself, on traces of the two patterns SPEC forbids.
#[test]
fn fsync_discipline_checker_catches_retry_and_reopen() {
    let f = "/m/.stallwatch/overwrite.dat";
    let open = format!(
        "openat(3</m/.stallwatch>, \"overwrite.dat\", O_WRONLY|O_CREAT|O_NOFOLLOW|O_CLOEXEC, 0600) = 7<{f}>"
    );
    let write = format!("pwrite64(7<{f}>, \"\\1\\1\"..., 4096, 0) = 4096");
    let bad = format!("fsync(7<{f}>)          = -1 EIO (Input/output error)");
    let good = format!("fsync(7<{f}>)              = 0");
    let close = format!("close(7<{f}>)              = 0");
    let ok = [&open, &write, &bad, &close, &open, &write, &good, &close].map(|s| s.as_str());
    assert_eq!(check_fsync_discipline(&ok.join("\n"), f), Ok((2, 1)));
    let with_pid = ok.map(|l| format!("12345 {l}"));
    assert_eq!(check_fsync_discipline(&with_pid.join("\n"), f), Ok((2, 1)));
    let retry = [&open, &write, &bad, &good, &close].map(|s| s.as_str());
    assert!(check_fsync_discipline(&retry.join("\n"), f).is_err());
    let reopen = [&open, &write, &bad, &close, &open, &good, &close].map(|s| s.as_str());
    assert!(check_fsync_discipline(&reopen.join("\n"), f).is_err());
}

/// A writeback error, for real: the probe file's blocks lose their backing (the loop
/// device's image lies on a tmpfs; the holes punched under the file cannot be filled
/// again once that tmpfs is full), so the buffered pwrite succeeds and the fsync fails.
/// Counted under op fsync; never retried on the descriptor, never "checked" by
/// reopening (strace shows each fsync of the file preceded by a write on the same
/// descriptor); clears once the tmpfs has room again.
#[test]
fn writeback_error_surfaces_at_fsync_and_is_never_retried() {
    if !require_root("writeback_error_surfaces_at_fsync_and_is_never_retried") {
        return;
    }
    let _machine = machine::shared();
    // xfs: 4 KiB blocks, so the file's blocks are whole pages of the tmpfs image.
    let wb = LoopFs::on_tmpfs_backing("xfs", 320, 96);
    let healthy = LoopFs::new("ext4", 64);
    let agent = Agent::start(&config(&[
        target("wb", wb.path(), "300ms", "overwrite"),
        healthy_target(&healthy, "300ms"),
    ]));
    let before = wait_metrics(&agent, "both targets up", |m| {
        up(m, "wb") == Some(1.0) && up(m, "healthy") == Some(1.0)
    });

    let data = probe_dir(&wb).join("overwrite.dat");
    let ext = extents(&data);
    for (off, len) in &ext {
        assert!(
            off % 4096 == 0 && len % 4096 == 0,
            "extent {off}+{len} not page aligned"
        );
    }
    let image = wb.image().to_path_buf();
    let filler = image.with_file_name("filler");
    // Fill the tmpfs, punch the holes, take the freed pages at once; a cycle's write
    // may slip in between and allocate them again: then try again.
    let mut punched = false;
    for _ in 0..10 {
        fill_file(&filler);
        for (off, len) in &ext {
            run(
                "fallocate",
                &[
                    "--punch-hole",
                    "--offset",
                    &off.to_string(),
                    "--length",
                    &len.to_string(),
                    image.to_str().unwrap(),
                ],
            );
        }
        fill_file(&filler);
        if ext.iter().all(|(off, _)| is_hole(&image, *off)) {
            punched = true;
            break;
        }
        std::fs::remove_file(&filler).unwrap();
    }
    assert!(punched, "could not take the probe file's backing away");

    let at_fsync = |m: &Metrics| {
        ["EIO", "ENOSPC"]
            .iter()
            .map(|e| {
                m.get(
                    "stallwatch_probe_errors_total",
                    &[
                        ("target", "wb"),
                        ("mode", "overwrite"),
                        ("op", "fsync"),
                        ("errno", e),
                    ],
                )
                .unwrap_or(0.0)
            })
            .sum::<f64>()
    };
    let m = wait_metrics(&agent, "a writeback error counted under fsync", |m| {
        at_fsync(m) > 0.0 && up(m, "wb") == Some(0.0)
    });
    eprintln!("writeback error: {}", error_series(&m, "wb"));
    // Only fsync fails: the buffered write went into the page cache.
    assert_eq!(
        all_errors(&m, "wb"),
        at_fsync(&m),
        "{}",
        error_series(&m, "wb")
    );

    // Watch the system calls of a few failing cycles.
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("trace");
    let mut strace = Command::new("strace")
        .args(["-f", "-ff", "-y", "-qq", "-e"])
        .arg("trace=openat,pwrite64,fsync,fdatasync,close")
        .arg("-o")
        .arg(&prefix)
        .arg("-p")
        .arg(agent.pid().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start strace");
    let a = at_fsync(&agent.scrape());
    let traced = wait_until(WAIT, POLL, || at_fsync(&agent.scrape()) >= a + 3.0);
    // strace detaches cleanly on SIGINT; it is our own child.
    run("kill", &["-s", "INT", &strace.id().to_string()]);
    let status = strace.wait().unwrap();
    assert!(traced, "no failing fsync while tracing");
    let file = data.to_str().unwrap();
    let mut failed_fsyncs = 0;
    let mut fsyncs = 0;
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        // Every open of anything under the targets refuses symlinks and is close-on-exec.
        for line in text.lines().filter(|l| l.starts_with("openat(")) {
            if line.contains(wb.path().to_str().unwrap()) {
                assert!(
                    line.contains("O_NOFOLLOW") && line.contains("O_CLOEXEC"),
                    "open without O_NOFOLLOW|O_CLOEXEC: {line}"
                );
            }
        }
        let (n, failed) =
            check_fsync_discipline(&text, file).unwrap_or_else(|e| panic!("{e}\ntrace:\n{text}"));
        fsyncs += n;
        failed_fsyncs += failed;
    }
    eprintln!(
        "strace ({status}): {fsyncs} fsyncs of the probe file, {failed_fsyncs} failed; stderr: {}",
        {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut strace.stderr.take().unwrap(), &mut s);
            s
        }
    );
    assert!(
        failed_fsyncs >= 2,
        "strace saw {failed_fsyncs} failed fsyncs"
    );
    assert_eq!(
        fsyncs, failed_fsyncs,
        "an fsync of the file succeeded meanwhile"
    );

    let errno = if errors(&m, "wb", "ENOSPC") > 0.0 {
        "ENOSPC"
    } else {
        "EIO"
    };
    assert_persists_logged_once(&agent, "wb", errno);
    assert_healthy(&agent, &before);

    // Room on the tmpfs again: the next write-back succeeds.
    std::fs::remove_file(&filler).unwrap();
    let m = wait_metrics(&agent, "wb up again", |m| up(m, "wb") == Some(1.0));
    let n = at_fsync(&m);
    thread::sleep(Duration::from_secs(1));
    assert_eq!(at_fsync(&agent.scrape()), n);
    assert_eq!(log_count(&agent, "wb", &["target up"]), 2);
    assert_healthy(&agent, &before);
}

// ---------------------------------------------------------------------------------------
// Nothing followed, nothing else deleted
// ---------------------------------------------------------------------------------------

/// Every file and directory below `dir` with its size and mtime: a fingerprint that any
/// write would change.
fn fingerprint(dir: &Path) -> Vec<(PathBuf, u64, SystemTime)> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let md = e.path().symlink_metadata().unwrap();
        v.push((e.path(), md.len(), md.modified().unwrap()));
    }
    let md = dir.symlink_metadata().unwrap();
    v.push((dir.to_path_buf(), md.len(), md.modified().unwrap()));
    v.sort();
    v
}

/// Swaps two paths atomically (renameat2 RENAME_EXCHANGE), so a running agent never
/// sees neither.
fn exchange(a: &Path, b: &Path) {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    renameat_with(CWD, a, CWD, b, RenameFlags::EXCHANGE)
        .unwrap_or_else(|e| panic!("exchange {} and {}: {e}", a.display(), b.display()));
}

/// Runs one hostile-directory phase: applies `break_it`, waits for the refusal
/// (counted as `errno`, logged once with `words`), then `fix_it` and back up.
fn hostile_phase(
    agent: &Agent,
    before: &Metrics,
    errno: &str,
    words: &[&str],
    break_it: impl FnOnce(),
    fix_it: impl FnOnce(),
) {
    let ups = log_count(agent, "hostile", &["target up"]);
    break_it();
    let m = wait_metrics(agent, &format!("{errno} counted"), |m| {
        errors(m, "hostile", errno) > errors(before, "hostile", errno)
            && up(m, "hostile") == Some(0.0)
    });
    let a = errors(&m, "hostile", errno);
    wait_metrics(agent, "more cycles refused", |m| {
        errors(m, "hostile", errno) >= a + 3.0
    });
    let mut w = vec!["probe cycle failed"];
    w.extend_from_slice(words);
    assert_logged_once_per_lane(agent, "hostile", &w);
    fix_it();
    wait_metrics(agent, "hostile up again", |m| up(m, "hostile") == Some(1.0));
    assert_eq!(log_count(agent, "hostile", &["target up"]), ups + 1);
}

#[test]
fn hostile_probe_directories_are_refused_and_never_written_through() {
    if !require_root("hostile_probe_directories_are_refused_and_never_written_through") {
        return;
    }
    let _machine = machine::shared();
    let fs = LoopFs::new("ext4", 64);
    let healthy = LoopFs::new("ext4", 64);
    let agent = Agent::start(&config(&[
        target("hostile", fs.path(), "300ms", "create, overwrite"),
        healthy_target(&healthy, "300ms"),
    ]));
    let before = wait_metrics(&agent, "both targets up", |m| {
        up(m, "hostile") == Some(1.0) && up(m, "healthy") == Some(1.0)
    });
    let pd = probe_dir(&fs);

    // 1. The probe directory is a symlink to another directory.
    let elsewhere = fs.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("precious.txt"), b"keep").unwrap();
    let link = fs.path().join("link");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    let print = fingerprint(&elsewhere);
    hostile_phase(
        &agent,
        &before,
        "unsafe_dir",
        &["symlink"],
        || exchange(&pd, &link),
        || {
            assert_eq!(
                fingerprint(&elsewhere),
                print,
                "something was written through the symlink"
            );
            exchange(&pd, &link);
        },
    );

    // 2. Owned by another user.
    hostile_phase(
        &agent,
        &before,
        "unsafe_dir",
        &["owned by uid 65534"],
        || {
            run("chown", &["65534:65534", pd.to_str().unwrap()]);
        },
        || {
            run("chown", &["0:0", pd.to_str().unwrap()]);
        },
    );

    // 3. Writable by everyone (and then by the group).
    for mode in [0o777, 0o770] {
        hostile_phase(
            &agent,
            &before,
            "unsafe_dir",
            &[&format!("mode {mode:o}"), "writable by group or others"],
            || std::fs::set_permissions(&pd, std::fs::Permissions::from_mode(mode)).unwrap(),
            || std::fs::set_permissions(&pd, std::fs::Permissions::from_mode(0o700)).unwrap(),
        );
    }

    // 4. A symlink planted as the probe's data file is not followed.
    let victim = fs.path().join("victim.txt");
    std::fs::write(&victim, b"do not overwrite").unwrap();
    let data = pd.join("overwrite.dat");
    hostile_phase(
        &agent,
        &before,
        "ELOOP",
        &["overwrite prepare: open overwrite.dat: ELOOP"],
        || {
            let plant = pd.join("plant");
            std::os::unix::fs::symlink(&victim, &plant).unwrap();
            std::fs::rename(&plant, &data).unwrap();
        },
        || {
            assert_eq!(std::fs::read(&victim).unwrap(), b"do not overwrite");
            assert!(data.symlink_metadata().unwrap().is_symlink());
            std::fs::remove_file(&data).unwrap();
        },
    );

    // 5. A hard link planted as the data file: writing would change the other file.
    hostile_phase(
        &agent,
        &before,
        "unsafe_dir",
        &["overwrite prepare: open overwrite.dat: unsafe"],
        || {
            let plant = pd.join("plant");
            std::fs::hard_link(&victim, &plant).unwrap();
            std::fs::rename(&plant, &data).unwrap();
        },
        || {
            assert_eq!(std::fs::read(&victim).unwrap(), b"do not overwrite");
            std::fs::remove_file(&data).unwrap();
        },
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"do not overwrite");
    let m = agent.scrape();
    eprintln!("hostile: {}", error_series(&m, "hostile"));
    assert_healthy(&agent, &before);
}

/// A configured path that is a symlink is not followed either; the log says what to do.
#[test]
fn symlinked_target_path_is_refused_with_a_clear_message() {
    if !require_root("symlinked_target_path_is_refused_with_a_clear_message") {
        return;
    }
    let _machine = machine::shared();
    let fs = LoopFs::new("ext4", 64);
    let healthy = LoopFs::new("ext4", 64);
    let link = fs.root().join("link");
    std::os::unix::fs::symlink(fs.path(), &link).unwrap();
    let agent = Agent::start(&config(&[
        target("linked", &link, "300ms", "create, overwrite"),
        healthy_target(&healthy, "300ms"),
    ]));
    let before = wait_metrics(&agent, "healthy up", |m| up(m, "healthy") == Some(1.0));
    wait_metrics(&agent, "the symlinked target refused", |m| {
        errors(m, "linked", "unsafe_dir") >= 4.0 && up(m, "linked") == Some(0.0)
    });
    assert_logged_once_per_lane(
        &agent,
        "linked",
        &["probe cycle failed", "is a symlink, which is not followed"],
    );
    assert!(!probe_dir(&fs).exists(), "wrote through the symlink");
    assert_healthy(&agent, &before);
}

/// Files of a killed run are removed at start, by name, without following symlinks;
/// anything else in the directory stays, also at shutdown.
#[test]
fn leftovers_of_a_killed_run_are_removed_and_foreign_files_kept() {
    if !require_root("leftovers_of_a_killed_run_are_removed_and_foreign_files_kept") {
        return;
    }
    let _machine = machine::shared();
    let fs = LoopFs::new("ext4", 64);
    let healthy = LoopFs::new("ext4", 64);
    let pd = probe_dir(&fs);
    std::fs::create_dir(&pd).unwrap();
    std::fs::set_permissions(&pd, std::fs::Permissions::from_mode(0o700)).unwrap();
    let victim = fs.path().join("victim.txt");
    std::fs::write(&victim, b"not ours").unwrap();
    let ours = [
        "create.123.4",
        "overwrite.dat",
        "replace.tmp",
        "replace.dat",
        "direct.dat",
    ];
    for f in ours {
        std::fs::write(pd.join(f), b"leftover").unwrap();
    }
    // A symlink under one of our names: the link goes, its target stays.
    std::os::unix::fs::symlink(&victim, pd.join("create.999.1")).unwrap();
    let foreign = [
        "notes.txt",
        "create.txt",
        "overwrite.dat.bak",
        "create.1.2.x",
    ];
    for f in foreign {
        std::fs::write(pd.join(f), b"someone else's").unwrap();
    }
    std::fs::create_dir(pd.join("keep.d")).unwrap();

    let mut agent = Agent::start(&config(&[
        target("left", fs.path(), "300ms", "create"),
        healthy_target(&healthy, "300ms"),
    ]));
    assert!(
        agent.wait_log("removed leftover probe files", WAIT),
        "{}",
        agent.log_tail(20)
    );
    let line = agent
        .logs()
        .into_iter()
        .find(|l| l.contains("removed leftover probe files"))
        .unwrap();
    assert!(has_field(&line, "files", "6"), "{line}");
    let before = wait_metrics(&agent, "left up", |m| up(m, "left") == Some(1.0));
    for f in ours.iter().chain(&["create.999.1"]) {
        assert!(
            pd.join(f).symlink_metadata().is_err(),
            "{f} was not removed"
        );
    }
    assert_eq!(std::fs::read(&victim).unwrap(), b"not ours");
    for f in foreign {
        assert_eq!(std::fs::read(pd.join(f)).unwrap(), b"someone else's", "{f}");
    }
    assert!(pd.join("keep.d").is_dir());
    assert_healthy(&agent, &before);

    // At shutdown: our files go, the directory stays because others' files are in it.
    agent.signal("TERM");
    let st = agent.wait_exit(Duration::from_secs(5)).expect("no exit");
    assert!(st.success(), "{st}");
    let mut left: Vec<String> = std::fs::read_dir(&pd)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    let mut want: Vec<String> = foreign.iter().map(|s| s.to_string()).collect();
    want.push("keep.d".into());
    want.sort();
    assert_eq!(left, want);
    assert!(
        !probe_dir(&healthy).exists(),
        "healthy's directory not removed"
    );
}

// ---------------------------------------------------------------------------------------
// Shutdown
// ---------------------------------------------------------------------------------------

/// Polls until a TCP connect to `addr` is refused; returns how long that took.
fn refused_within(addr: &str, limit: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        match TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_millis(100)) {
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => return Some(t0.elapsed()),
            _ => thread::sleep(Duration::from_millis(10)),
        }
    }
    None
}

#[test]
fn sigterm_with_a_probe_blocked_by_a_freeze() {
    if !require_root("sigterm_with_a_probe_blocked_by_a_freeze") {
        return;
    }
    let _machine = machine::shared();
    let mut frozen = LoopFs::new("ext4", 64);
    let healthy = LoopFs::new("ext4", 64);
    let mut agent = Agent::start(&config(&[
        target("frozen", frozen.path(), "300ms", "create, overwrite"),
        healthy_target(&healthy, "300ms"),
    ]));
    wait_metrics(&agent, "both targets up", |m| {
        up(m, "frozen") == Some(1.0) && up(m, "healthy") == Some(1.0)
    });
    frozen.freeze();
    wait_metrics(&agent, "a probe blocked for 0.5 s", |m| {
        m.sum("stallwatch_probe_inflight_seconds", &[("target", "frozen")]) > 0.5
    });

    let addr = agent.addr().to_string();
    assert!(agent.signal("TERM"));
    let refused = refused_within(&addr, Duration::from_secs(1));
    assert!(
        refused.is_some(),
        "the listening socket still accepts 1 s after SIGTERM"
    );
    assert!(
        agent.wait_log("probe blocked in the kernel", Duration::from_secs(2)),
        "{}",
        agent.log_tail(20)
    );
    let blocked: Vec<String> = agent
        .logs()
        .into_iter()
        .filter(|l| l.contains("probe blocked in the kernel"))
        .collect();
    assert!(
        blocked.iter().all(|l| has_field(l, "target", "frozen")),
        "{blocked:?}"
    );
    // Still there: the call cannot be interrupted.
    thread::sleep(Duration::from_millis(500));
    assert!(agent.is_running(), "exited while a probe was blocked");

    frozen.thaw();
    let thawed = Instant::now();
    let st = agent.wait_exit(Duration::from_secs(5));
    let took = thawed.elapsed();
    let st = st.expect("no exit within 5 s of the thaw");
    assert!(st.success(), "{st}");
    assert!(
        took < Duration::from_secs(1),
        "exit {took:?} after the thaw"
    );
    eprintln!("refused after {refused:?}, exit {took:?} after the thaw");
    assert!(
        !probe_dir(&frozen).exists(),
        "frozen's probe files not removed"
    );
    assert!(
        !probe_dir(&healthy).exists(),
        "healthy's probe files not removed"
    );
}

#[test]
fn sigterm_and_sigint_without_a_blocked_probe_exit_at_once_and_clean_up() {
    if !require_root("sigterm_and_sigint_without_a_blocked_probe_exit_at_once_and_clean_up") {
        return;
    }
    let _machine = machine::shared();
    let a = LoopFs::new("ext4", 64);
    let b = LoopFs::new("ext4", 64);
    for sig in ["TERM", "INT"] {
        let mut agent = Agent::start(&config(&[
            target("a", a.path(), "300ms", "create, overwrite"),
            target("b", b.path(), "300ms", "create, overwrite"),
        ]));
        wait_metrics(&agent, "both targets up", |m| {
            up(m, "a") == Some(1.0) && up(m, "b") == Some(1.0)
        });
        assert!(probe_dir(&a).is_dir() && probe_dir(&b).is_dir());
        let addr = agent.addr().to_string();
        assert!(agent.signal(sig));
        let t0 = Instant::now();
        let st = agent.wait_exit(Duration::from_secs(5));
        let took = t0.elapsed();
        let st = st.unwrap_or_else(|| panic!("SIG{sig}: no exit within 5 s"));
        assert!(st.success(), "SIG{sig}: {st}");
        assert!(
            took < Duration::from_secs(1),
            "SIG{sig}: exit took {took:?}"
        );
        assert!(
            refused_within(&addr, Duration::from_millis(100)).is_some(),
            "SIG{sig}: still accepting connections"
        );
        for (name, fs) in [("a", &a), ("b", &b)] {
            assert!(
                !probe_dir(fs).exists(),
                "SIG{sig}: {name}'s probe directory is still there"
            );
        }
        assert!(agent.logs().iter().any(|l| l.contains("stopped")));
        eprintln!("SIG{sig}: exit after {took:?}");
    }
    // Nothing else on the filesystems was touched.
    for fs in [&a, &b] {
        let names: Vec<String> = std::fs::read_dir(fs.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec!["lost+found".to_string()]);
        let md = fs.path().symlink_metadata().unwrap();
        assert_eq!(md.uid(), 0);
    }
}
