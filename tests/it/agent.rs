//! The real binary driven from outside: scraped over HTTP while it probes a temporary
//! directory, and (as root) while a target's XFS is frozen or unmounted under it.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::agent::Agent;
use crate::support::cmd::{check_metrics, run};
use crate::support::loopfs::LoopFs;
use crate::support::machine;
use crate::support::metrics::Metrics;
use crate::support::root::require_root;
use crate::support::wait::wait_until;

fn tmp_target_yaml(dir: &std::path::Path, interval: &str) -> String {
    format!(
        "targets:\n  - path: {}\n    name: tmp\n    require_mountpoint: false\n    interval: {interval}\n",
        dir.display()
    )
}

fn mode_of(op: &str) -> &'static str {
    match op {
        "create" | "close" | "unlink" => "create",
        _ => "overwrite",
    }
}

#[test]
fn histogram_counts_grow_by_the_cycles_that_ran() {
    let _machine = machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&tmp_target_yaml(dir.path(), "200ms"));
    assert!(wait_until(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || {
            agent
                .scrape()
                .get(
                    "stallwatch_probes_total",
                    &[("target", "tmp"), ("mode", "overwrite")],
                )
                .unwrap_or(0.0)
                >= 1.0
        }
    ));
    let a = agent.scrape();
    std::thread::sleep(Duration::from_millis(1500));
    let b = agent.scrape();
    for op in ["create", "close", "unlink", "write", "fsync"] {
        let mode = mode_of(op);
        let labels = [("target", "tmp"), ("mode", mode), ("op", op)];
        let count = |m: &Metrics| {
            m.get("stallwatch_probe_duration_seconds_count", &labels)
                .unwrap_or_else(|| panic!("no histogram for {op}"))
        };
        let cycles = |m: &Metrics| {
            m.get(
                "stallwatch_probes_total",
                &[("target", "tmp"), ("mode", mode)],
            )
            .unwrap()
        };
        let (d_ops, d_cycles) = (count(&b) - count(&a), cycles(&b) - cycles(&a));
        assert!(
            d_cycles >= 4.0,
            "only {d_cycles} {mode} cycles in 1.5 s at 200 ms"
        );
        // A scrape may land between an op and the end of its cycle: at most one apart.
        assert!(
            (d_ops - d_cycles).abs() <= 1.0,
            "{op}: {d_ops} observations for {d_cycles} cycles"
        );
        let sum = b
            .get("stallwatch_probe_duration_seconds_sum", &labels)
            .unwrap();
        assert!(sum > 0.0 && sum < count(&b) * 1.0, "{op} sum {sum}");
    }
    assert_eq!(
        b.get("stallwatch_target_up", &[("target", "tmp")]),
        Some(1.0)
    );
    assert_eq!(
        b.sum("stallwatch_probe_errors_total", &[("target", "tmp")]),
        0.0
    );
    let last = b
        .get(
            "stallwatch_last_success_timestamp_seconds",
            &[("target", "tmp")],
        )
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!((now - last).abs() < 5.0, "last success {last}, now {now}");
    // The probe directory exists while it runs, mode 0700, holding only our files.
    let pd = dir.path().join(".stallwatch");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&pd).unwrap().permissions().mode() & 0o777,
        0o700
    );
}

#[test]
fn vm_gauges_present_and_plausible() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&tmp_target_yaml(dir.path(), "1s"));
    assert!(wait_until(
        Duration::from_secs(5),
        Duration::from_millis(50),
        || {
            agent
                .scrape()
                .get("stallwatch_vm_dirty_threshold_bytes", &[])
                .unwrap_or(0.0)
                > 0.0
        }
    ));
    let m = agent.scrape();
    let g = |n: &str| m.get(n, &[]).unwrap_or_else(|| panic!("{n} missing"));
    let page = 4096.0;
    let thr = g("stallwatch_vm_dirty_threshold_bytes");
    let bg = g("stallwatch_vm_dirty_background_threshold_bytes");
    assert!(bg > 0.0 && bg <= thr, "background {bg} threshold {thr}");
    assert_eq!(thr % page, 0.0);
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap();
    let total_kib: f64 = mem
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap();
    assert!(thr < total_kib * 1024.0, "threshold above RAM");
    assert!(g("stallwatch_vm_dirty_bytes") >= 0.0);
    assert!(g("stallwatch_vm_writeback_bytes") >= 0.0);
    assert!(g("stallwatch_vm_dirtied_bytes_total") >= g("stallwatch_vm_written_bytes_total") * 0.5);
    let ratio = g("stallwatch_vm_dirty_ratio");
    let bytes = g("stallwatch_vm_dirty_bytes_setting");
    assert!((ratio > 0.0 && ratio <= 1.0) || bytes > 0.0);
    assert!(g("stallwatch_vm_dirty_expire_seconds") > 0.0);
    if std::path::Path::new("/proc/pressure/io").exists() {
        assert!(m.has("stallwatch_pressure_io_some_seconds_total"));
        assert!(
            g("stallwatch_pressure_io_some_seconds_total")
                >= g("stallwatch_pressure_io_full_seconds_total")
        );
    }
    assert_eq!(
        m.get(
            "stallwatch_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        Some(1.0)
    );
    assert!(g("process_resident_memory_bytes") > 0.0);
}

#[test]
fn endpoints_answer() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&tmp_target_yaml(dir.path(), "1s"));
    let (s, body, _) = agent.get("/healthz");
    assert_eq!((s, body.trim()), (200, "ok"));
    let (s, body, _) = agent.get("/");
    assert_eq!(s, 200);
    assert!(body.contains("tmp") && body.contains("/metrics") && body.contains("/api/stalls"));
    // The kernel's dirty state beside the targets, once the sampler has run.
    assert!(wait_until(
        Duration::from_secs(5),
        Duration::from_millis(50),
        || agent.get("/").1.contains("throttling threshold")
    ));
    let (s, body, _) = agent.get("/api/stalls");
    assert_eq!(s, 200);
    assert!(serde_json::from_str::<Vec<serde_json::Value>>(&body).is_ok());
    assert_eq!(agent.get("/nope").0, 404);
}

#[test]
fn promtool_check_metrics_on_a_real_scrape() {
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start(&tmp_target_yaml(dir.path(), "200ms"));
    assert!(wait_until(
        Duration::from_secs(5),
        Duration::from_millis(50),
        || {
            agent
                .scrape()
                .get("stallwatch_target_up", &[("target", "tmp")])
                == Some(1.0)
        }
    ));
    let (_, text, _) = agent.get("/metrics");
    check_metrics(&text);
}

#[test]
fn embedded_default_runs_without_a_config() {
    if std::path::Path::new("/etc/stallwatch/config.yaml").exists() {
        eprintln!("SKIPPED: /etc/stallwatch/config.yaml exists, the default would not apply");
        return;
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_stallwatch"))
        .args(["--web.listen-address", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let mut all = String::new();
        while let Ok(n) = err.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.push_str(&String::from_utf8_lossy(&buf[..n]));
            let _ = tx.send(all.clone());
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut log = String::new();
    while Instant::now() < deadline && !log.contains("listening on") {
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(100)) {
            log = l;
        }
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    assert!(log.contains("embedded default"), "{log}");
    assert!(log.contains("listening on 127.0.0.1:"), "{log}");
    assert!(status.success());
}

/// Freezes a target for about 5 s: scrapes stay fast, the in-flight age climbs, the
/// other target keeps cycling, no threads are added, and the blocked op lands in the
/// histogram above 4 s once the filesystem thaws.
#[test]
fn frozen_target_blocks_only_itself() {
    if !require_root("frozen_target_blocks_only_itself") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("xfs", 320);
    let other = tempfile::tempdir().unwrap();
    let yaml = format!(
        "stall_threshold: 1s\ntargets:\n  - path: {}\n    name: frozen\n    interval: 500ms\n    modes: [create, overwrite]\n  - path: {}\n    name: other\n    require_mountpoint: false\n    interval: 200ms\n",
        fs.path().display(),
        other.path().display()
    );
    let agent = Agent::start(&yaml);
    assert!(wait_until(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || {
            let m = agent.scrape();
            m.get("stallwatch_target_up", &[("target", "frozen")]) == Some(1.0)
                && m.get("stallwatch_target_up", &[("target", "other")]) == Some(1.0)
        }
    ));
    let before = agent.scrape();
    let threads_before = agent.thread_count();
    let sum_before = before.sum(
        "stallwatch_probe_duration_seconds_sum",
        &[("target", "frozen")],
    );
    let other_before = before
        .get(
            "stallwatch_probes_total",
            &[("target", "other"), ("mode", "create")],
        )
        .unwrap();

    fs.freeze();
    let t0 = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut max_inflight: f64 = 0.0;
    let mut threads_max = 0;
    let mut during = None;
    while t0.elapsed() < Duration::from_secs(5) {
        let (status, text, took) = agent.get("/metrics");
        assert_eq!(status, 200);
        slowest = slowest.max(took);
        let m = Metrics::parse(&text).unwrap();
        let inflight: f64 = m
            .series("stallwatch_probe_inflight_seconds")
            .into_iter()
            .filter(|(l, _)| l.get("target").map(String::as_str) == Some("frozen"))
            .map(|(_, v)| v)
            .fold(0.0, f64::max);
        max_inflight = max_inflight.max(inflight);
        threads_max = threads_max.max(agent.thread_count());
        during = Some(m);
        std::thread::sleep(Duration::from_millis(100));
    }
    let during = during.unwrap();
    fs.thaw();

    assert!(
        slowest < Duration::from_millis(500),
        "a scrape took {slowest:?} during the freeze"
    );
    assert!(
        max_inflight > 2.0,
        "in-flight age only reached {max_inflight} s"
    );
    let other_during = during
        .get(
            "stallwatch_probes_total",
            &[("target", "other"), ("mode", "create")],
        )
        .unwrap();
    assert!(
        other_during - other_before >= 10.0,
        "other target ran {} cycles in 5 s at 200 ms",
        other_during - other_before
    );
    assert_eq!(
        threads_max, threads_before,
        "thread count grew during the freeze"
    );
    assert!(
        during
            .get(
                "stallwatch_probes_skipped_total",
                &[("target", "frozen"), ("reason", "in_flight")]
            )
            .unwrap()
            >= 5.0,
        "due cycles were not counted as skipped while blocked"
    );
    // After the thaw, the blocked op completes and lands above 4 s.
    assert!(wait_until(
        Duration::from_secs(10),
        Duration::from_millis(100),
        || {
            agent.scrape().sum(
                "stallwatch_probe_duration_seconds_sum",
                &[("target", "frozen")],
            ) - sum_before
                >= 4.0
        }
    ));
    let after = agent.scrape();
    let slow_ops: Vec<String> = after
        .series("stallwatch_probe_duration_seconds_bucket")
        .into_iter()
        .filter(|(l, _)| {
            l.get("target").map(String::as_str) == Some("frozen")
                && l.get("le").map(String::as_str) == Some("2.5")
        })
        .filter_map(|(l, below)| {
            let op = l.get("op").unwrap().clone();
            let mode = l.get("mode").unwrap().clone();
            let total = after
                .get(
                    "stallwatch_probe_duration_seconds_count",
                    &[("target", "frozen"), ("mode", &mode), ("op", &op)],
                )
                .unwrap();
            (total > below).then_some(op)
        })
        .collect();
    assert!(!slow_ops.is_empty(), "no op counted above 2.5 s");
    assert_eq!(
        agent.thread_count(),
        threads_before,
        "thread count changed after the thaw"
    );
}

/// Unmounting a target under the agent: it stops probing, counts the skip, reports the
/// target down, and writes nothing into the bare directory left behind.
#[test]
fn unmounted_target_is_not_probed() {
    if !require_root("unmounted_target_is_not_probed") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("xfs", 320);
    let yaml = format!(
        "targets:\n  - path: {}\n    name: gone\n    interval: 200ms\n",
        fs.path().display()
    );
    let agent = Agent::start(&yaml);
    assert!(agent.wait_up("gone"));
    fs.umount();
    assert!(wait_until(
        Duration::from_secs(5),
        Duration::from_millis(50),
        || {
            agent
                .scrape()
                .get("stallwatch_target_up", &[("target", "gone")])
                == Some(0.0)
        }
    ));
    let skipped = |a: &Agent| {
        a.scrape()
            .get(
                "stallwatch_probes_skipped_total",
                &[("target", "gone"), ("reason", "not_mounted")],
            )
            .unwrap()
    };
    let s1 = skipped(&agent);
    std::thread::sleep(Duration::from_secs(1));
    let s2 = skipped(&agent);
    assert!(s2 - s1 >= 3.0, "not_mounted skips went {s1} -> {s2}");
    let entries: Vec<_> = std::fs::read_dir(fs.path()).unwrap().collect();
    assert!(
        entries.is_empty(),
        "wrote into the bare directory: {entries:?}"
    );
    assert!(agent.wait_log("not a mount point", Duration::from_secs(1)));
    let lines = agent
        .logs()
        .iter()
        .filter(|l| l.contains("not a mount point"))
        .count();
    assert_eq!(
        lines, 1,
        "the transition must be logged once, not per cycle"
    );
    // Mounted again: probing resumes on the same filesystem.
    fs.mount_again();
    assert!(wait_until(
        Duration::from_secs(5),
        Duration::from_millis(50),
        || {
            agent
                .scrape()
                .get("stallwatch_target_up", &[("target", "gone")])
                == Some(1.0)
        }
    ));
}

/// Unmounts on drop, for a mount the test makes beside a `LoopFs`.
struct MountGuard(std::path::PathBuf);

impl Drop for MountGuard {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// On btrfs a subvolume's `st_dev` is an anonymous device that never appears in
/// mountinfo: a subvolume mounted with `subvol=` is a mount point and is probed, a
/// subvolume that is only a directory of its parent mount is not.
#[test]
fn btrfs_subvolume_mounts_pass_the_mount_check() {
    if !require_root("btrfs_subvolume_mounts_pass_the_mount_check") {
        return;
    }
    let _machine = machine::shared();
    let fs = LoopFs::new("btrfs", 256);
    run(
        "btrfs",
        &[
            "-q",
            "subvolume",
            "create",
            fs.path().join("sub").to_str().unwrap(),
        ],
    );
    let subdir = fs.path().join("sub");
    let other = tempfile::tempdir().unwrap();
    let mnt = other.path().join("subvol");
    std::fs::create_dir(&mnt).unwrap();
    run(
        "mount",
        &["-o", "subvol=sub", fs.dev(), mnt.to_str().unwrap()],
    );
    let _guard = MountGuard(mnt.clone());
    let yaml = format!(
        "targets:\n  - path: {}\n    name: top\n    interval: 200ms\n  - path: {}\n    name: subvol\n    interval: 200ms\n  - path: {}\n    name: subdir\n    interval: 200ms\n",
        fs.path().display(),
        mnt.display(),
        subdir.display()
    );
    let agent = Agent::start(&yaml);
    assert!(wait_until(
        Duration::from_secs(10),
        Duration::from_millis(50),
        || {
            let m = agent.scrape();
            m.get("stallwatch_target_up", &[("target", "top")]) == Some(1.0)
                && m.get("stallwatch_target_up", &[("target", "subvol")]) == Some(1.0)
                && m.get(
                    "stallwatch_probes_skipped_total",
                    &[("target", "subdir"), ("reason", "not_mounted")],
                )
                .unwrap_or(0.0)
                    >= 2.0
        }
    ));
    let m = agent.scrape();
    assert_eq!(
        m.get("stallwatch_target_up", &[("target", "subdir")]),
        Some(0.0)
    );
    let info = m.series("stallwatch_target_info");
    let subvol = info
        .iter()
        .find(|(l, _)| l.get("target").map(String::as_str) == Some("subvol"))
        .expect("target_info for the subvolume mount");
    assert_eq!(subvol.0.get("fstype").map(String::as_str), Some("btrfs"));
    assert!(
        subvol.0["options"].contains("subvol=/sub"),
        "{:?}",
        subvol.0
    );
    // The probe wrote into the subvolume's mount, seen as sub/.stallwatch from the top.
    assert!(subdir.join(".stallwatch").is_dir());
    drop(agent);
}
