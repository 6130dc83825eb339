//! The stall record (`--storage.path DIR`, `DIR/stalls.jsonl`) across restarts and
//! crashes, on the real binary: a `kill -9` during a freeze, a clean restart, a record
//! cut short, a garbage file, a full and a read-only state directory (each on a loop
//! filesystem the test made). None may stop the agent or a probe.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use procfs::process::Process;
use serde_json::Value;

use crate::support::agent::Agent;
use crate::support::cmd::run;
use crate::support::loopfs::LoopFs;
use crate::support::machine;
use crate::support::root::require_root;
use crate::support::wait::wait_until;

const RECORD: &str = "stalls.jsonl";

fn stalls(agent: &Agent) -> Vec<Value> {
    let (status, body, _) = agent.get("/api/stalls");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("/api/stalls: {e}: {body}"))
}

fn by_id(agent: &Agent, id: &str) -> Value {
    let (status, body, _) = agent.get(&format!("/api/stalls/{id}"));
    assert_eq!(status, 200, "/api/stalls/{id}: {body}");
    serde_json::from_str(&body).unwrap()
}

fn storage_errors(agent: &Agent) -> f64 {
    agent
        .scrape()
        .get("stallwatch_storage_errors_total", &[])
        .expect("stallwatch_storage_errors_total is always exported")
}

fn probes(agent: &Agent, target: &str) -> f64 {
    agent
        .scrape()
        .sum("stallwatch_probes_total", &[("target", target)])
}

fn yaml(path: &Path, name: &str) -> String {
    format!(
        "stall_threshold: 1s\ntargets:\n  - path: {}\n    name: {name}\n    interval: 200ms\n    modes: [create]\n",
        path.display()
    )
}

/// A target on a plain directory (no root, no loop filesystem, no stalls).
fn plain_yaml(path: &Path) -> String {
    format!(
        "targets:\n  - path: {}\n    name: t\n    interval: 200ms\n    modes: [create]\n    require_mountpoint: false\n",
        path.display()
    )
}

fn start(yaml: &str, dir: &Path) -> Agent {
    Agent::start_with_args(yaml, &["--storage.path", dir.to_str().unwrap()])
}

/// Freezes `fs` until `target`'s event is seen ongoing with `until` true of it, then
/// `hold` longer; returns the event as last seen while ongoing (not thawed).
fn freeze_until(
    fs: &mut LoopFs,
    agent: &Agent,
    target: &str,
    until: impl Fn(&Value) -> bool,
) -> Value {
    assert!(agent.wait_up(target), "{}", agent.log_tail(30));
    fs.freeze();
    let mut seen = None;
    wait_until(Duration::from_secs(8), Duration::from_millis(100), || {
        seen = stalls(agent)
            .into_iter()
            .find(|e| e["target"] == target && e["ongoing"] == true && until(e));
        seen.is_some()
    });
    match seen {
        Some(e) => e,
        None => {
            fs.thaw();
            panic!(
                "no ongoing event of {target} as wanted: {:?}",
                stalls(agent)
            );
        }
    }
}

/// A stall of `target`: a freeze of `secs`, the event completed with its final
/// evidence; returns it.
fn one_stall(fs: &mut LoopFs, agent: &Agent, target: &str, secs: f64) -> Value {
    let t0 = Instant::now();
    let ongoing = freeze_until(fs, agent, target, |_| true);
    std::thread::sleep(Duration::from_secs_f64(secs).saturating_sub(t0.elapsed()));
    fs.thaw();
    let id = ongoing["id"].as_str().unwrap().to_owned();
    let mut done = None;
    let ended = wait_until(Duration::from_secs(10), Duration::from_millis(100), || {
        let e = by_id(agent, &id);
        let ok = e["ongoing"] == false && e["evidence"]["complete"] == true;
        done = Some(e);
        ok
    });
    assert!(ended, "the stall did not complete: {done:?}");
    done.unwrap()
}

/// The record file's event ids, newest first (after the header line).
fn ids_on_disk(dir: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(dir.join(RECORD)) else {
        return Vec::new();
    };
    text.lines()
        .skip(1)
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["event"]["id"].as_str().map(str::to_owned))
        .collect()
}

fn on_disk(dir: &Path, id: &str) -> bool {
    ids_on_disk(dir).iter().any(|i| i == id)
}

/// The event of `id` as written on disk.
fn disk_event(dir: &Path, id: &str) -> Option<Value> {
    let text = std::fs::read_to_string(dir.join(RECORD)).ok()?;
    text.lines()
        .skip(1)
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| v["event"].clone())
        .find(|e| e["id"] == id)
}

/// While a stall lasts, its progress is written every 5 s, not at every look: the
/// record may share a disk with the stall it describes. A 9 s freeze, the record's
/// writes counted by the file each one renames into place (inode and mtime): with a
/// write a second it would be 8 or more; here the start, the first wait point and
/// evidence reading, one or two progress writes.
#[test]
fn an_ongoing_stall_is_written_every_five_seconds_not_every_second() {
    if !require_root("an_ongoing_stall_is_written_every_five_seconds_not_every_second") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("ext4", 64);
    let state = tempfile::tempdir().unwrap();
    let agent = start(&yaml(fs.path(), "paced"), state.path());
    let t0 = Instant::now();
    let ongoing = freeze_until(&mut fs, &agent, "paced", |_| true);
    let id = ongoing["id"].as_str().unwrap().to_owned();
    let mut writes = std::collections::BTreeSet::new();
    while t0.elapsed() < Duration::from_secs(9) {
        if let Ok(m) = std::fs::metadata(state.path().join(RECORD)) {
            use std::os::unix::fs::MetadataExt as _;
            if disk_event(state.path(), &id).is_some_and(|e| e["ongoing"] == true) {
                writes.insert((m.ino(), m.mtime(), m.mtime_nsec()));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    fs.thaw();
    eprintln!("writes of the ongoing event in 9 s: {}", writes.len());
    assert!(
        (1..=5).contains(&writes.len()),
        "{} writes while the stall lasted",
        writes.len()
    );
}

/// (a) `kill -9` in the middle of a 5 s freeze, restarted on the same directory: the
/// event is back, interrupted, with the duration of the last write and the evidence
/// gathered so far; not counted again; new stalls get new ids.
#[test]
fn kill_9_during_a_freeze_restores_the_event_as_interrupted() {
    if !require_root("kill_9_during_a_freeze_restores_the_event_as_interrupted") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("ext4", 64);
    let state = tempfile::tempdir().unwrap();
    let yaml = yaml(fs.path(), "frozen");
    let mut agent = start(&yaml, state.path());
    let t0 = Instant::now();
    // Ongoing, with wait points and a reading of the evidence, and written so.
    let ongoing = freeze_until(&mut fs, &agent, "frozen", |e| {
        e["wchan"].as_array().is_some_and(|w| !w.is_empty())
            && e["evidence"]["reads"].as_u64().unwrap_or(0) >= 1
    });
    let id = ongoing["id"].as_str().unwrap().to_owned();
    let written = wait_until(Duration::from_secs(3), Duration::from_millis(100), || {
        disk_event(state.path(), &id).is_some_and(|e| {
            e["ongoing"] == true && e["evidence"]["reads"].as_u64().unwrap_or(0) >= 1
        })
    });
    assert!(written, "the ongoing event was not written within 3 s");
    std::thread::sleep(Duration::from_millis(1200));
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "too slow to kill inside the freeze"
    );
    let before_kill = disk_event(state.path(), &id).unwrap();
    agent.signal("KILL");
    std::thread::sleep(Duration::from_secs(5).saturating_sub(t0.elapsed()));
    fs.thaw();
    assert!(
        agent.wait_exit(Duration::from_secs(10)).is_some(),
        "the killed agent did not exit after the thaw"
    );
    let last_written = disk_event(state.path(), &id).unwrap();
    assert_eq!(last_written["ongoing"], true, "written while ongoing");
    drop(agent);

    let agent = start(&yaml, state.path());
    assert!(agent.wait_log("stall record loaded", Duration::from_secs(10)));
    let e = by_id(&agent, &id);
    eprintln!("restored: {e}");
    assert_eq!(e["restored"], true, "{e}");
    assert_eq!(e["interrupted"], true, "{e}");
    assert_eq!(e["ongoing"], false, "{e}");
    let d = e["duration_seconds"].as_f64().unwrap();
    assert_eq!(
        d,
        last_written["duration_seconds"].as_f64().unwrap(),
        "the duration known at the last write"
    );
    // An ongoing event's progress is written every 5 s (store::PROGRESS_PERIOD), so the
    // last write may predate what the API showed; it is past the 1 s threshold, and
    // no later than the kill.
    assert!(
        d >= 1.0 && d >= before_kill["duration_seconds"].as_f64().unwrap() && d < 5.5,
        "{d}"
    );
    assert!(
        !e["wchan"].as_array().unwrap().is_empty(),
        "wait points: {e}"
    );
    assert!(e["evidence"]["reads"].as_u64().unwrap() >= 1, "{e}");
    assert!(!e["verdict"].as_str().unwrap().is_empty(), "{e}");
    assert_eq!(e["cause"], ongoing["cause"]);
    // Served in the list as by its id, and on its page.
    let listed = stalls(&agent);
    assert!(listed
        .iter()
        .any(|x| x["id"] == id.as_str() && x["restored"] == true));
    let (status, page, _) = agent.get(&format!("/stalls/{id}"));
    assert_eq!(status, 200);
    assert!(
        page.contains("restored from its stall record") && page.contains("Interrupted"),
        "the page says so"
    );
    // Counters restart from zero: the restored event is not counted again.
    assert!(agent.wait_up("frozen"));
    assert_eq!(
        agent
            .scrape()
            .sum("stallwatch_stalls_total", &[("target", "frozen")]),
        0.0
    );
    assert_eq!(storage_errors(&agent), 0.0);
    // A new stall: another id, the restored one kept.
    let mut fs = fs;
    let new = one_stall(&mut fs, &agent, "frozen", 1.6);
    assert_ne!(new["id"], id.as_str());
    assert_eq!(
        (new["restored"].clone(), new["interrupted"].clone()),
        (false.into(), false.into())
    );
    assert_eq!(by_id(&agent, &id)["interrupted"], true);
}

/// (b) A completed event survives a clean restart (SIGTERM): restored, not
/// interrupted, the same facts.
#[test]
fn a_completed_event_survives_a_clean_restart() {
    if !require_root("a_completed_event_survives_a_clean_restart") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("ext4", 64);
    let state = tempfile::tempdir().unwrap();
    let yaml = yaml(fs.path(), "frozen");
    let mut agent = start(&yaml, state.path());
    let done = one_stall(&mut fs, &agent, "frozen", 2.0);
    let id = done["id"].as_str().unwrap().to_owned();
    let chart_before = window_charts(&agent, &id);
    assert!(!chart_before.is_empty(), "no device chart on /stalls/{id}");
    agent.signal("TERM");
    assert!(agent.wait_exit(Duration::from_secs(10)).is_some());
    drop(agent);
    assert!(on_disk(state.path(), &id));

    let agent = start(&yaml, state.path());
    assert!(agent.wait_log("stall record loaded", Duration::from_secs(10)));
    let e = by_id(&agent, &id);
    assert_eq!(e["restored"], true, "{e}");
    assert_eq!(e["interrupted"], false, "{e}");
    for k in [
        "target",
        "mode",
        "op",
        "started_at",
        "duration_seconds",
        "ongoing",
        "cause",
        "wchan",
        "vm",
        "evidence",
        "verdict",
    ] {
        assert_eq!(e[k], done[k], "{k}");
    }
    // The device window's per-interval figures, not in the JSON, are kept too.
    assert_eq!(window_charts(&agent, &id), chart_before);
    assert_eq!(storage_errors(&agent), 0.0);
}

/// The device window charts (`<svg class="window" ...>`) of `/stalls/{id}`.
fn window_charts(agent: &Agent, id: &str) -> Vec<String> {
    let (status, page, _) = agent.get(&format!("/stalls/{id}"));
    assert_eq!(status, 200);
    page.split("<svg class=\"window\"")
        .skip(1)
        .map(|s| s.split("</svg>").next().unwrap().to_owned())
        .collect()
}

/// One event line as the record holds it, for the tests that write a record by hand
/// (the documented format, docs/stall-events.md).
fn record_line(id: &str, secs: f64) -> String {
    let event = serde_json::json!({
        "id": id, "target": "t", "mode": "create", "op": "create",
        "started_at": "2026-12-04T17:00:00.123Z", "duration_seconds": secs,
        "ongoing": false, "error": null,
        "vm": {"dirty_bytes_start": 0, "dirty_bytes_max": 0, "writeback_bytes_max": 0,
               "dirty_threshold_bytes": 1, "dirty_background_threshold_bytes": 1,
               "io_pressure_some_seconds": null, "io_pressure_full_seconds": null},
        "md": [], "device": null, "also_blocked": [],
        "wchan": [{"symbol": "percpu_rwsem_wait", "count": 12}],
        "stack": null, "cause": "frozen", "counted_cause": "frozen", "verdict": "x",
        "evidence": {"reads": 2, "complete": true, "cgroup_version": null,
          "cgroups_walked": 0, "cgroup_reads_capped": 0, "dirtiers": [], "writers": [],
          "processes_unreadable": 0, "block_devices": [], "journal": null}
    });
    serde_json::json!({"event": event, "symbol": "percpu_rwsem_wait", "intervals": []}).to_string()
}

fn header(events: usize) -> String {
    format!("{{\"format\":\"stallwatch-stalls\",\"version\":1,\"events\":{events}}}")
}

/// (c) A record cut in the middle of its third event: the agent starts, says that one
/// event was lost, restores the two whole ones.
#[test]
fn a_truncated_record_loads_what_is_whole_and_says_what_was_lost() {
    let state = tempfile::tempdir().unwrap();
    let probed = tempfile::tempdir().unwrap();
    let lines = [
        record_line("0190000000aa-00000001-3", 3.0),
        record_line("0190000000aa-00000001-2", 2.0),
        record_line("0190000000aa-00000001-1", 1.0),
    ];
    let mut text = format!("{}\n{}\n{}\n", header(3), lines[0], lines[1]);
    text.push_str(&lines[2][..lines[2].len() / 2]);
    std::fs::write(state.path().join(RECORD), &text).unwrap();
    let agent = start(&plain_yaml(probed.path()), state.path());
    assert!(
        agent.wait_log("1 event(s) lost", Duration::from_secs(10)),
        "{}",
        agent.log_tail(20)
    );
    let events = stalls(&agent);
    let ids: Vec<&str> = events.iter().filter_map(|e| e["id"].as_str()).collect();
    assert_eq!(ids, ["0190000000aa-00000001-3", "0190000000aa-00000001-2"]);
    assert!(events
        .iter()
        .all(|e| e["restored"] == true && e["interrupted"] == false));
    assert_eq!(storage_errors(&agent), 0.0, "a torn tail is not an error");
    assert!(agent.wait_up("t"));
}

/// (d) A file that is not a record: moved aside with its bytes, counted, the agent runs.
#[test]
fn a_garbage_record_is_moved_aside_not_deleted() {
    let state = tempfile::tempdir().unwrap();
    let probed = tempfile::tempdir().unwrap();
    let garbage: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(state.path().join(RECORD), &garbage).unwrap();
    let agent = start(&plain_yaml(probed.path()), state.path());
    assert!(agent.wait_up("t"));
    assert!(wait_until(
        Duration::from_secs(5),
        Duration::from_millis(100),
        || { storage_errors(&agent) == 1.0 }
    ));
    let aside: Vec<PathBuf> = std::fs::read_dir(state.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("stalls.jsonl.corrupt-")
        })
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read(&aside[0]).unwrap(), garbage, "the same bytes");
    assert!(!state.path().join(RECORD).exists());
    assert!(agent.wait_log("moved aside", Duration::from_secs(1)));
    assert!(stalls(&agent).is_empty());
    let before = probes(&agent, "t");
    assert!(wait_until(
        Duration::from_secs(5),
        Duration::from_millis(100),
        || { probes(&agent, "t") > before }
    ));
}

/// A tmpfs of 1 MiB the test mounts in a temporary directory of its own, unmounted on
/// drop: full means full there (ext4 keeps room for small files past a `dd` fill).
struct SmallTmpfs {
    mnt: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallTmpfs {
    fn new() -> SmallTmpfs {
        let dir = tempfile::Builder::new()
            .prefix("stallwatch-tmpfs-")
            .tempdir()
            .unwrap();
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                "size=1m",
                "tmpfs",
                mnt.to_str().unwrap(),
            ],
        );
        SmallTmpfs { mnt, _dir: dir }
    }

    fn path(&self) -> &Path {
        &self.mnt
    }

    /// Fills it up (`dd` ends with ENOSPC, expected).
    fn fill(&mut self) {
        let of = format!("of={}", self.mnt.join("fill").display());
        let _ = std::process::Command::new("dd")
            .args(["if=/dev/zero", &of, "bs=64k"])
            .output();
    }

    fn free_fill(&mut self) {
        std::fs::remove_file(self.mnt.join("fill")).unwrap();
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let mnt = self.mnt.to_str().unwrap();
        let unmounted = std::process::Command::new("umount")
            .arg(mnt)
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            let _ = std::process::Command::new("umount")
                .args(["-l", mnt])
                .status();
        }
    }
}

/// What holds the state directory in the failing-directory tests.
trait StateFs {
    fn path(&self) -> &Path;
}

impl StateFs for LoopFs {
    fn path(&self) -> &Path {
        LoopFs::path(self)
    }
}

impl StateFs for SmallTmpfs {
    fn path(&self) -> &Path {
        SmallTmpfs::path(self)
    }
}

/// The state directory is on `state`, a small filesystem of its own, while `fs` is
/// frozen for stalls: with the record failing, the agent and its probes run on, errors
/// are counted and logged once; after `repair` the record is written again.
fn failing_state_dir<S: StateFs>(
    mut state: S,
    mut fs: LoopFs,
    break_it: impl FnOnce(&mut S),
    repair: impl FnOnce(&mut S),
) {
    let dir = state.path().join("state");
    break_it(&mut state);
    let agent = start(&yaml(fs.path(), "frozen"), &dir);
    let stall = one_stall(&mut fs, &agent, "frozen", 1.6);
    let id = stall["id"].as_str().unwrap().to_owned();
    assert!(
        wait_until(Duration::from_secs(5), Duration::from_millis(100), || {
            storage_errors(&agent) >= 2.0
        }),
        "storage errors not counted: {}",
        storage_errors(&agent)
    );
    let before = probes(&agent, "frozen");
    assert!(wait_until(
        Duration::from_secs(5),
        Duration::from_millis(100),
        || { probes(&agent, "frozen") > before + 3.0 }
    ));
    let said = agent
        .logs()
        .iter()
        .filter(|l| l.contains("stall record not written"))
        .count();
    assert_eq!(said, 1, "logged once: {}", agent.log_tail(30));
    assert!(!on_disk(&dir, &id));
    repair(&mut state);
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(200), || {
            on_disk(&dir, &id)
        }),
        "not written again after the repair: {}",
        agent.log_tail(20)
    );
    assert!(agent.wait_log("stall record written again", Duration::from_secs(2)));
    let errors = storage_errors(&agent);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        storage_errors(&agent),
        errors,
        "no more errors once written"
    );
    let e = disk_event(&dir, &id).unwrap();
    assert_eq!(e["ongoing"], false);
    drop(agent);
    drop(fs);
    drop(state);
}

/// (e) A full state directory (its own small tmpfs, filled up).
#[test]
fn a_full_state_dir_is_counted_and_written_again_once_freed() {
    if !require_root("a_full_state_dir_is_counted_and_written_again_once_freed") {
        return;
    }
    let _machine = machine::shared();
    let state = SmallTmpfs::new();
    let fs = LoopFs::new("ext4", 64);
    failing_state_dir(state, fs, SmallTmpfs::fill, SmallTmpfs::free_fill);
}

/// (f) A read-only state directory (its own filesystem, mounted read-only).
#[test]
fn a_read_only_state_dir_is_counted_and_written_again_once_writable() {
    if !require_root("a_read_only_state_dir_is_counted_and_written_again_once_writable") {
        return;
    }
    let _machine = machine::shared();
    let state = LoopFs::new("ext4", 16);
    std::fs::create_dir(state.path().join("state")).unwrap();
    let fs = LoopFs::new("ext4", 64);
    failing_state_dir(state, fs, LoopFs::remount_ro, LoopFs::remount_rw);
}

/// A state disk that hangs (its filesystem frozen while the record is written): the
/// probes, the stall log and the HTTP side go on, and SIGTERM is not held up by the
/// stuck writer.
#[test]
fn a_hung_state_disk_delays_nothing_and_does_not_block_shutdown() {
    if !require_root("a_hung_state_disk_delays_nothing_and_does_not_block_shutdown") {
        return;
    }
    let _machine = machine::shared();
    let mut state = LoopFs::new("ext4", 64);
    let dir = state.path().join("state");
    std::fs::create_dir(&dir).unwrap();
    let mut fs = LoopFs::new("ext4", 64);
    let mut agent = start(&yaml(fs.path(), "frozen"), &dir);
    assert!(agent.wait_up("frozen"));
    state.freeze();
    // The writer blocks on the frozen state disk at this stall's first write.
    let stall = one_stall(&mut fs, &agent, "frozen", 1.6);
    let id = stall["id"].as_str().unwrap().to_owned();
    let threads = || -> Vec<(String, char)> {
        Process::new(agent.pid() as i32)
            .and_then(|p| p.tasks())
            .map(|tasks| {
                tasks
                    .flatten()
                    .filter_map(|t| t.stat().ok())
                    .map(|s| (s.comm, s.state))
                    .collect()
            })
            .unwrap_or_default()
    };
    let stuck = wait_until(Duration::from_secs(3), Duration::from_millis(100), || {
        threads()
            .iter()
            .any(|(comm, state)| comm == "stall-store" && *state == 'D')
    });
    assert!(
        stuck,
        "the stall-store thread is not blocked on the frozen state disk: {:?}",
        threads()
    );
    let before = probes(&agent, "frozen");
    let t0 = Instant::now();
    assert!(wait_until(
        Duration::from_secs(5),
        Duration::from_millis(100),
        || { probes(&agent, "frozen") > before + 3.0 }
    ));
    let (status, _, took) = agent.get(&format!("/api/stalls/{id}"));
    assert_eq!(status, 200);
    assert!(
        took < Duration::from_secs(1),
        "/api/stalls/{{id}} took {took:?}"
    );
    eprintln!(
        "probes advanced in {:.2} s with the writer stuck; /api/stalls/{{id}} in {took:?}",
        t0.elapsed().as_secs_f64()
    );
    let t0 = Instant::now();
    agent.signal("TERM");
    assert!(
        agent.wait_log("stopped", Duration::from_secs(8)),
        "shutdown held up by the stuck writer: {}",
        agent.log_tail(20)
    );
    let stop = t0.elapsed();
    eprintln!(
        "SIGTERM to `stopped` with the writer stuck: {:.2} s",
        stop.as_secs_f64()
    );
    assert!(agent.wait_log(
        "the last write did not finish in time",
        Duration::from_secs(1)
    ));
    state.thaw();
    assert!(agent.wait_exit(Duration::from_secs(10)).is_some());
}

/// Garbage in a read-only state directory cannot be moved aside at start: it stays, is
/// never written over, and is moved aside (same bytes) before the first write once the
/// directory is writable again.
#[test]
fn garbage_in_a_read_only_dir_is_moved_aside_once_writable_never_overwritten() {
    if !require_root("garbage_in_a_read_only_dir_is_moved_aside_once_writable_never_overwritten") {
        return;
    }
    let _machine = machine::shared();
    let mut state = LoopFs::new("ext4", 16);
    let dir = state.path().join("state");
    std::fs::create_dir(&dir).unwrap();
    let garbage = b"{\"not\": \"a record\"}\n".repeat(10);
    std::fs::write(dir.join(RECORD), &garbage).unwrap();
    state.remount_ro();
    let mut fs = LoopFs::new("ext4", 64);
    let agent = start(&yaml(fs.path(), "frozen"), &dir);
    assert!(agent.wait_log("could not be moved aside", Duration::from_secs(5)));
    let stall = one_stall(&mut fs, &agent, "frozen", 1.6);
    let id = stall["id"].as_str().unwrap().to_owned();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(std::fs::read(dir.join(RECORD)).unwrap(), garbage);
    assert!(storage_errors(&agent) >= 2.0);
    state.remount_rw();
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(200), || {
            on_disk(&dir, &id)
        }),
        "{}",
        agent.log_tail(20)
    );
    let aside: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().contains(".corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read(&aside[0]).unwrap(), garbage, "the same bytes");
    drop(agent);
}

/// Two agents on one state directory (a manual run beside the service): the second
/// keeps no record and says so; the first's lock file is what tells it.
#[test]
fn a_second_agent_on_the_same_directory_keeps_no_record() {
    let state = tempfile::tempdir().unwrap();
    let probed = tempfile::tempdir().unwrap();
    let first = start(&plain_yaml(probed.path()), state.path());
    assert!(first.wait_up("t"), "{}", first.log_tail(20));
    let second = start(&plain_yaml(probed.path()), state.path());
    assert!(second.wait_up("t"), "{}", second.log_tail(20));
    assert!(
        second.wait_log("in use by another agent", Duration::from_secs(5)),
        "{}",
        second.log_tail(20)
    );
    assert_eq!(storage_errors(&second), 1.0);
    assert!(
        !first
            .logs()
            .iter()
            .any(|l| l.contains("in use by another agent")),
        "{}",
        first.log_tail(20)
    );
    assert_eq!(storage_errors(&first), 0.0);
}
