//! Golden end-to-end test: the real binary reads fixture /proc and /sys trees through
//! `--path.procfs` / `--path.sysfs`, and its VM, pressure, md and device families (the
//! device facts included) must match `tests/fixtures/golden/expected.prom` line for line
//! (HELP, TYPE, samples, in exposition order), as node_exporter's `end-to-end-test.sh`
//! does.
//!
//! `UPDATE_GOLDEN=1 cargo test --test it golden::` rewrites the expected file from this run.
//! Self-contained (nothing from `support`): a fixture tree, a process, one HTTP client.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The families that come from the kernel files alone (`stallwatch_host_info` from
/// `sys/kernel/`); everything else (probe latencies, process metrics, timestamps) depends
/// on the run, not on the fixtures.
const FAMILIES: [&str; 5] = [
    "stallwatch_host_",
    "stallwatch_vm_",
    "stallwatch_pressure_",
    "stallwatch_md_",
    "stallwatch_device_",
];

/// vmstat counts pages and the agent exports bytes, so the expected file holds the
/// fixture's page counts times this.
const GOLDEN_PAGE_SIZE: u64 = 4096;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn expected_path() -> PathBuf {
    fixtures().join("golden/expected.prom")
}

/// A /proc and a /sys tree in a temporary directory, plus the directory probed.
struct Trees {
    dir: tempfile::TempDir,
}

impl Trees {
    /// The proc fixture (vmstat, pressure/io, sys/vm/*, sys/kernel/*), `self/mountinfo` from the
    /// template with the target's real path in it, and the md-raid5-resync sysfs tree:
    /// the target resolves to 9:0, which sysfs maps to md0, a resyncing RAID5.
    fn new() -> Trees {
        let dir = tempfile::Builder::new()
            .prefix("stallwatch-golden-")
            .tempdir()
            .unwrap();
        let proc = dir.path().join("proc");
        copy_tree(&fixtures().join("proc"), &proc);
        copy_tree(
            &fixtures().join("sys/md-raid5-resync"),
            &dir.path().join("sys"),
        );
        let target = dir.path().join("target");
        std::fs::create_dir(&target).unwrap();
        // Canonical, as the agent compares it with mount points.
        let target = std::fs::canonicalize(&target).unwrap();
        let target = target.to_str().unwrap();
        assert!(
            !target.contains(|c: char| c.is_whitespace() || c == '\\'),
            "mountinfo would need escapes for {target:?}"
        );
        let template =
            std::fs::read_to_string(fixtures().join("golden/mountinfo.template")).unwrap();
        std::fs::create_dir(proc.join("self")).unwrap();
        std::fs::write(
            proc.join("self/mountinfo"),
            template.replace("@TARGET@", target),
        )
        .unwrap();
        Trees { dir }
    }

    fn proc(&self) -> PathBuf {
        self.dir.path().join("proc")
    }

    fn sys(&self) -> PathBuf {
        self.dir.path().join("sys")
    }

    /// Replaces `from` by `to` in one fixture file; the test fails if `from` is absent.
    fn edit(&self, rel: &str, from: &str, to: &str) {
        let path = self.dir.path().join(rel);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{rel} has no {from:?}");
        // Written anew, never through a symlink into the checked-in tree.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
    }
}

/// Copies a fixture tree, keeping symlinks as links: sysfs trees are made of relative
/// links that must resolve inside the copy.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().unwrap();
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src).unwrap(), &dst).unwrap();
        } else if kind.is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// The running binary, killed and reaped on drop.
struct Agent {
    child: Child,
    addr: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Agent {
    fn start(trees: &Trees) -> Agent {
        let config = trees.dir.path().join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "vm_interval: 100ms\ntargets:\n  - path: {}\n    name: golden\n    interval: 1s\n    require_mountpoint: false\n",
                trees.dir.path().join("target").display()
            ),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_stallwatch"))
            .arg("--config")
            .arg(&config)
            .args(["--web.listen-address", "127.0.0.1:0"])
            .arg("--path.procfs")
            .arg(trees.proc())
            .arg("--path.sysfs")
            .arg(trees.sys())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Read the log until EOF so the agent never blocks on a full pipe.
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let mut agent = Agent {
            child,
            addr: String::new(),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        agent.addr = loop {
            if let Some(addr) = agent.log.lock().unwrap().iter().find_map(|l| listening(l)) {
                break addr;
            }
            if let Ok(Some(status)) = agent.child.try_wait() {
                std::thread::sleep(Duration::from_millis(100));
                panic!("agent exited ({status}) before listening:\n{}", agent.log());
            }
            assert!(
                Instant::now() < deadline,
                "agent did not log `listening on ADDR` in 15 s:\n{}",
                agent.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        agent
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    fn scrape(&self) -> String {
        let http: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(10)))
            .proxy(None)
            .build()
            .into();
        http.get(&format!("http://{}/metrics", self.addr))
            .call()
            .and_then(|mut r| r.body_mut().read_to_string())
            .unwrap_or_else(|e| panic!("GET /metrics: {e}\nagent log:\n{}", self.log()))
    }

    /// The golden families once they are complete and stable: md and device present
    /// (the probe thread has resolved the target's device and the sampler has read it)
    /// and two scrapes a few samples apart agree.
    fn golden_families(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut last = String::new();
        loop {
            let now = golden_families(&self.scrape());
            let complete = ["stallwatch_md_", "stallwatch_device_"]
                .iter()
                .all(|f| now.contains(&format!("\n{f}")));
            if complete && now == last {
                return now;
            }
            assert!(
                Instant::now() < deadline,
                "md and device families did not appear (or kept changing) in 20 s; last:\n{now}\nagent log:\n{}",
                self.log()
            );
            last = now;
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address in the agent's `listening on ADDR` log line.
fn listening(line: &str) -> Option<String> {
    let rest = &line[line.find("listening on ")? + "listening on ".len()..];
    let addr: String = rest
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != '"')
        .collect();
    addr.contains(':').then_some(addr)
}

/// The lines of the golden families, in exposition order: HELP, TYPE and samples.
fn golden_families(exposition: &str) -> String {
    exposition
        .lines()
        .filter(|l| family(l).is_some_and(|n| FAMILIES.iter().any(|f| n.starts_with(f))))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The metric name a HELP, TYPE or sample line is about; None for other comments.
fn family(line: &str) -> Option<&str> {
    match line
        .strip_prefix("# HELP ")
        .or_else(|| line.strip_prefix("# TYPE "))
    {
        Some(rest) => rest.split(' ').next(),
        None if line.starts_with('#') => None,
        None => line.split(['{', ' ']).next(),
    }
}

/// Ok when equal; otherwise names the families that differ and shows a line diff.
fn compare(expected: &str, actual: &str) -> Result<(), String> {
    if expected == actual {
        return Ok(());
    }
    let diff = similar::TextDiff::from_lines(expected, actual);
    let differing: BTreeSet<&str> = diff
        .iter_all_changes()
        .filter(|c| c.tag() != similar::ChangeTag::Equal)
        .filter_map(|c| family(c.value()))
        .collect();
    Err(format!(
        "families differ from {}: {}\n(UPDATE_GOLDEN=1 cargo test --test it golden:: rewrites it)\n{}",
        expected_path().display(),
        differing.into_iter().collect::<Vec<_>>().join(", "),
        diff.unified_diff().header("expected", "actual")
    ))
}

fn expected() -> String {
    let path = expected_path();
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (UPDATE_GOLDEN=1 cargo test --test it golden:: writes it)",
            path.display()
        )
    })
}

/// Runs the agent on `trees` and returns its golden families.
fn run(trees: &Trees) -> String {
    // The same page size the agent converts with.
    let page = stallwatch::kernel::vm::page_size();
    assert_eq!(
        page, GOLDEN_PAGE_SIZE,
        "expected.prom holds vmstat page counts times {GOLDEN_PAGE_SIZE}; this machine's pages are {page} bytes, so every byte value would differ"
    );
    Agent::start(trees).golden_families()
}

#[test]
fn exposition_matches_the_golden_file() {
    let actual = run(&Trees::new());
    if std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        // Through a rename, so a test reading the file meanwhile sees old or new, whole.
        let tmp = expected_path().with_extension("prom.tmp");
        std::fs::write(&tmp, &actual).unwrap();
        std::fs::rename(&tmp, expected_path()).unwrap();
        eprintln!("rewrote {}", expected_path().display());
        return;
    }
    if let Err(diff) = compare(&expected(), &actual) {
        panic!("{diff}");
    }
}

#[test]
fn a_changed_vmstat_value_fails_the_comparison() {
    let trees = Trees::new();
    trees.edit("proc/vmstat", "\nnr_dirty 103\n", "\nnr_dirty 104\n");
    let diff = compare(&expected(), &run(&trees)).expect_err("nr_dirty 104 went unnoticed");
    assert!(
        diff.contains(": stallwatch_vm_dirty_bytes\n"),
        "only the dirty bytes should differ:\n{diff}"
    );
    assert!(
        diff.contains("\n+stallwatch_vm_dirty_bytes 425984\n"),
        "{diff}"
    );
}

#[test]
fn a_changed_md_sync_action_fails_the_comparison() {
    let trees = Trees::new();
    trees.edit(
        "sys/devices/virtual/block/md0/md/sync_action",
        "resync",
        "check",
    );
    let diff = compare(&expected(), &run(&trees)).expect_err("sync_action check went unnoticed");
    assert!(
        diff.contains(": stallwatch_md_sync_action\n"),
        "only the sync action should differ:\n{diff}"
    );
    assert!(
        diff.contains("\n+stallwatch_md_sync_action{action=\"check\",device=\"md0\"} 1\n"),
        "{diff}"
    );
}

#[test]
fn a_changed_kernel_release_fails_the_comparison() {
    let trees = Trees::new();
    trees.edit(
        "proc/sys/kernel/osrelease",
        "6.1.0-18-amd64",
        "6.1.0-21-amd64",
    );
    let diff = compare(&expected(), &run(&trees)).expect_err("a new kernel went unnoticed");
    assert!(
        diff.contains(": stallwatch_host_info\n"),
        "only the host info should differ:\n{diff}"
    );
    assert!(
        diff.contains("+stallwatch_host_info{kernel_release=\"6.1.0-21-amd64\","),
        "{diff}"
    );
}

#[test]
fn a_changed_write_cache_mode_fails_the_comparison() {
    let trees = Trees::new();
    trees.edit(
        "sys/devices/pci0000:00/0000:00:17.0/ata5/host4/target4:0:0/4:0:0:0/block/sde/queue/write_cache",
        "write through",
        "write back",
    );
    let diff = compare(&expected(), &run(&trees)).expect_err("write back on sde went unnoticed");
    assert!(
        diff.contains(": stallwatch_device_info\n"),
        "only the device facts should differ:\n{diff}"
    );
    assert!(
        diff.contains("\n+stallwatch_device_info{device=\"sde\",fua=\"0\",rotational=\"1\",scheduler=\"mq-deadline\",write_cache=\"write back\"} 1\n"),
        "{diff}"
    );
}
