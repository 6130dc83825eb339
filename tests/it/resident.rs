//! A resident agent: with its memory locked (mlockall), the agent keeps answering while
//! the disk its binary lives on crawls; without the lock, what it has not touched yet
//! (the code of a path not served before, its data) is read from that disk when needed,
//! at the disk's pace.
//!
//! What evicts an idle process's code pages on a real host is memory pressure; here it is
//! `process_madvise(MADV_PAGEOUT)` on every mapping of each agent, from outside, which is
//! the kernel's reclaim of exactly those pages (locked pages are skipped by it, as by
//! reclaim), followed by dropping the page cache. (`drop_caches` alone does not evict
//! pages a process has mapped.)
//!
//! Two copies of the binary (two inodes, so two sets of page-cache pages: the locked
//! copy's resident pages cannot serve the other's faults) on a loop filesystem, each
//! started as an agent probing its own small filesystem; one with the lock, one with
//! `--memory.lock=false`. Then reads from the binaries' device are throttled to a few
//! KiB/s (blkio `read_bps_device`), the page cache is dropped, and both agents are asked
//! for paths they have not served yet, and /metrics again. Figures are printed; the locked
//! agent must answer every request within a second, the unlocked one is shown, not judged.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::agent::{Agent, AGENT_BIN};
use crate::support::cmd::run;
use crate::support::http::{client_config, request};
use crate::support::loopfs::LoopFs;
use crate::support::machine;
use crate::support::metrics::Metrics;
use crate::support::root::require_root;

/// Reads from the binaries' device, bytes/s, while the agents are asked.
const CRAWL_BPS: u64 = 8 * 1024;
/// What "keeps answering in milliseconds" is asserted as: generous, timings are noisy.
const LOCKED_BOUND: Duration = Duration::from_secs(1);
/// The client's limit per request (the unlocked agent is expected to hit it).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(4);
/// Paths asked after the throttle, in order: /metrics was served before, the others not.
const PATHS: &[&str] = &[
    "/metrics",
    "/healthz",
    "/api/stalls",
    "/",
    "/no-such-path",
    "/metrics",
];

/// A path asked and its status and time, or why there was no answer.
type Answer = (String, Result<(u16, Duration), String>);

fn vm_lck_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmLck:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no VmLck in /proc/{pid}/status:\n{status}"))
}

fn vm_field_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Reclaims the pages of every mapping of `pid` as memory pressure would
/// (`process_madvise(MADV_PAGEOUT)`, Linux 5.10+); mlocked pages stay. Returns the number
/// of bytes the kernel reports advised.
fn page_out(pid: u32) -> i64 {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let ranges: Vec<(usize, usize)> = maps
        .lines()
        .filter(|l| !l.ends_with("[vsyscall]"))
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some((
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            ))
        })
        .collect();
    // SAFETY: plain system calls on a pid we started; the iovecs only name address
    // ranges of the other process, nothing here is read or written through them.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) as libc::c_int;
        assert!(
            pidfd >= 0,
            "pidfd_open({pid}): {}",
            std::io::Error::last_os_error()
        );
        let mut total = 0;
        for (start, end) in ranges {
            let iov = libc::iovec {
                iov_base: start as *mut libc::c_void,
                iov_len: end - start,
            };
            // One range at a time: a range the kernel refuses (e.g. a special mapping)
            // must not stop the others.
            let r = libc::syscall(
                libc::SYS_process_madvise,
                pidfd,
                &iov as *const libc::iovec,
                1usize,
                libc::MADV_PAGEOUT,
                0u32,
            );
            if r > 0 {
                total += r;
            }
        }
        libc::close(pidfd);
        total
    }
}

/// The agent's binary without its debug sections (a debug build is ~100 MB, of which
/// only the loaded segments matter here), written onto `dir`.
fn copy_binary(dir: &Path, name: &str) -> PathBuf {
    let dest = dir.join(name);
    run(
        "strip",
        &["--strip-debug", "-o", dest.to_str().unwrap(), AGENT_BIN],
    );
    // On disk before the page cache is dropped: written back now, not under the limit.
    run("sync", &["-f", dest.to_str().unwrap()]);
    dest
}

fn config(target: &Path) -> String {
    format!(
        "vm_interval: 1s\nstall_threshold: 1s\ntargets:\n  - path: {}\n    name: t\n    interval: 1s\n    modes: [create, overwrite]\n",
        target.display()
    )
}

/// One request per path on a fresh connection; after `give_up` consecutive transport
/// failures (timeouts) the rest are not tried: the agent's one HTTP thread is stuck.
fn ask(agent: &Agent, give_up: usize) -> Vec<Answer> {
    let client: ureq::Agent = client_config()
        .timeout_global(Some(CLIENT_TIMEOUT))
        .max_idle_connections(0)
        .build()
        .into();
    let mut out = Vec::new();
    let mut failures = 0;
    for path in PATHS {
        if failures >= give_up {
            out.push((path.to_string(), Err("not tried".into())));
            continue;
        }
        let start = Instant::now();
        let r = request(&client, "GET", &agent.url(path), &[]).map(|r| (r.status, start.elapsed()));
        failures = if r.is_err() { failures + 1 } else { 0 };
        out.push((path.to_string(), r));
    }
    out
}

fn print(what: &str, results: &[Answer]) {
    eprintln!("== {what}");
    for (path, r) in results {
        match r {
            Ok((status, d)) => eprintln!(
                "   GET {path:<14} {status}  {:>9.1} ms",
                d.as_secs_f64() * 1e3
            ),
            Err(e) => eprintln!("   GET {path:<14} ---  {e}"),
        }
    }
}

fn memory_locked(agent: &Agent) -> Option<f64> {
    let (_, body, _) = agent.get("/metrics");
    Metrics::parse(&body)
        .unwrap()
        .get("stallwatch_memory_locked", &[])
}

#[test]
fn locked_agent_answers_while_its_binary_disk_crawls() {
    if !require_root("locked_agent_answers_while_its_binary_disk_crawls") {
        return;
    }
    // drop_caches empties every process's page cache, and the answers are timed.
    let _machine = machine::exclusive();
    // Declaration order is drop order reversed: throttle removed first, then the agents
    // killed and reaped, then the filesystems torn down.
    let mut bin_fs = LoopFs::new("ext4", 128);
    let target_locked = LoopFs::new("ext4", 64);
    let target_unlocked = LoopFs::new("ext4", 64);
    let bin_locked = copy_binary(bin_fs.path(), "stallwatch-locked");
    let bin_unlocked = copy_binary(bin_fs.path(), "stallwatch-unlocked");

    let locked = Agent::start_bin(&bin_locked, &config(target_locked.path()), &[]);
    let unlocked = Agent::start_bin(
        &bin_unlocked,
        &config(target_unlocked.path()),
        &["--memory.lock=false"],
    );
    assert!(locked.wait_up("t"), "{}", locked.log_tail(20));
    assert!(unlocked.wait_up("t"), "{}", unlocked.log_tail(20));
    assert!(
        locked.logs().iter().any(|l| l.contains("memory locked")),
        "no `memory locked` line:\n{}",
        locked.log_tail(20)
    );
    assert!(
        unlocked
            .logs()
            .iter()
            .any(|l| l.contains("memory lock off")),
        "no `memory lock off` line:\n{}",
        unlocked.log_tail(20)
    );
    // Served before the throttle: /metrics (and its encoding code) has run in both.
    assert_eq!(memory_locked(&locked), Some(1.0));
    assert_eq!(memory_locked(&unlocked), Some(0.0));

    // Independent of the agent's own report: the kernel's count of locked memory.
    let (lck, lck_off) = (vm_lck_kib(locked.pid()), vm_lck_kib(unlocked.pid()));
    let (rss, rss_off) = (
        vm_field_kib(locked.pid(), "VmRSS:"),
        vm_field_kib(unlocked.pid(), "VmRSS:"),
    );
    eprintln!("VmLck: locked agent {lck} kB (VmRSS {rss} kB); unlocked agent {lck_off} kB (VmRSS {rss_off} kB)");
    assert!(lck > 0, "the locked agent has VmLck 0");
    assert_eq!(
        lck_off, 0,
        "the agent run with --memory.lock=false has locked memory"
    );

    let mut throttle = bin_fs.throttle_read_bps(CRAWL_BPS);
    let (rss_before, rss_off_before) = (
        vm_field_kib(locked.pid(), "VmRSS:"),
        vm_field_kib(unlocked.pid(), "VmRSS:"),
    );
    let (advised, advised_off) = (page_out(locked.pid()), page_out(unlocked.pid()));
    // Machine-wide but harmless; once.
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").expect("drop caches");
    let (rss_after, rss_off_after) = (
        vm_field_kib(locked.pid(), "VmRSS:"),
        vm_field_kib(unlocked.pid(), "VmRSS:"),
    );
    eprintln!(
        "reads from {} ({}) limited to {CRAWL_BPS} B/s; pages reclaimed (MADV_PAGEOUT, {advised} and {advised_off} bytes advised) and page cache dropped: \
         VmRSS locked {rss_before} -> {rss_after} kB, unlocked {rss_off_before} -> {rss_off_after} kB",
        bin_fs.dev(),
        bin_fs.maj_min()
    );
    // The eviction is real for the unlocked agent, and the lock held for the other.
    assert!(
        rss_off_after < rss_off_before,
        "MADV_PAGEOUT evicted nothing of the unlocked agent ({rss_off_before} -> {rss_off_after} kB)"
    );
    assert!(vm_lck_kib(locked.pid()) >= lck, "locked memory shrank");

    let with_lock = ask(&locked, 2);
    print("locked agent (default)", &with_lock);
    let t0 = Instant::now();
    let without_lock = ask(&unlocked, 2);
    print("unlocked agent (--memory.lock=false)", &without_lock);
    let unlocked_took = t0.elapsed();

    // The locked agent answered everything, each within the bound, and still is locked.
    for (path, r) in &with_lock {
        let (status, took) = r
            .as_ref()
            .unwrap_or_else(|e| panic!("locked agent, GET {path}: {e}\n{}", locked.log_tail(20)));
        assert!(
            *took < LOCKED_BOUND,
            "locked agent, GET {path}: {took:?} (bound {LOCKED_BOUND:?}) with its binary's disk at {CRAWL_BPS} B/s"
        );
        let expect = if path == "/no-such-path" { 404 } else { 200 };
        assert_eq!(*status, expect, "locked agent, GET {path}");
    }
    let slowest = |rs: &[Answer]| {
        rs.iter()
            .map(|(_, r)| r.as_ref().map_or(CLIENT_TIMEOUT, |(_, d)| *d))
            .max()
            .unwrap()
    };
    let failed = without_lock.iter().filter(|(_, r)| r.is_err()).count();
    eprintln!(
        "contrast: slowest answer locked {:.1} ms; unlocked {:.1} ms{} ({failed} of {} requests unanswered within {CLIENT_TIMEOUT:?}; {:.1} s spent asking)",
        slowest(&with_lock).as_secs_f64() * 1e3,
        slowest(&without_lock).as_secs_f64() * 1e3,
        if failed > 0 { " or more" } else { "" },
        without_lock.len(),
        unlocked_took.as_secs_f64()
    );
    assert!(vm_lck_kib(locked.pid()) > 0);

    // The unlocked agent may be in a page fault at the limit's pace: lift the limit
    // first, then the agents are killed and reaped (drop order), then the filesystems go.
    throttle.remove();
}
