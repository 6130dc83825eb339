//! Probe lanes on real filesystems: one lane per (target, mode), so a blocked fsync does
//! not stop the same target's create probe; a freeze blocks every lane and each stall
//! names the others; the append probe rotates its log; no thread pile-up.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::agent::Agent;
use crate::support::loopfs::LoopFs;
use crate::support::machine;
use crate::support::metrics::Metrics;
use crate::support::root::require_root;
use crate::support::wait::wait_until;
use crate::support::writer::{random_writer, Kick};

fn stalls(agent: &Agent) -> Vec<Value> {
    let (status, body, _) = agent.get("/api/stalls");
    assert_eq!(status, 200);
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("/api/stalls: {e}: {body}"))
}

fn inflight(m: &Metrics, target: &str, mode: &str, op: &str) -> f64 {
    m.get(
        "stallwatch_probe_inflight_seconds",
        &[("target", target), ("mode", mode), ("op", op)],
    )
    .unwrap_or(0.0)
}

fn cycles(m: &Metrics, target: &str, mode: &str) -> f64 {
    m.get(
        "stallwatch_probes_total",
        &[("target", target), ("mode", mode)],
    )
    .unwrap_or(0.0)
}

/// The question of every stall: is only fsync stuck, or everything? A throttled XFS
/// with a random buffered writer holds the overwrite lane's fsync for seconds; the
/// create lane of the same target keeps its schedule meanwhile.
#[test]
fn a_blocked_fsync_does_not_stop_the_create_lane_of_its_target() {
    if !require_root("a_blocked_fsync_does_not_stop_the_create_lane_of_its_target") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("xfs", 320);
    let yaml = format!(
        "vm_interval: 200ms\nstall_threshold: 1s\ntargets:\n  - path: {}\n    name: slow\n    interval: 500ms\n    modes: [create, overwrite]\n",
        fs.path().display()
    );
    let agent = Agent::start(&yaml);
    assert!(agent.wait_up("slow"));
    fs.throttle_write_bps(1 << 20);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = random_writer(
        &fs.path().join("big"),
        Arc::clone(&stop),
        12288,
        Duration::from_secs(60),
        Kick::FadviseDontneed,
    );

    // From the first scrape that shows the fsync blocked until it has been blocked for
    // 10 s: the create cycles completed in that window against those scheduled.
    let t0 = Instant::now();
    let mut window: Option<(Instant, f64)> = None;
    let mut result = None;
    let mut create_blocked_max: f64 = 0.0;
    let mut page_during = String::new();
    while t0.elapsed() < Duration::from_secs(90) {
        let m = agent.scrape();
        let fsync_age = inflight(&m, "slow", "overwrite", "fsync");
        let create_age = ["prepare", "create", "close", "unlink"]
            .iter()
            .map(|op| inflight(&m, "slow", "create", op))
            .fold(0.0, f64::max);
        match window {
            None if fsync_age > 0.0 => {
                window = Some((Instant::now(), cycles(&m, "slow", "create")));
            }
            Some(_) if fsync_age == 0.0 => {
                // The fsync returned before 10 s: look for a longer one.
                window = None;
                create_blocked_max = 0.0;
            }
            Some((start, done0)) => {
                create_blocked_max = create_blocked_max.max(create_age);
                if fsync_age >= 10.0 {
                    let elapsed = start.elapsed().as_secs_f64();
                    result = Some((elapsed, cycles(&m, "slow", "create") - done0));
                    page_during = agent.get("/").1;
                    break;
                }
            }
            None => {}
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    fs.unthrottle();
    writer.join().unwrap();
    let (elapsed, done) = result.unwrap_or_else(|| {
        panic!(
            "the overwrite lane's fsync was never blocked for 10 s; log:\n{}",
            agent.log_tail(30)
        )
    });
    let scheduled = elapsed / 0.5;
    eprintln!(
        "fsync blocked {elapsed:.1} s: create lane completed {done} of {scheduled:.1} scheduled cycles; longest create call seen {create_blocked_max:.2} s"
    );
    assert!(
        done >= 0.8 * scheduled,
        "create lane completed {done} of {scheduled:.1} cycles while fsync was blocked"
    );
    assert!(
        page_during.contains("overwrite fsync for"),
        "the landing page shows the blocked fsync"
    );

    // The event of the fsync stall names the other lanes that were blocked with it:
    // the create lane only if it was itself held past the threshold.
    assert!(wait_until(
        Duration::from_secs(60),
        Duration::from_millis(200),
        || stalls(&agent)
            .iter()
            .any(|e| e["op"] == "fsync" && e["ongoing"] == false)
    ));
    let events = stalls(&agent);
    let ev = events
        .iter()
        .find(|e| e["op"] == "fsync" && e["ongoing"] == false)
        .unwrap();
    assert!(ev["duration_seconds"].as_f64().unwrap() >= 10.0, "{ev}");
    let also: Vec<&str> = ev["also_blocked"]
        .as_array()
        .expect("also_blocked is a list")
        .iter()
        .map(|b| b["mode"].as_str().unwrap())
        .collect();
    assert!(
        !also.contains(&"overwrite"),
        "a lane is not blocked with itself: {ev}"
    );
    if create_blocked_max >= 1.5 {
        assert_eq!(also, ["create"], "create was seen blocked: {ev}");
    }
}

/// A frozen filesystem blocks every lane: one stall per lane, each naming the others;
/// no thread piles up while they are blocked.
#[test]
fn a_freeze_blocks_every_lane_and_each_stall_names_the_others() {
    if !require_root("a_freeze_blocks_every_lane_and_each_stall_names_the_others") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("xfs", 320);
    let modes = ["create", "overwrite", "append"];
    let yaml = format!(
        "stall_threshold: 1s\ntargets:\n  - path: {}\n    name: frozen\n    interval: 200ms\n    modes: [create, overwrite, append]\n",
        fs.path().display()
    );
    let agent = Agent::start(&yaml);
    assert!(agent.wait_up("frozen"));
    let threads_before = agent.thread_count();
    // One thread per lane, plus main, the sampler and the watchdog: a fixed few.
    assert!(
        threads_before <= modes.len() + 4,
        "{threads_before} threads for {} lanes",
        modes.len()
    );
    fs.freeze();
    let frozen_at = Instant::now();
    let all_ongoing = wait_until(Duration::from_secs(6), Duration::from_millis(50), || {
        stalls(&agent)
            .iter()
            .filter(|e| e["ongoing"] == true)
            .count()
            == modes.len()
    });
    // Many intervals pass while blocked: still no new thread.
    std::thread::sleep(Duration::from_secs(2));
    let threads_during = agent.thread_count();
    fs.thaw();
    assert!(all_ongoing, "not every lane stalled: {:?}", stalls(&agent));
    let freeze = frozen_at.elapsed().as_secs_f64();
    assert_eq!(
        threads_during, threads_before,
        "threads piled up during the freeze"
    );
    assert!(wait_until(
        Duration::from_secs(5),
        Duration::from_millis(50),
        || stalls(&agent).iter().all(|e| e["ongoing"] == false)
    ));
    let events = stalls(&agent);
    assert_eq!(events.len(), modes.len(), "one event per lane: {events:?}");
    let lanes: BTreeSet<&str> = events.iter().map(|e| e["mode"].as_str().unwrap()).collect();
    assert_eq!(lanes, modes.iter().copied().collect());
    for e in &events {
        let me = e["mode"].as_str().unwrap();
        let others: BTreeSet<&str> = e["also_blocked"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["mode"].as_str().unwrap())
            .collect();
        let expected: BTreeSet<&str> = modes.iter().copied().filter(|m| *m != me).collect();
        assert_eq!(others, expected, "{me}'s event: {e}");
        let d = e["duration_seconds"].as_f64().unwrap();
        assert!(
            d > 1.0 && d <= freeze + 0.5,
            "{me}: {d} s of a {freeze:.1} s freeze"
        );
    }
    let total = agent
        .scrape()
        .sum("stallwatch_stalls_total", &[("target", "frozen")]);
    assert_eq!(total, modes.len() as f64);
    assert!(agent.wait_up("frozen"), "up again after the thaw");
    assert_eq!(agent.thread_count(), threads_before);
}

/// Names in the probe directory, or none when it is gone.
fn probe_files(root: &Path) -> Vec<String> {
    match std::fs::read_dir(root.join(".stallwatch")) {
        Ok(d) => d
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The database-commit probe on XFS and ext4: the log grows by appends, is replaced
/// by a new one at the cap, the directory never holds more than the log and the one
/// being rotated in, and nothing is left after shutdown.
#[test]
fn append_rotates_its_log_at_the_cap_and_leaves_nothing_behind() {
    if !require_root("append_rotates_its_log_at_the_cap_and_leaves_nothing_behind") {
        return;
    }
    let _machine = machine::shared();
    let xfs = LoopFs::new("xfs", 320);
    let ext4 = LoopFs::new("ext4", 128);
    let fss = [("x", &xfs), ("e", &ext4)];
    let mut yaml = String::from("targets:\n");
    for (name, fs) in &fss {
        yaml.push_str(&format!(
            "  - path: {}\n    name: {name}\n    interval: 100ms\n    modes: [append]\n    size: 64KiB\n    rotate_size: 256KiB\n",
            fs.path().display()
        ));
    }
    let mut agent = Agent::start(&yaml);
    for (name, _) in &fss {
        assert!(agent.wait_up(name));
    }
    let t0 = Instant::now();
    // A rotation shows as the log getting smaller (XFS reuses the freed inode's number
    // at once, so inode numbers do not tell).
    let mut last_len = [0u64, 0];
    let mut rotations = [0, 0];
    let mut most_files = 0;
    while t0.elapsed() < Duration::from_secs(5) {
        for (i, (name, fs)) in fss.iter().enumerate() {
            let files = probe_files(fs.path());
            most_files = most_files.max(files.len());
            for f in &files {
                assert!(
                    f == "append.log" || f == "append.next",
                    "{name}: unexpected file {f}"
                );
            }
            if let Ok(meta) = std::fs::metadata(fs.path().join(".stallwatch/append.log")) {
                assert!(
                    meta.len() <= 256 << 10,
                    "{name}: log past the cap: {}",
                    meta.len()
                );
                if meta.len() < last_len[i] {
                    rotations[i] += 1;
                }
                last_len[i] = meta.len();
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let m = agent.scrape();
    for (i, (name, _)) in fss.iter().enumerate() {
        let appends = m
            .series("stallwatch_probe_duration_seconds_count")
            .into_iter()
            .filter(|(l, _)| l["target"] == *name && l["mode"] == "append")
            .map(|(l, v)| (l["op"].clone(), v))
            .collect::<Vec<_>>();
        let fdatasyncs = appends
            .iter()
            .find(|(op, _)| op == "fdatasync")
            .map_or(0.0, |(_, v)| *v);
        assert!(fdatasyncs >= 20.0, "{name}: {appends:?}");
        // Four 64 KiB appends fill a log: a new one every four cycles.
        assert!(
            rotations[i] >= 3,
            "{name}: the log was rotated {} times",
            rotations[i]
        );
        assert_eq!(
            m.sum("stallwatch_probe_errors_total", &[("target", name)]),
            0.0,
            "{name}: errors"
        );
    }
    assert!(
        most_files <= 2,
        "more than the log and its successor: {most_files}"
    );
    assert!(agent.signal("TERM"));
    assert!(agent.wait_exit(Duration::from_secs(10)).is_some());
    for (name, fs) in &fss {
        assert!(
            !fs.path().join(".stallwatch").exists(),
            "{name}: left behind: {:?}",
            probe_files(fs.path())
        );
    }
}
