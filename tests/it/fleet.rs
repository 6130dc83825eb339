//! The fleet rules and dashboard against a fleet: 20 agent processes on this machine, each
//! on its own port with its own filesystem, scraped every second by three real engines at
//! once: Prometheus, loading the shipped alert and recording rules; the same Prometheus
//! with `--enable-feature=native-histograms`, which scrapes protobuf and keeps only the
//! native histogram (no `_bucket` series: Debian's 2.42); and VictoriaMetrics, with
//! vmalert evaluating the same two rule files and writing the results back. The same
//! checks run against each ([`check`] over [`Engine`]); what may stay empty on the
//! native-only Prometheus, and why, is [`NATIVE_ONLY_MAY_BE_EMPTY`]. Four hosts get a fault: one frozen
//! for a few seconds (stalls), one with its writes throttled to a crawl (slow fsync,
//! stalls), one remounted read-only (EROFS errors), one frozen until the end (a call
//! blocked right now). Then every recording rule and every query of both dashboards
//! must return data, the top lists must name the hosts that were made to stall, and the
//! by-kernel grouping must see this machine's `uname -r`, the alerts must fire for the
//! faulted hosts.
//!
//! Root: loop devices, tmpfs mounts, fsfreeze, blkio throttling. Needs prometheus and
//! victoria-metrics (with vmalert).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::support::prom::{dashboard_exprs, grafana_substitute, Engine, Prometheus};
use crate::support::vm::VictoriaMetrics;
use serde_json::Value;

use crate::support::agent::Agent;
use crate::support::cmd::{run, run_cmd};
use crate::support::loopfs::LoopFs;
use crate::support::machine;
use crate::support::root::require_root;
use crate::support::wait::wait_until;

const AGENTS: usize = 20;
const JOB: &str = "stallwatch";

/// A tmpfs the test mounted in its own temporary directory; unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
    mounted: bool,
}

impl Tmpfs {
    fn new() -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix("stallwatch-fleet-")
            .tempdir()
            .unwrap();
        let mut t = Tmpfs {
            dir,
            mounted: false,
        };
        std::fs::create_dir(t.path()).unwrap();
        let mnt = t.path().to_str().unwrap().to_string();
        run(
            "mount",
            &["-t", "tmpfs", "-o", "size=16M,mode=0755", "tmpfs", &mnt],
        );
        t.mounted = true;
        t
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if self.mounted {
            let mnt = self.path().to_str().unwrap().to_string();
            if run_cmd("umount", &[&mnt]).is_err() {
                // Still busy (an agent being reaped): detach it; nothing else mounts here.
                let _ = run_cmd("umount", &["-l", &mnt]);
            }
        }
    }
}

/// One agent probing `path` every second, every op over 500ms a stall.
fn start_agent(path: &Path) -> Agent {
    Agent::start(&format!(
        "vm_interval: 1s\n\
         stall_threshold: 500ms\n\
         defaults:\n  interval: 1s\n  modes: [create, overwrite, append]\n\
         targets:\n  - path: {}\n    name: data\n",
        path.display()
    ))
}

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn dashboard(rel: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(repo_file(rel)).unwrap()).unwrap()
}

/// The recording rules' names, from the shipped file.
fn recorded_names() -> Vec<String> {
    let doc: yaml_serde::Value = yaml_serde::from_str(
        &std::fs::read_to_string(repo_file("deploy/stallwatch.recording.rules.yml")).unwrap(),
    )
    .unwrap();
    doc["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap().iter())
        .map(|r| r["record"].as_str().unwrap().to_string())
        .collect()
}

/// Grafana's variables as a panel would see them for the whole fleet.
fn substitute(expr: &str) -> String {
    grafana_substitute(expr, JOB)
}

/// Per-host dashboard expressions that stay empty in this fleet, and why.
const HOST_DASHBOARD_MAY_BE_EMPTY: &[(&str, &str)] = &[
    (
        "panel md sync action A",
        "no target of the fleet is on an md array",
    ),
    (
        "panel md sync progress A",
        "no target of the fleet is on an md array",
    ),
];

/// What may stay empty on a Prometheus that keeps only native histograms, and why: the
/// expressions that read classic buckets and have no native fallback (docs/fleet.md,
/// "Native histograms in the dashboards"). Keys: "recording rule NAME" and "FILE ORIGIN".
const NATIVE_ONLY_MAY_BE_EMPTY: &[(&str, &str)] = &[
    (
        "recording rule instance_target_mode_op:stallwatch_probe_duration_seconds_bucket:rate5m",
        "no _bucket series; 2.42 cannot record a native histogram usefully",
    ),
    (
        "grafana/stallwatch-fleet.json panel Fleet $op latency A",
        "the heatmaps read classic buckets unless built with nativeHistograms: true",
    ),
    (
        "grafana/stallwatch.json panel $target: $op latency A",
        "the heatmaps read classic buckets unless built with nativeHistograms: true",
    ),
];

/// The fleet as the checks know it: the agents' instances and which were made to fail how.
struct Fleet {
    release: String,
    stalled: BTreeSet<String>,
    throttled: String,
    read_only: String,
    blocked: String,
    /// When the faults began: annotations are asked over the time since.
    faulted: SystemTime,
}

/// The value of `expr` for one instance, 0 when absent.
fn value_of(engine: &dyn Engine, expr: &str, instance: &str) -> f64 {
    engine
        .by_label(expr, "instance")
        .into_iter()
        .find(|(i, _)| i == instance)
        .map(|(_, v)| v)
        .unwrap_or(0.0)
}

/// The faults `engine` does not see yet (empty: it sees them all): stalls on the
/// stalled hosts, errors on the read-only one, a blocked call on the frozen one, a slow
/// fsync on the throttled one.
fn unseen_faults(engine: &dyn Engine, fleet: &Fleet) -> Vec<String> {
    let mut unseen: Vec<String> = fleet
        .stalled
        .iter()
        .filter(|i| value_of(engine, "instance:stallwatch_stalls:rate5m", i) <= 0.0)
        .map(|i| format!("stalls on {i}"))
        .collect();
    if value_of(
        engine,
        "instance:stallwatch_probe_errors:rate5m",
        &fleet.read_only,
    ) <= 0.0
    {
        // Whether the engine has the errors themselves, or only not the recorded rate.
        let raw = value_of(
            engine,
            "sum by (instance) (rate(stallwatch_probe_errors_total[5m]))",
            &fleet.read_only,
        );
        unseen.push(format!(
            "errors on the read-only host (the rate of stallwatch_probe_errors_total: {raw})"
        ));
    }
    if value_of(
        engine,
        "sum by (instance) (instance_target:stallwatch_probe_blocked_calls:sum)",
        &fleet.blocked,
    ) <= 0.0
    {
        unseen.push("a blocked call on the frozen host".into());
    }
    if value_of(
        engine,
        "max by (instance) (instance_target_mode_op:stallwatch_probe_duration_seconds:p99_5m{op=\"fsync\"})",
        &fleet.throttled,
    ) <= 0.5
    {
        unseen.push("fsync p99 > 0.5s on the throttled host".into());
    }
    unseen
}

/// What `engine` got wrong about the fleet (empty: nothing), and how many expressions it
/// was asked: the rules' health, every recording rule and every dashboard query with data
/// (but those in `may_be_empty`, "recording rule NAME" or "FILE ORIGIN" to why), the top
/// lists, the groupings by kernel release and filesystem type, the alerts.
fn check(
    engine: &dyn Engine,
    fleet: &Fleet,
    may_be_empty: &BTreeMap<&str, &str>,
) -> (usize, Vec<String>) {
    let mut failures = Vec::new();
    let mut checked = 0;

    // Every rule the engine loaded is healthy; every recording rule has data.
    let loaded = engine.rules();
    for (group, name, health, err) in &loaded {
        if health != "ok" {
            failures.push(format!("rule {group}/{name}: health {health}: {err}"));
        }
    }
    for name in recorded_names() {
        checked += 1;
        let key = format!("recording rule {name}");
        match engine.query(&name) {
            Err(e) => failures.push(format!("{key}: {e}")),
            Ok(r) if r.is_empty() => match may_be_empty.get(key.as_str()) {
                Some(why) => eprintln!("empty, allowed ({why}): {key}"),
                None => failures.push(format!("{key}: no data")),
            },
            Ok(r) => eprintln!("{} series: {key}", r.len()),
        }
    }
    for group in ["stallwatch.rules", "stallwatch"] {
        if !loaded.iter().any(|(g, ..)| g == group) {
            failures.push(format!("the rule group {group} was not loaded"));
        }
    }

    // Every query of both dashboards evaluates and returns data.
    let host_allowed: BTreeMap<&str, &str> = HOST_DASHBOARD_MAY_BE_EMPTY.iter().cloned().collect();
    for (file, allowed) in [
        ("grafana/stallwatch-fleet.json", BTreeMap::new()),
        ("grafana/stallwatch.json", host_allowed),
    ] {
        for e in dashboard_exprs(&dashboard(file)) {
            let q = substitute(&e.expr);
            assert!(
                !q.contains('$'),
                "{file} {}: unsubstituted variable in {q}",
                e.origin
            );
            checked += 1;
            // Grafana asks for an annotation over the dashboard's time range: here the
            // time since the faults began (a stall is a moment, not a state).
            let answer = if e.origin.starts_with("annotation ") {
                engine.query_range(&q, fleet.faulted, "1s")
            } else {
                engine.query(&q)
            };
            match answer {
                Err(err) => failures.push(format!("{file} {}: {err}\n    {q}", e.origin)),
                Ok(r) if r.is_empty() => match allowed
                    .get(e.origin.as_str())
                    .or(may_be_empty.get(format!("{file} {}", e.origin).as_str()))
                {
                    Some(why) => eprintln!("empty, allowed ({why}): {file} {}", e.origin),
                    None => failures.push(format!("{file} {}: no data\n    {q}", e.origin)),
                },
                Ok(r) => eprintln!("{} series: {file} {}", r.len(), e.origin),
            }
        }
    }

    // The top lists pick the hosts that were made to stall.
    let fleet_dash = dashboard("grafana/stallwatch-fleet.json");
    let panel_expr = |title: &str| -> String {
        let e = dashboard_exprs(&fleet_dash)
            .into_iter()
            .find(|e| e.origin == format!("panel {title} A"))
            .unwrap_or_else(|| panic!("fleet dashboard has no panel {title:?}"));
        substitute(&e.expr)
    };
    let ranked = |title: &str| -> Vec<(String, f64)> {
        let mut r = engine.by_label(&panel_expr(title), "instance");
        r.sort_by(|a, b| b.1.total_cmp(&a.1));
        r
    };
    let top_stalls = ranked("Top hosts by stalls");
    eprintln!("[fleet] Top hosts by stalls: {top_stalls:?}");
    let ranks: BTreeMap<&str, usize> = top_stalls
        .iter()
        .enumerate()
        .map(|(n, (i, _))| (i.as_str(), n))
        .collect();
    for i in &fleet.stalled {
        match ranks.get(i.as_str()) {
            // Above every host that was left alone (a loaded machine may make one of
            // them stall once; the faulted ones stalled at least once per lane).
            Some(&n) if n < fleet.stalled.len() => {}
            other => failures.push(format!(
                "Top hosts by stalls: {i} (made to stall) at rank {other:?}: {top_stalls:?}"
            )),
        }
    }
    let top_fsync = ranked("Top hosts by fsync p99");
    eprintln!(
        "[fleet] Top hosts by fsync p99: {:?}",
        &top_fsync[..top_fsync.len().min(3)]
    );
    if top_fsync.first().map(|(i, _)| i.as_str()) != Some(fleet.throttled.as_str()) {
        failures.push(format!(
            "Top hosts by fsync p99: the throttled host {} is not first: {top_fsync:?}",
            fleet.throttled
        ));
    }
    let top_errors = ranked("Top hosts by errors");
    if top_errors.first().map(|(i, _)| i.as_str()) != Some(fleet.read_only.as_str()) {
        failures.push(format!(
            "Top hosts by errors: the read-only host {} is not first: {top_errors:?}",
            fleet.read_only
        ));
    }
    let blocked_now = engine.by_label(
        &panel_expr("Hosts with a call blocked right now"),
        "instance",
    );
    if !blocked_now.iter().any(|(i, _)| *i == fleet.blocked) {
        failures.push(format!(
            "Hosts with a call blocked right now: {} (frozen) missing: {blocked_now:?}",
            fleet.blocked
        ));
    }

    // Grouped by kernel release: this machine's, all 20 hosts; stalls by release and fstype.
    let release = &fleet.release;
    let by_release = engine.by_label(&panel_expr("Hosts per kernel release"), "kernel_release");
    if by_release != vec![(release.clone(), AGENTS as f64)] {
        failures.push(format!(
            "count by (kernel_release): {by_release:?}, expected [({release:?}, {AGENTS})] (uname -r)"
        ));
    }
    let stalls_by_release =
        engine.by_label("kernel_release:stallwatch_stalls:rate5m", "kernel_release");
    if !stalls_by_release
        .iter()
        .any(|(r, v)| r == release && *v > 0.0)
    {
        failures.push(format!(
            "kernel_release:stallwatch_stalls:rate5m has no stalls for {release}: {stalls_by_release:?}"
        ));
    }
    let by_fstype: BTreeMap<String, f64> = engine
        .by_label("fstype:stallwatch_stalls:rate5m", "fstype")
        .into_iter()
        .collect();
    for fs in ["ext4", "xfs"] {
        if by_fstype.get(fs).is_none_or(|v| *v <= 0.0) {
            failures.push(format!(
                "fstype:stallwatch_stalls:rate5m: no stalls on {fs}: {by_fstype:?}"
            ));
        }
    }
    if !by_fstype.contains_key("tmpfs") {
        failures.push(format!(
            "fstype:stallwatch_stalls:rate5m: no tmpfs series: {by_fstype:?}"
        ));
    }

    // The alerts fire for the faulted hosts.
    for (alert, hosts) in [
        ("StallwatchStalls", fleet.stalled.clone()),
        (
            "StallwatchProbeErrors",
            BTreeSet::from([fleet.read_only.clone()]),
        ),
    ] {
        let firing: BTreeSet<String> = engine
            .by_label(
                &format!("ALERTS{{alertname=\"{alert}\",alertstate=\"firing\"}}"),
                "instance",
            )
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        for h in hosts {
            if !firing.contains(&h) {
                failures.push(format!("{alert} not firing for {h}: {firing:?}"));
            }
        }
    }
    (checked, failures)
}

#[test]
fn fleet_rules_and_dashboards_against_twenty_agents() {
    if !require_root("fleet_rules_and_dashboards_against_twenty_agents") {
        return;
    }
    // Twenty agents and two engines load the machine; the stalls made are timed.
    let _machine = machine::exclusive();
    let started = Instant::now();
    let release = run("uname", &["-r"]).trim().to_string();

    // Filesystems first, so they are torn down after the agents.
    let mut frozen = LoopFs::new("ext4", 64);
    let mut throttled = LoopFs::new("ext4", 64);
    let mut read_only = LoopFs::new("ext4", 64);
    let mut blocked = LoopFs::new("xfs", 320);
    let tmpfs: Vec<Tmpfs> = (0..AGENTS - 4).map(|_| Tmpfs::new()).collect();
    let mut paths: Vec<PathBuf> = vec![
        frozen.path().to_owned(),
        throttled.path().to_owned(),
        read_only.path().to_owned(),
        blocked.path().to_owned(),
    ];
    paths.extend(tmpfs.iter().map(Tmpfs::path));
    let agents: Vec<Agent> = paths.iter().map(|p| start_agent(p)).collect();
    let inst: Vec<String> = agents.iter().map(|a| a.addr().to_string()).collect();
    let fleet = Fleet {
        release,
        stalled: [&inst[0], &inst[1], &inst[3]]
            .into_iter()
            .cloned()
            .collect(),
        throttled: inst[1].clone(),
        read_only: inst[2].clone(),
        blocked: inst[3].clone(),
        faulted: SystemTime::now(),
    };
    eprintln!(
        "[fleet] {AGENTS} agents up after {:.1}s: frozen {}, throttled {}, read-only {}, blocked {}",
        started.elapsed().as_secs_f64(),
        inst[0],
        fleet.throttled,
        fleet.read_only,
        fleet.blocked
    );

    // Both engines scrape the same agents and evaluate the same two rule files.
    let rules = [
        repo_file("deploy/stallwatch.rules.yml"),
        repo_file("deploy/stallwatch.recording.rules.yml"),
    ];
    let [prom_dir, native_dir, vm_dir] = [(); 3].map(|_| tempfile::tempdir().unwrap());
    let prom = Prometheus::builder(prom_dir.path(), JOB)
        .targets(&inst)
        .rules(&rules)
        .interval("1s")
        .start();
    let native = Prometheus::builder(native_dir.path(), JOB)
        .targets(&inst)
        .rules(&rules)
        .interval("1s")
        .flag("--enable-feature=native-histograms")
        .start();
    let vm = VictoriaMetrics::start(vm_dir.path(), JOB, &inst, &rules, "1s");
    let native_allowed: BTreeMap<&str, &str> = NATIVE_ONLY_MAY_BE_EMPTY.iter().cloned().collect();
    // (name in messages, engine, what may stay empty there)
    let engines: [(&str, &dyn Engine, BTreeMap<&str, &str>); 3] = [
        ("Prometheus", &prom, BTreeMap::new()),
        (
            "Prometheus (native histograms only)",
            &native,
            native_allowed,
        ),
        ("VictoriaMetrics", &vm, BTreeMap::new()),
    ];
    let diag = |what: &str| {
        let logs: Vec<String> = engines
            .iter()
            .map(|(name, e, _)| format!("--- {name} log\n{}", e.log()))
            .collect();
        format!("{what}\n{}", logs.join("\n"))
    };

    // Every agent scraped a few times by each engine, every rule evaluated.
    for (name, engine, _) in &engines {
        let engine = *engine;
        let warm = wait_until(Duration::from_secs(60), Duration::from_millis(500), || {
            engine.ready()
                && engine.scalar(&format!("count(up{{job=\"{JOB}\"}} == 1)")) == AGENTS as f64
                && engine.scalar(&format!("min(count_over_time(up{{job=\"{JOB}\"}}[1m]))")) >= 5.0
        });
        assert!(
            warm,
            "{}",
            diag(&format!(
                "{name} did not scrape all 20 agents 5 times in 60s"
            ))
        );
        eprintln!(
            "[fleet] {name} has 5 scrapes of each after {:.1}s",
            started.elapsed().as_secs_f64()
        );
    }
    // The native-only engine is what it says: native histograms, no classic buckets (the
    // check can fail: the other Prometheus has buckets and no native histogram).
    for (engine, buckets, natives) in [(&prom, true, false), (&native, false, true)] {
        let has = |e: &str| !engine.query(e).unwrap_or_default().is_empty();
        assert_eq!(
            (
                has("count(stallwatch_probe_duration_seconds_bucket)"),
                has("histogram_count(stallwatch_probe_duration_seconds)")
            ),
            (buckets, natives),
            "{}",
            diag("(classic buckets, native histograms) in the two Prometheus")
        );
    }

    // The faults.
    let fleet = Fleet {
        faulted: SystemTime::now(),
        ..fleet
    };
    throttled.throttle_write_bps(8 * 1024);
    read_only.remount_ro();
    frozen.freeze();
    std::thread::sleep(Duration::from_secs(3));
    frozen.thaw();
    blocked.freeze();
    let faulted = Instant::now();

    // Until each engine sees what was done (bounded), then the same checks on each.
    let mut failures = Vec::new();
    let mut checked = 0;
    for (name, engine, may_be_empty) in &engines {
        let engine = *engine;
        let mut unseen = Vec::new();
        let seen = wait_until(Duration::from_secs(60), Duration::from_millis(500), || {
            let now = unseen_faults(engine, &fleet);
            if now != unseen {
                eprintln!(
                    "[fleet] {name} after {:.1}s does not see yet: {now:?}",
                    faulted.elapsed().as_secs_f64()
                );
                unseen = now;
            }
            unseen.is_empty()
        });
        assert!(
            seen,
            "{}",
            diag(&format!(
                "within 60s of the faults {name} did not see: stalls {:?}, errors {:?}, blocked {:?}, fsync p99 {:?}",
                engine.by_label("instance:stallwatch_stalls:rate5m > 0", "instance"),
                engine.by_label("instance:stallwatch_probe_errors:rate5m > 0", "instance"),
                engine.by_label("instance_target:stallwatch_probe_blocked_calls:sum > 0", "instance"),
                engine.by_label("topk(3, instance_target_mode_op:stallwatch_probe_duration_seconds:p99_5m)", "instance"),
            ))
        );
        eprintln!(
            "[fleet] {name}: faults visible {:.1}s after they began",
            faulted.elapsed().as_secs_f64()
        );
        let (n, fails) = check(engine, &fleet, may_be_empty);
        checked += n;
        failures.extend(fails.into_iter().map(|f| format!("{name}: {f}")));
    }

    // Thaw before the guards run, so the blocked agent can die when it is killed.
    blocked.thaw();
    let took = started.elapsed();
    eprintln!(
        "[fleet] {checked} expressions checked on {} engines; run time {:.1}s",
        engines.len(),
        took.as_secs_f64()
    );
    if !failures.is_empty() {
        panic!(
            "{} of the fleet checks failed:\n  - {}\n{}",
            failures.len(),
            failures.join("\n  - "),
            diag("")
        );
    }
    drop(engines);
    drop(vm);
    drop(native);
    drop(prom);
    drop(agents);
}
