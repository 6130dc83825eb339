//! Reloading the configuration without a restart, on SIGHUP and `POST /-/reload`: targets
//! added, removed and changed take effect; an unchanged target keeps its lanes (the same
//! threads), its histograms and its stall log; an invalid file is refused and the running
//! configuration kept.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::support::agent::Agent;
use crate::support::http::{fresh_client, request};
use crate::support::loopfs::LoopFs;
use crate::support::machine;
use crate::support::metrics::Metrics;
use crate::support::root::require_root;
use crate::support::wait::wait_until;

const WAIT: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(50);

fn target(name: &str, path: &Path, interval: &str) -> String {
    format!(
        "  - path: {}\n    name: {name}\n    interval: {interval}\n    modes: [create, overwrite]\n    require_mountpoint: false\n",
        path.display()
    )
}

fn config(targets: &[String]) -> String {
    format!(
        "vm_interval: 200ms\nstall_threshold: 1s\ntargets:\n{}",
        targets.concat()
    )
}

/// The kernel thread id of each of the agent's threads named `name`.
fn thread_ids(agent: &Agent, name: &str) -> Vec<u32> {
    let mut ids = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{}/task", agent.pid())).unwrap() {
        let e = e.unwrap();
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            ids.push(e.file_name().to_str().unwrap().parse().unwrap());
        }
    }
    ids
}

fn reload_ok(m: &Metrics) -> Option<f64> {
    m.get("stallwatch_config_last_reload_successful", &[])
}

fn reload_time(m: &Metrics) -> f64 {
    m.get(
        "stallwatch_config_last_reload_success_timestamp_seconds",
        &[],
    )
    .unwrap()
}

fn fsync_count(m: &Metrics, t: &str) -> f64 {
    m.get(
        "stallwatch_probe_duration_seconds_count",
        &[("target", t), ("mode", "overwrite"), ("op", "fsync")],
    )
    .unwrap_or(0.0)
}

fn post(agent: &Agent, path: &str) -> (u16, String) {
    let r = request(&fresh_client(), "POST", &agent.url(path), &[]).unwrap();
    (r.status, r.text())
}

#[test]
fn sighup_applies_added_removed_and_changed_targets_and_keeps_the_unchanged_one() {
    if !require_root("sighup_applies_added_removed_and_changed_targets_and_keeps_the_unchanged_one")
    {
        return;
    }
    let _machine = machine::shared();
    let mut keep = LoopFs::new("xfs", 320);
    let (gone, changed, added) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let mut agent = Agent::start(&config(&[
        target("keep", keep.path(), "200ms")
            .replace("require_mountpoint: false", "require_mountpoint: true"),
        target("gone", gone.path(), "200ms"),
        target("changed", changed.path(), "200ms"),
    ]));
    for t in ["keep", "gone", "changed"] {
        assert!(agent.wait_up(t), "{t} up");
    }
    // A stall of the kept target, for its stall log.
    keep.freeze();
    let stalled = wait_until(WAIT, POLL, || {
        agent
            .scrape()
            .sum("stallwatch_stalls_total", &[("target", "keep")])
            > 0.0
    });
    keep.thaw();
    assert!(stalled, "no stall during the freeze");
    assert!(agent.wait_up("keep"));
    let before = agent.scrape();
    let started_at = reload_time(&before);
    assert_eq!(reload_ok(&before), Some(1.0));
    let keep_threads = thread_ids(&agent, "p0-create");
    let changed_threads = thread_ids(&agent, "p2-create");
    assert_eq!((keep_threads.len(), changed_threads.len()), (1, 1));

    std::fs::write(
        agent.config_path(),
        config(&[
            target("keep", keep.path(), "200ms")
                .replace("require_mountpoint: false", "require_mountpoint: true"),
            target("changed", changed.path(), "300ms"),
            target("added", added.path(), "200ms"),
        ]),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(agent.signal("HUP"));
    assert!(
        agent.wait_log("configuration reloaded", WAIT),
        "{}",
        agent.log_tail(20)
    );
    assert!(agent.wait_up("added"), "the added target runs");
    assert!(agent.wait_up("changed"), "the changed target runs again");
    let after = agent.scrape();
    assert_eq!(reload_ok(&after), Some(1.0));
    assert!(reload_time(&after) > started_at);
    // Unchanged: the same lane threads, the histogram and the stall count go on.
    assert_eq!(
        thread_ids(&agent, "p0-create"),
        keep_threads,
        "keep's lane restarted"
    );
    assert!(fsync_count(&after, "keep") >= fsync_count(&before, "keep"));
    assert!(after.sum("stallwatch_stalls_total", &[("target", "keep")]) >= 1.0);
    let (_, body, _) = agent.get("/api/stalls");
    let events: Vec<Value> = serde_json::from_str(&body).unwrap();
    assert!(
        events.iter().any(|e| e["target"] == "keep"),
        "keep's stall log was lost: {body}"
    );
    // Removed: no series left, its files gone.
    assert!(
        !after
            .samples()
            .iter()
            .any(|s| s.labels.get("target").map(String::as_str) == Some("gone")),
        "series of the removed target remain"
    );
    assert!(
        wait_until(WAIT, POLL, || !gone.path().join(".stallwatch").exists()),
        "the removed target's probe directory is left"
    );
    // Changed: new lanes (new threads), at the new interval.
    let new_changed = thread_ids(&agent, "p3-create");
    assert_eq!(new_changed.len(), 1, "the changed target got new lanes");
    assert_ne!(new_changed, changed_threads);
    assert!(
        thread_ids(&agent, "p2-create").is_empty(),
        "old lanes ended"
    );
    let log = agent.logs().join("\n");
    assert!(
        log.contains("changes=\"added added; removed gone; changed changed; 1 unchanged\""),
        "{}",
        agent.log_tail(10)
    );
    assert!(agent.signal("TERM"));
    assert!(agent.wait_exit(WAIT).is_some());
}

#[test]
fn an_invalid_file_is_refused_and_the_running_configuration_kept() {
    let dir = tempfile::tempdir().unwrap();
    let good = config(&[target("t", dir.path(), "200ms")]);
    let agent = Agent::start(&good);
    assert!(agent.wait_up("t"));
    let started_at = reload_time(&agent.scrape());
    std::fs::write(agent.config_path(), "targets:\n  - path: relative\n").unwrap();
    let mut agent = agent;
    assert!(agent.signal("HUP"));
    assert!(agent.wait_log("configuration reload refused", WAIT));
    let m = agent.scrape();
    assert_eq!(reload_ok(&m), Some(0.0));
    assert_eq!(
        reload_time(&m),
        started_at,
        "no successful load since the start"
    );
    // Still probing with the running configuration.
    let n = fsync_count(&m, "t");
    assert!(wait_until(WAIT, POLL, || fsync_count(&agent.scrape(), "t") > n + 2.0));
    assert_eq!(
        agent
            .scrape()
            .get("stallwatch_target_up", &[("target", "t")]),
        Some(1.0)
    );
    // Fixed: loads again.
    std::fs::write(agent.config_path(), &good).unwrap();
    assert!(agent.signal("HUP"));
    assert!(wait_until(WAIT, POLL, || reload_ok(&agent.scrape()) == Some(1.0)));
    assert!(reload_time(&agent.scrape()) > started_at);
}

#[test]
fn the_reload_endpoint_needs_the_lifecycle_flag() {
    let dir = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    let one = config(&[target("t", dir.path(), "200ms")]);

    let off = Agent::start(&one);
    assert!(off.wait_up("t"));
    let (status, body) = post(&off, "/-/reload");
    assert_eq!(
        (status, body.as_str()),
        (403, "Lifecycle API is not enabled.\n")
    );

    let on = Agent::start_with_args(&one, &["--web.enable-lifecycle"]);
    assert!(on.wait_up("t"));
    assert_eq!(on.get("/-/reload").0, 405, "GET does not reload");
    std::fs::write(
        on.config_path(),
        config(&[
            target("t", dir.path(), "200ms"),
            target("u", other.path(), "200ms"),
        ]),
    )
    .unwrap();
    let (status, body) = post(&on, "/-/reload");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        "configuration reloaded: added u; removed none; changed none; 1 unchanged\n"
    );
    assert!(on.wait_up("u"));
    std::fs::write(on.config_path(), "targets: [\n").unwrap();
    let (status, body) = post(&on, "/-/reload");
    assert_eq!(status, 500, "{body}");
    assert!(
        body.starts_with("failed to reload config: ") && body.contains("line"),
        "{body}"
    );
    let m = on.scrape();
    assert_eq!(reload_ok(&m), Some(0.0));
    assert_eq!(m.get("stallwatch_target_up", &[("target", "u")]), Some(1.0));
}
