//! Stall events for real: an fsync stuck behind throttled writeback, and operations
//! blocked by fsfreeze, seen in `/api/stalls` while they last and counted once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::agent::Agent;
use crate::support::loopfs::LoopFs;
use crate::support::machine;
use crate::support::root::require_root;
use crate::support::wait::wait_until;
use crate::support::writer::{random_writer, Kick};

fn stalls(agent: &Agent) -> Vec<Value> {
    let (status, body, _) = agent.get("/api/stalls");
    assert_eq!(status, 200);
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("/api/stalls: {e}: {body}"))
}

fn of_target<'a>(events: &'a [Value], target: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["target"] == target).collect()
}

fn stalls_total(agent: &Agent, target: &str) -> f64 {
    agent
        .scrape()
        .sum("stallwatch_stalls_total", &[("target", target)])
}

/// Checks one event against SPEC's schema.
fn assert_schema(e: &Value) {
    for k in ["target", "mode", "op", "started_at"] {
        assert!(e[k].is_string(), "{k} in {e}");
    }
    let started = e["started_at"].as_str().unwrap();
    assert!(
        started.ends_with('Z') && humantime::parse_rfc3339(started).is_ok(),
        "started_at {started}"
    );
    assert!(e["duration_seconds"].is_f64(), "{e}");
    assert!(e["ongoing"].is_boolean(), "{e}");
    assert!(e["error"].is_null() || e["error"].is_string(), "{e}");
    let vm = &e["vm"];
    for k in [
        "dirty_bytes_start",
        "dirty_bytes_max",
        "writeback_bytes_max",
        "dirty_threshold_bytes",
        "dirty_background_threshold_bytes",
    ] {
        assert!(vm[k].is_u64(), "vm.{k} in {e}");
    }
    assert!(vm["dirty_threshold_bytes"].as_u64().unwrap() > 0);
    let full = &vm["io_pressure_full_seconds"];
    assert!(full.is_null() || full.is_f64(), "{e}");
    assert!(e["md"].is_array(), "{e}");
}

/// The fsync-tester scenario: a random buffered writer into a large file on a throttled
/// XFS, and an overwrite probe each second with a 500 ms threshold.
#[test]
fn fsync_behind_throttled_writeback_is_a_stall_seen_while_ongoing() {
    if !require_root("fsync_behind_throttled_writeback_is_a_stall_seen_while_ongoing") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("xfs", 320);
    let yaml = format!(
        "vm_interval: 100ms\nstall_threshold: 500ms\ntargets:\n  - path: {}\n    name: slow\n    interval: 1s\n    modes: [overwrite]\n",
        fs.path().display()
    );
    let agent = Agent::start(&yaml);
    assert!(agent.wait_up("slow"));
    fs.throttle_write_bps(2 << 20);

    // The writer: random 4 KiB buffered writes into a 64 MiB file, starting writeback
    // every 2 MiB so the device queue stays full. Bounded in bytes and time.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = random_writer(
        &fs.path().join("big"),
        Arc::clone(&stop),
        6144,
        Duration::from_secs(40),
        Kick::SyncFileRange,
    );

    // Watch for the stall while it is ongoing; keep the gauges seen meanwhile.
    let t0 = Instant::now();
    let mut seen_ongoing: Option<Value> = None;
    let mut inflight_when_seen = 0.0;
    let mut dirty_seen: f64 = 0.0;
    let mut writeback_seen: f64 = 0.0;
    let mut dirty_all: f64 = 0.0;
    let mut writeback_all: f64 = 0.0;
    let mut completed: Option<Value> = None;
    while t0.elapsed() < Duration::from_secs(60) && completed.is_none() {
        let m = agent.scrape();
        let dirty = m.get("stallwatch_vm_dirty_bytes", &[]).unwrap();
        let wb = m.get("stallwatch_vm_writeback_bytes", &[]).unwrap();
        dirty_all = dirty_all.max(dirty);
        writeback_all = writeback_all.max(wb);
        let events = stalls(&agent);
        let mine = of_target(&events, "slow");
        match &seen_ongoing {
            None => {
                if let Some(e) = mine.iter().find(|e| e["ongoing"] == true) {
                    seen_ongoing = Some((*e).clone());
                    let op = e["op"].as_str().unwrap().to_owned();
                    inflight_when_seen = agent
                        .scrape()
                        .get(
                            "stallwatch_probe_inflight_seconds",
                            &[("target", "slow"), ("mode", "overwrite"), ("op", &op)],
                        )
                        .unwrap();
                }
            }
            Some(first) => {
                dirty_seen = dirty_seen.max(dirty);
                writeback_seen = writeback_seen.max(wb);
                if let Some(e) = mine
                    .iter()
                    .find(|e| e["started_at"] == first["started_at"] && e["ongoing"] == false)
                {
                    completed = Some((*e).clone());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    fs.unthrottle();
    writer.join().unwrap();

    let first = seen_ongoing.expect("no ongoing stall seen within 60 s");
    assert_schema(&first);
    assert!(
        inflight_when_seen >= 0.5,
        "the call was not still blocked when the event showed ongoing ({inflight_when_seen} s)"
    );
    let done = completed.expect("the stall never completed");
    eprintln!("completed stall event: {done}");
    assert_schema(&done);
    assert!(done["duration_seconds"].as_f64().unwrap() >= 0.5);
    let vm = &done["vm"];
    let dmax = vm["dirty_bytes_max"].as_u64().unwrap() as f64;
    let wmax = vm["writeback_bytes_max"].as_u64().unwrap() as f64;
    assert!(dmax > 0.0 && wmax > 0.0, "{done}");
    // The event's maxima come from the same samples as the gauges scraped during it.
    assert!(
        dmax >= dirty_seen,
        "event dirty max {dmax} < gauge {dirty_seen}"
    );
    assert!(
        wmax >= writeback_seen,
        "event writeback max {wmax} < gauge {writeback_seen}"
    );
    assert!(
        dmax <= dirty_all * 1.05 + 4096.0,
        "event dirty max {dmax} > any gauge {dirty_all}"
    );
    assert!(
        wmax <= writeback_all * 1.05 + 4096.0,
        "{wmax} > {writeback_all}"
    );
    // Counted once: every stall counted has exactly one event.
    let events = stalls(&agent);
    let n = of_target(&events, "slow").len() as f64;
    assert_eq!(stalls_total(&agent, "slow"), n, "{events:?}");
    assert!(agent.wait_log("stall started", Duration::from_secs(1)));
    assert!(agent.wait_log("stall ended", Duration::from_secs(1)));
}

/// A 4 s freeze: one event for the blocked op, ongoing during the freeze, completed
/// with a duration within 0.5 s of the freeze.
#[test]
fn freeze_gives_one_event_per_blocked_op() {
    if !require_root("freeze_gives_one_event_per_blocked_op") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("xfs", 320);
    let yaml = format!(
        "stall_threshold: 1s\ntargets:\n  - path: {}\n    name: frozen\n    interval: 200ms\n    modes: [create]\n",
        fs.path().display()
    );
    let agent = Agent::start(&yaml);
    assert!(agent.wait_up("frozen"));
    fs.freeze();
    let frozen_at = Instant::now();
    let mut ongoing_seen_at = None;
    let mut counted_while_blocked = 0.0;
    while frozen_at.elapsed() < Duration::from_secs(4) {
        if ongoing_seen_at.is_none() {
            let events = stalls(&agent);
            if let Some(e) = of_target(&events, "frozen").first() {
                assert_eq!(e["ongoing"], true);
                assert_eq!(e["op"], "create");
                ongoing_seen_at = Some(frozen_at.elapsed());
                counted_while_blocked = stalls_total(&agent, "frozen");
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    fs.thaw();
    let freeze = frozen_at.elapsed().as_secs_f64();
    let seen = ongoing_seen_at.expect("no ongoing event during the freeze");
    // Threshold 1 s, the op starts within one 200 ms interval of the freeze, the
    // watchdog ticks every 50 ms: seen well before 1.6 s.
    assert!(
        seen < Duration::from_millis(1600),
        "ongoing event seen only at {seen:?}"
    );
    assert_eq!(counted_while_blocked, 1.0, "counted at the crossing, once");
    assert!(wait_until(
        Duration::from_secs(5),
        Duration::from_millis(50),
        || {
            of_target(&stalls(&agent), "frozen")
                .first()
                .is_some_and(|e| e["ongoing"] == false)
        }
    ));
    std::thread::sleep(Duration::from_millis(500));
    let events = stalls(&agent);
    let mine = of_target(&events, "frozen");
    assert_eq!(mine.len(), 1, "one event per blocked op: {events:?}");
    let d = mine[0]["duration_seconds"].as_f64().unwrap();
    assert!(
        (d - freeze).abs() <= 0.5,
        "duration {d} for a {freeze:.2} s freeze"
    );
    assert_eq!(stalls_total(&agent, "frozen"), 1.0);
    assert_schema(mine[0]);
    let (_, page, _) = agent.get("/");
    assert!(page.contains("Recent stalls") && page.contains("create"));
}

/// The ring keeps `stall_log_size` events, newest first.
#[test]
fn stall_log_is_bounded_and_newest_first() {
    if !require_root("stall_log_is_bounded_and_newest_first") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("xfs", 320);
    let yaml = format!(
        "stall_threshold: 200ms\nstall_log_size: 3\ntargets:\n  - path: {}\n    name: ring\n    interval: 100ms\n    modes: [create]\n",
        fs.path().display()
    );
    let agent = Agent::start(&yaml);
    assert!(agent.wait_up("ring"));
    for _ in 0..5 {
        fs.freeze();
        std::thread::sleep(Duration::from_millis(600));
        fs.thaw();
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(wait_until(
        Duration::from_secs(5),
        Duration::from_millis(50),
        || { stalls_total(&agent, "ring") >= 5.0 }
    ));
    let events = stalls(&agent);
    assert_eq!(events.len(), 3, "{events:?}");
    let starts: Vec<_> = events
        .iter()
        .map(|e| humantime::parse_rfc3339(e["started_at"].as_str().unwrap()).unwrap())
        .collect();
    assert!(
        starts.windows(2).all(|w| w[0] >= w[1]),
        "not newest first: {starts:?}"
    );
    for e in &events {
        assert_schema(e);
    }
}

/// The event `id` from `/api/stalls`, or None before there is one; the event itself.
fn only_event(agent: &Agent, target: &str) -> Option<Value> {
    let events = stalls(agent);
    let mine = of_target(&events, target);
    assert!(mine.len() <= 1, "one event per freeze: {events:?}");
    mine.first().map(|e| (*e).clone())
}

/// `GET /api/stalls/{id}` as JSON, asserting 200.
fn stall_by_id(agent: &Agent, id: &str) -> Value {
    let (status, body, _) = agent.get(&format!("/api/stalls/{id}"));
    assert_eq!(status, 200, "/api/stalls/{id}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("/api/stalls/{id}: {e}: {body}"))
}

/// The fields of an event that do not change while it lasts (its context grows), and
/// its keys.
fn settled(e: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for k in [
        "id",
        "target",
        "mode",
        "op",
        "started_at",
        "ongoing",
        "error",
        "counted_cause",
    ] {
        out.insert(k.into(), e[k].clone());
    }
    let keys: Vec<&String> = e.as_object().unwrap().keys().collect();
    out.insert("keys".into(), serde_json::json!(keys));
    Value::Object(out)
}

/// A freeze's event has an `id` from the moment it appears, the same once it ended;
/// `/api/stalls/{id}` serves that one event as the list does, a made-up id is 404; an
/// agent started after the first one gives its stall another id.
#[test]
fn a_stall_is_served_by_its_id_and_a_restart_gives_new_ids() {
    if !require_root("a_stall_is_served_by_its_id_and_a_restart_gives_new_ids") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("xfs", 320);
    let yaml = format!(
        "stall_threshold: 500ms\ntargets:\n  - path: {}\n    name: frozen\n    interval: 200ms\n    modes: [create]\n",
        fs.path().display()
    );
    let freeze_once = |fs: &mut LoopFs, agent: &Agent| -> (Value, Value, Value) {
        assert!(agent.wait_up("frozen"));
        fs.freeze();
        let mut ongoing = None;
        let seen = wait_until(Duration::from_secs(5), Duration::from_millis(50), || {
            ongoing = only_event(agent, "frozen");
            ongoing.is_some()
        });
        let ongoing = ongoing.filter(|_| seen);
        let by_id = ongoing
            .as_ref()
            .map(|e| stall_by_id(agent, e["id"].as_str().expect("id is a string")));
        std::thread::sleep(Duration::from_millis(300));
        fs.thaw();
        let ongoing = ongoing.expect("no ongoing event during the freeze");
        let by_id = by_id.unwrap();
        // Completed, with the evidence worker's reading after the end: nothing changes
        // the event any more.
        let mut done = None;
        assert!(wait_until(
            Duration::from_secs(10),
            Duration::from_millis(100),
            || {
                done = only_event(agent, "frozen")
                    .filter(|e| e["ongoing"] == false && e["evidence"]["complete"] == true);
                done.is_some()
            }
        ));
        (ongoing, by_id, done.unwrap())
    };

    let agent = Agent::start(&yaml);
    let (ongoing, by_id, done) = freeze_once(&mut fs, &agent);
    let id = ongoing["id"].as_str().unwrap().to_owned();
    eprintln!("stall id {id}");
    assert_schema(&by_id);
    assert_eq!(by_id["id"], id);
    assert_eq!(by_id["ongoing"], true);
    assert_eq!(
        settled(&by_id),
        settled(&ongoing),
        "the same event while ongoing"
    );
    assert!(by_id["duration_seconds"].as_f64() >= ongoing["duration_seconds"].as_f64());
    assert_eq!(done["id"], id, "the id is kept when the stall completes");
    assert_eq!(
        stall_by_id(&agent, &id),
        done,
        "the same event once completed"
    );
    assert!(
        id.len() <= 32
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
        "short and URL-safe: {id}"
    );
    for unknown in ["0-0-0", "019ae3f2c1b0-00000000-1", &format!("{id}0")] {
        let (status, body, _) = agent.get(&format!("/api/stalls/{unknown}"));
        assert_eq!(
            (status, body.as_str()),
            (404, "no stall event with this id\n")
        );
    }
    let logged = agent
        .logs()
        .into_iter()
        .filter(|l| l.contains(&format!("id={id} ")))
        .count();
    assert_eq!(
        logged,
        3,
        "stall started, ended, evidence: {}",
        agent.log_tail(20)
    );
    let pid = agent.pid();
    drop(agent);

    // The next run on the same host: another prefix, its own ids.
    let agent = Agent::start(&yaml);
    assert_ne!(agent.pid(), pid);
    let (ongoing, by_id, done) = freeze_once(&mut fs, &agent);
    let again = ongoing["id"].as_str().unwrap();
    eprintln!("stall id after a restart {again}");
    assert_ne!(again, id, "a restart reused an id");
    let run = |id: &str| id.rsplit_once('-').unwrap().0.to_owned();
    assert_ne!(run(again), run(&id), "one prefix per run");
    assert_eq!(by_id["id"], again);
    assert_eq!(done["id"], again);
    let (status, _, _) = agent.get(&format!("/api/stalls/{id}"));
    assert_eq!(status, 404, "the earlier run's event is not this run's");
}
