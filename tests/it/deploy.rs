//! Deployment artifacts, checked with the real tools: the hardened systemd unit
//! (`systemd-analyze verify` and `security`), the Prometheus configuration and alert rules
//! (`promtool check` and `promtool test rules`), the Grafana dashboard (structure), the
//! Debian package (`scripts/check-package.sh`: cargo-deb + lintian), and finally the
//! dashboard and the rules evaluated by a real Prometheus scraping the real agent.
//!
//! Needs: systemd (systemd-analyze), prometheus (promtool, prometheus), lintian, cargo-deb.
//! A missing tool fails the test with the install command: these checks must not silently
//! turn into no checks.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::prom::{dashboard_exprs, Prometheus};
use serde_json::Value;

use crate::support::cmd::{repo, tool, which};
use crate::support::http::{fresh_client, request};
use crate::support::machine;

// ---------------------------------------------------------------------------------------
// helpers

fn repo_file(rel: &str) -> PathBuf {
    repo().join(rel)
}

fn systemd_analyze() -> PathBuf {
    tool("systemd-analyze", "apt-get install systemd")
}

fn promtool() -> PathBuf {
    tool("promtool", "apt-get install prometheus")
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn text(out: &Output) -> String {
    format!(
        "status: {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo_file(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The unit with ExecStart pointing at the binary cargo built, in `dir`, plus the
/// documented drop-in installed as `stallwatch.service.d/mounts.conf`.
fn unit_copy(dir: &Path, with_dropin: bool) -> PathBuf {
    let unit = read("systemd/stallwatch.service");
    let exec = "ExecStart=/usr/bin/stallwatch ";
    assert!(
        unit.contains(exec),
        "the unit must start /usr/bin/stallwatch (the packaged path)"
    );
    let bin = env!("CARGO_BIN_EXE_stallwatch");
    let unit = unit.replace(exec, &format!("ExecStart={bin} "));
    let path = dir.join("stallwatch.service");
    std::fs::write(&path, unit).unwrap();
    if with_dropin {
        let d = dir.join("stallwatch.service.d");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(
            repo_file("systemd/stallwatch.service.d/mounts.conf.example"),
            d.join("mounts.conf"),
        )
        .unwrap();
    }
    path
}

/// Values of `Key=` assignments in a unit file (comments skipped).
fn directives(unit: &str, key: &str) -> Vec<String> {
    unit.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with(';'))
        .filter_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(|v| v.trim().to_string())
        .collect()
}

/// `systemd-analyze verify` of `units` copied into `dir` (man page under `dir/man`),
/// which must succeed; returns its complaints: the stderr lines naming any of `ours`
/// (verify exits 0 for unknown keys and bad values, but prints them).
fn verify(dir: &Path, units: &[PathBuf], ours: &[&str]) -> Vec<String> {
    let mut cmd = Command::new(systemd_analyze());
    cmd.arg("verify");
    if which("man").is_none() {
        eprintln!("`man` not installed (apt-get install man-db): not checking man:stallwatch(1)");
        cmd.arg("--man=no");
    }
    let out = run(cmd
        .args(units)
        .env("MANPATH", dir.join("man"))
        // Unit search path: the copy's directory first (so the drop-in directory next to
        // it is read), then the defaults (trailing colon).
        .env("SYSTEMD_UNIT_PATH", format!("{}:", dir.display()))
        .env("SYSTEMD_LOG_LEVEL", "notice"));
    assert!(
        out.status.success(),
        "systemd-analyze verify failed:\n{}",
        text(&out)
    );
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| ours.iter().any(|o| l.contains(o)))
        .map(String::from)
        .collect()
}

// ---------------------------------------------------------------------------------------
// systemd

#[test]
fn systemd_unit_verifies() {
    let tmp = tempfile::tempdir().unwrap();
    for with_dropin in [false, true] {
        let dir = tmp
            .path()
            .join(if with_dropin { "dropin" } else { "plain" });
        std::fs::create_dir_all(&dir).unwrap();
        let unit = unit_copy(&dir, with_dropin);
        // Documentation=man:stallwatch(1): verify runs `man`; give it the page the
        // package installs.
        let man = dir.join("man/man1");
        std::fs::create_dir_all(&man).unwrap();
        std::fs::copy(repo_file("debian/stallwatch.1"), man.join("stallwatch.1")).unwrap();
        let complaints = verify(&dir, &[unit], &["stallwatch", "mounts.conf"]);
        assert!(
            complaints.is_empty(),
            "systemd-analyze verify complained (drop-in: {with_dropin}):\n{}",
            complaints.join("\n")
        );
    }
}

/// The socket activation example (systemd/examples/stallwatch.socket and the drop-in that
/// points the service at it) verifies with the unit, and the drop-in starts the agent
/// with the flag the agent knows.
#[test]
fn systemd_socket_example_verifies() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    unit_copy(dir, false);
    let bin = env!("CARGO_BIN_EXE_stallwatch");
    let dropin = read("systemd/stallwatch.service.d/socket-activation.conf.example");
    let exec = directives(&dropin, "ExecStart");
    assert_eq!(exec.len(), 2, "ExecStart= reset, then set: {exec:?}");
    assert!(exec[0].is_empty());
    assert!(
        exec[1].starts_with("/usr/bin/stallwatch ")
            && exec[1].contains("--web.systemd-socket")
            && exec[1].contains("--storage.path /var/lib/stallwatch"),
        "{exec:?}"
    );
    assert!(directives(&dropin, "Requires").contains(&"stallwatch.socket".to_string()));
    let d = dir.join("stallwatch.service.d");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(
        d.join("socket-activation.conf"),
        dropin.replace(
            "ExecStart=/usr/bin/stallwatch ",
            &format!("ExecStart={bin} "),
        ),
    )
    .unwrap();
    let socket = read("systemd/examples/stallwatch.socket");
    assert_eq!(directives(&socket, "ListenStream"), ["19858"]);
    std::fs::write(dir.join("stallwatch.socket"), &socket).unwrap();
    let man = dir.join("man/man1");
    std::fs::create_dir_all(&man).unwrap();
    std::fs::copy(repo_file("debian/stallwatch.1"), man.join("stallwatch.1")).unwrap();
    let complaints = verify(
        dir,
        &[
            dir.join("stallwatch.socket"),
            dir.join("stallwatch.service"),
        ],
        &["stallwatch", "socket-activation"],
    );
    assert!(
        complaints.is_empty(),
        "systemd-analyze verify complained:\n{}",
        complaints.join("\n")
    );
    // The flag exists: the drop-in's command line parses (it fails for want of a socket,
    // with the activation error, not a usage error).
    let out = run(Command::new(bin)
        .args(["--web.systemd-socket", "--config"])
        .arg(repo_file("config.example.yaml"))
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID"));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("no socket activation file descriptors found"),
        "{}",
        text(&out)
    );
    // The exposure stays within bounds with the drop-in, too.
    let (value, all) = exposure(&dir.join("stallwatch.service"), dir);
    assert!(
        value <= 2.0,
        "exposure {value} > 2.0 with the socket drop-in:\n{all}"
    );
}

fn exposure(unit: &Path, unit_path: &Path) -> (f64, String) {
    let out = run(Command::new(systemd_analyze())
        .args(["security", "--offline=true", "--no-pager"])
        .arg(unit)
        .env("SYSTEMD_UNIT_PATH", format!("{}:", unit_path.display()))
        .env("SYSTEMD_COLORS", "0"));
    let all = text(&out);
    let line = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("no \"Overall exposure level\" line:\n{all}"))
        .to_string();
    // "→ Overall exposure level for stallwatch.service: 1.2 OK 🙂"
    let value = line
        .rsplit_once(": ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("cannot parse exposure from {line:?}"));
    (value, all)
}

#[test]
fn systemd_unit_security_exposure_at_most_2() {
    let tmp = tempfile::tempdir().unwrap();
    for with_dropin in [false, true] {
        let dir = tmp
            .path()
            .join(if with_dropin { "dropin" } else { "plain" });
        std::fs::create_dir_all(&dir).unwrap();
        let unit = unit_copy(&dir, with_dropin);
        let (value, all) = exposure(&unit, &dir);
        assert!(
            value <= 2.0,
            "exposure {value} > 2.0 (drop-in: {with_dropin}):\n{all}"
        );
    }
}

#[test]
fn systemd_unit_hardening_as_documented() {
    let unit = read("systemd/stallwatch.service");
    let one = |key: &str| -> String {
        let v = directives(&unit, key);
        assert_eq!(v.len(), 1, "{key}= must be set exactly once, found {v:?}");
        v[0].clone()
    };
    assert_eq!(one("User"), "stallwatch");
    assert_eq!(one("Group"), "stallwatch");
    assert_eq!(one("CapabilityBoundingSet"), "", "no capabilities at all");
    assert_eq!(one("AmbientCapabilities"), "");
    assert_eq!(one("NoNewPrivileges"), "yes");
    assert_eq!(one("ProtectSystem"), "strict");
    assert_eq!(one("ProtectProc"), "invisible");
    assert!(
        directives(&unit, "ProcSubset").is_empty(),
        "ProcSubset=pid hides /proc/vmstat, /proc/pressure and /proc/sys"
    );
    assert!(
        directives(&unit, "DynamicUser").is_empty(),
        "a static user, created by the package"
    );
    assert!(
        directives(&unit, "PrivateUsers").is_empty(),
        "PrivateUsers would show probed files as nobody's and can lock the mounts"
    );
    assert_eq!(
        directives(&unit, "SystemCallFilter")
            .first()
            .map(String::as_str),
        Some("@system-service")
    );
    for key in [
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectKernelLogs",
        "ProtectControlGroups",
        "ProtectClock",
        "ProtectHostname",
        "RestrictNamespaces",
        "RestrictRealtime",
        "RestrictSUIDSGID",
        "RestrictAddressFamilies",
        "LockPersonality",
        "MemoryDenyWriteExecute",
        "SystemCallArchitectures",
        "MemoryMax",
        "TasksMax",
    ] {
        one(key);
    }
    assert_eq!(
        one("ExecStart"),
        "/usr/bin/stallwatch --config /etc/stallwatch/config.yaml --storage.path /var/lib/stallwatch"
    );
    // The stall record's directory: systemd creates it for the service's user.
    assert_eq!(one("StateDirectory"), "stallwatch");
    // The base unit probes nothing by itself: the mount points come from the drop-in.
    assert!(directives(&unit, "ReadWritePaths").is_empty());
    assert!(
        unit.contains("bind-mount") || unit.contains("bind mount"),
        "the unit must explain why ReadWritePaths= names mount points"
    );

    let dropin = read("systemd/stallwatch.service.d/mounts.conf.example");
    let rw: Vec<String> = directives(&dropin, "ReadWritePaths")
        .iter()
        .flat_map(|v| v.split_whitespace().map(String::from).collect::<Vec<_>>())
        .collect();
    assert!(
        !rw.is_empty(),
        "the drop-in example must show ReadWritePaths="
    );
    for p in &rw {
        assert!(
            !p.contains(".stallwatch"),
            "ReadWritePaths= must name the mount point, not {p}"
        );
    }
    let mounts: Vec<String> = directives(&dropin, "RequiresMountsFor")
        .iter()
        .flat_map(|v| v.split_whitespace().map(String::from).collect::<Vec<_>>())
        .collect();
    for p in &rw {
        assert!(
            mounts.contains(p),
            "{p} is in ReadWritePaths= but not in RequiresMountsFor="
        );
    }
}

// ---------------------------------------------------------------------------------------
// Prometheus

#[test]
fn promtool_check_rules() {
    let out = run(Command::new(promtool())
        .args(["check", "rules"])
        .arg(repo_file("deploy/stallwatch.rules.yml")));
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn promtool_test_rules() {
    let out = run(Command::new(promtool())
        .args(["test", "rules"])
        .arg(repo_file("deploy/stallwatch.rules.test.yml")));
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn promtool_check_config() {
    let out = run(Command::new(promtool())
        .args(["check", "config"])
        .arg(repo_file("deploy/prometheus.yml")));
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("2 rule files found"),
        "prometheus.yml must load stallwatch.rules.yml and stallwatch.recording.rules.yml:\n{}",
        text(&out)
    );
}

const REQUIRED_ALERTS: &[&str] = &[
    "StallwatchProbeBlocked",
    "StallwatchFsyncLatencyHigh",
    "StallwatchCreateLatencyHigh",
    "StallwatchStalls",
    "StallwatchProbeErrors",
    "StallwatchTargetDown",
    "StallwatchDirtyNearThreshold",
    "StallwatchAbsent",
];

/// (alert name, expr) of every alerting rule.
fn alert_rules() -> Vec<(String, String)> {
    let doc: yaml_serde::Value =
        yaml_serde::from_str(&read("deploy/stallwatch.rules.yml")).unwrap();
    let mut out = Vec::new();
    for group in doc["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"]
                .as_str()
                .expect("only alerting rules")
                .to_string();
            let expr = rule["expr"].as_str().expect("expr").to_string();
            out.push((name, expr));
        }
    }
    out
}

#[test]
fn rules_have_summary_description_and_tests() {
    let doc: yaml_serde::Value =
        yaml_serde::from_str(&read("deploy/stallwatch.rules.yml")).unwrap();
    let tests: yaml_serde::Value =
        yaml_serde::from_str(&read("deploy/stallwatch.rules.test.yml")).unwrap();
    // alert name -> (tested firing, tested not firing)
    let mut tested: HashMap<String, (bool, bool)> = HashMap::new();
    for t in tests["tests"].as_sequence().expect("tests") {
        for a in t["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = a["alertname"].as_str().unwrap().to_string();
            let firing = a["exp_alerts"].as_sequence().is_some_and(|v| !v.is_empty());
            let e = tested.entry(name).or_default();
            if firing {
                e.0 = true;
            } else {
                e.1 = true;
            }
        }
    }
    let mut names = BTreeSet::new();
    for group in doc["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let name = rule["alert"].as_str().unwrap();
            names.insert(name.to_string());
            for key in ["summary", "description"] {
                let v = rule["annotations"][key].as_str().unwrap_or("");
                assert!(
                    v.len() > 20,
                    "{name}: annotation {key} missing or too short"
                );
            }
            assert!(
                rule["annotations"]["description"]
                    .as_str()
                    .unwrap()
                    .contains("Look at"),
                "{name}: the description must tell the operator what to look at"
            );
            assert!(
                rule["labels"]["severity"].as_str().is_some(),
                "{name}: severity label"
            );
            let (firing, quiet) = tested.get(name).copied().unwrap_or_default();
            assert!(firing, "{name}: no promtool test case where it fires");
            assert!(
                quiet,
                "{name}: no promtool test case where it does not fire"
            );
        }
    }
    for a in REQUIRED_ALERTS {
        assert!(names.contains(*a), "alert {a} missing");
    }
}

// ---------------------------------------------------------------------------------------
// Grafana

/// Every metric name the agent exports (SPEC's table plus the documented extras).
const KNOWN_METRICS: &[&str] = &[
    // The native histogram, as a Prometheus scraping protobuf names it (docs/metrics.md).
    "stallwatch_probe_duration_seconds",
    "stallwatch_probe_duration_seconds_bucket",
    "stallwatch_probe_duration_seconds_sum",
    "stallwatch_probe_duration_seconds_count",
    "stallwatch_probe_inflight_seconds",
    "stallwatch_probe_errors_total",
    "stallwatch_probes_total",
    "stallwatch_probes_skipped_total",
    "stallwatch_stalls_total",
    "stallwatch_target_up",
    "stallwatch_target_info",
    "stallwatch_last_success_timestamp_seconds",
    "stallwatch_vm_dirty_bytes",
    "stallwatch_vm_writeback_bytes",
    "stallwatch_vm_dirty_threshold_bytes",
    "stallwatch_vm_dirty_background_threshold_bytes",
    "stallwatch_vm_dirtied_bytes_total",
    "stallwatch_vm_written_bytes_total",
    "stallwatch_vm_dirty_ratio",
    "stallwatch_vm_dirty_background_ratio",
    "stallwatch_vm_dirty_bytes_setting",
    "stallwatch_vm_dirty_background_bytes_setting",
    "stallwatch_vm_dirty_expire_seconds",
    "stallwatch_vm_dirty_writeback_seconds",
    "stallwatch_pressure_io_some_seconds_total",
    "stallwatch_pressure_io_full_seconds_total",
    "stallwatch_md_sync_action",
    "stallwatch_md_sync_completed_ratio",
    "stallwatch_device_inflight_requests",
    "stallwatch_build_info",
    "stallwatch_host_info",
    // beyond SPEC's table, exported by the agent:
    "stallwatch_target_read_only",
    "stallwatch_vm_sample_errors_total",
    // lanes (issue 11):
    "stallwatch_lane_up",
    "stallwatch_lane_skipped_total",
    // the memory lock (issue 14):
    "stallwatch_memory_locked",
    // causes (issue 12):
    "stallwatch_probe_blocked_cause",
];

/// Metrics the issue asks the dashboard to show.
const DASHBOARD_MUST_SHOW: &[&str] = &[
    "stallwatch_probe_duration_seconds_bucket",
    "stallwatch_probe_inflight_seconds",
    "stallwatch_stalls_total",
    "stallwatch_probe_errors_total",
    "stallwatch_target_up",
    "stallwatch_vm_dirty_bytes",
    "stallwatch_vm_writeback_bytes",
    "stallwatch_vm_dirty_threshold_bytes",
    "stallwatch_vm_dirty_background_threshold_bytes",
    "stallwatch_pressure_io_some_seconds_total",
    "stallwatch_pressure_io_full_seconds_total",
    "stallwatch_md_sync_action",
    "stallwatch_lane_up",
];

fn dashboard() -> Value {
    serde_json::from_str(&read("grafana/stallwatch.json")).expect("grafana/stallwatch.json is JSON")
}

/// All panels, rows' nested panels included.
fn all_panels(dash: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        out.push(p.clone());
        if let Some(nested) = p["panels"].as_array() {
            out.extend(nested.iter().cloned());
        }
    }
    out
}

/// `label_values(QUERY, label)` -> (QUERY, label)
fn label_values_query(q: &str) -> Option<(String, String)> {
    let body = q.trim().strip_prefix("label_values(")?.strip_suffix(')')?;
    let (query, label) = body.rsplit_once(',')?;
    Some((query.trim().to_string(), label.trim().to_string()))
}

fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let rest: String = chars[i..].iter().collect();
        let boundary = i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        if boundary && (rest.starts_with("stallwatch_") || rest.starts_with("process_")) {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            i += name.len();
            out.insert(name);
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn dashboard_structure() {
    let dash = dashboard();
    assert!(dash["id"].is_null(), "importable: id must be null");
    assert!(dash["uid"].as_str().is_some_and(|u| !u.is_empty()));
    assert!(dash["title"].as_str().is_some_and(|u| !u.is_empty()));

    let vars: HashMap<String, Value> = dash["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .map(|v| (v["name"].as_str().unwrap().to_string(), v.clone()))
        .collect();
    let ds = vars.get("datasource").expect("datasource variable");
    assert_eq!(ds["type"], "datasource");
    assert_eq!(ds["query"], "prometheus");
    for name in ["instance", "target"] {
        let v = vars.get(name).unwrap_or_else(|| panic!("{name} variable"));
        assert_eq!(v["type"], "query", "{name}");
        assert_eq!(
            v["datasource"]["uid"], "${datasource}",
            "{name} uses $datasource"
        );
    }

    let panels = all_panels(&dash);
    let mut ids = BTreeSet::new();
    let mut used = BTreeSet::new();
    let mut heatmap = false;
    for p in &panels {
        let title = p["title"].as_str().unwrap_or("");
        assert!(!title.is_empty(), "panel without title: {p}");
        let id = p["id"].as_u64().unwrap_or_else(|| panic!("{title}: id"));
        assert!(ids.insert(id), "duplicate panel id {id}");
        for k in ["x", "y", "w", "h"] {
            assert!(p["gridPos"][k].is_u64(), "{title}: gridPos.{k}");
        }
        if p["type"] == "row" {
            continue;
        }
        let desc = p["description"].as_str().unwrap_or("");
        assert!(
            desc.len() >= 40,
            "{title}: description missing or too short"
        );
        assert_eq!(
            p["datasource"]["uid"], "${datasource}",
            "{title}: datasource"
        );
        let targets = p["targets"]
            .as_array()
            .unwrap_or_else(|| panic!("{title}: targets"));
        assert!(!targets.is_empty(), "{title}: no targets");
        for t in targets {
            let e = t["expr"].as_str().unwrap_or("");
            assert!(!e.trim().is_empty(), "{title}: empty expr");
            assert_eq!(
                t["datasource"]["uid"], "${datasource}",
                "{title}: target datasource"
            );
        }
        if p["type"] == "heatmap" {
            heatmap = true;
            let e = targets[0]["expr"].as_str().unwrap();
            assert!(
                e.contains("stallwatch_probe_duration_seconds_bucket"),
                "{title}"
            );
            assert_eq!(targets[0]["format"], "heatmap", "{title}");
        }
    }
    assert!(heatmap, "a latency heatmap");

    let annotations = dash["annotations"]["list"].as_array().unwrap();
    assert!(
        annotations.iter().any(|a| a["expr"]
            .as_str()
            .is_some_and(|e| e.contains("stallwatch_stalls_total"))),
        "stalls as annotations"
    );

    for e in dashboard_exprs(&dash) {
        assert!(!e.expr.trim().is_empty(), "{}: empty expression", e.origin);
        for m in metric_names(&e.expr) {
            if m.starts_with("process_") {
                continue;
            }
            assert!(
                KNOWN_METRICS.contains(&m.as_str()),
                "{}: unknown metric {m}",
                e.origin
            );
            used.insert(m);
        }
    }
    for m in DASHBOARD_MUST_SHOW {
        assert!(used.contains(*m), "the dashboard does not show {m}");
    }
    // The alert rules, too, use only exported metrics.
    for (name, expr) in alert_rules() {
        for m in metric_names(&expr) {
            assert!(
                KNOWN_METRICS.contains(&m.as_str()),
                "alert {name}: unknown metric {m}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Debian package

#[test]
fn debian_package_builds_and_passes_lintian() {
    // A release build takes both cores for minutes.
    let _machine = machine::exclusive();
    tool("cargo-deb", "cargo install cargo-deb --locked");
    tool("lintian", "apt-get install lintian");
    let out = run(Command::new("bash")
        .arg(repo_file("scripts/check-package.sh"))
        .current_dir(repo()));
    assert!(
        out.status.success(),
        "scripts/check-package.sh failed:\n{}",
        text(&out)
    );
}

// ---------------------------------------------------------------------------------------
// The dashboard and the rules against a real Prometheus scraping the real agent

/// A process started by this test, stopped by its pid when dropped.
struct Proc {
    name: &'static str,
    child: Child,
}

impl Proc {
    fn pid(&self) -> rustix::process::Pid {
        rustix::process::Pid::from_child(&self.child)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        use rustix::process::{kill_process, Signal};
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // SIGTERM first: the agent removes its probe files, Prometheus closes its TSDB.
        let _ = kill_process(self.pid(), Signal::TERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "{} (pid {}) ignored SIGTERM, killing it",
            self.name,
            self.child.id()
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the agent on a free port; returns it and the address it logged.
fn start_agent(dir: &Path) -> (Proc, String, Arc<Mutex<Vec<String>>>) {
    let probe_dir = dir.join("probed");
    std::fs::create_dir_all(&probe_dir).unwrap();
    let config = dir.join("stallwatch.yaml");
    std::fs::write(
        &config,
        format!(
            "listen_address: \"127.0.0.1:0\"\n\
             vm_interval: 1s\n\
             defaults:\n  interval: 1s\n  require_mountpoint: false\n  modes: [create, overwrite, append]\n\
             targets:\n  - path: {}\n    name: deploytest\n",
            probe_dir.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_stallwatch"))
        .arg("--config")
        .arg(&config)
        .args(["--web.listen-address", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start stallwatch");
    let stderr = child.stderr.take().unwrap();
    let proc = Proc {
        name: "stallwatch",
        child,
    };
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    {
        let log = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("listening on ").nth(1) {
                    let addr: String = rest
                        .chars()
                        .take_while(|c| !c.is_whitespace() && *c != '"')
                        .collect();
                    let _ = tx.send(addr);
                }
                log.lock().unwrap().push(line);
            }
        });
    }
    let addr = rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| {
            panic!(
                "stallwatch did not log \"listening on ADDR\" within 30s; its log:\n{}",
                log.lock().unwrap().join("\n")
            )
        });
    (proc, addr, log)
}

/// Grafana's template variables, as a panel for the test target would see them.
fn substitute(expr: &str, instance: &str) -> String {
    expr.replace("$__rate_interval", "10s")
        .replace("$__interval", "2s")
        .replace("$__range", "1m")
        .replace("${datasource}", "prometheus")
        .replace("$datasource", "prometheus")
        .replace("${instance}", instance)
        .replace("$instance", instance)
        .replace("${target}", "deploytest")
        .replace("$target", "deploytest")
        .replace("${op}", "fsync")
        .replace("$op", "fsync")
}

/// The alert condition without its thresholds: `x > 30` -> `x`. What remains is the
/// signal the alert watches, which must exist while the agent runs.
fn strip_thresholds(expr: &str) -> String {
    let c: Vec<char> = expr.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    let mut quote: Option<char> = None;
    while i < c.len() {
        let ch = c[i];
        if let Some(q) = quote {
            out.push(ch);
            if ch == '\\' && i + 1 < c.len() {
                out.push(c[i + 1]);
                i += 2;
                continue;
            }
            if ch == q {
                quote = None;
            }
            i += 1;
            continue;
        }
        if ch == '"' || ch == '\'' || ch == '`' {
            quote = Some(ch);
            out.push(ch);
            i += 1;
            continue;
        }
        let two: String = c[i..(i + 2).min(c.len())].iter().collect();
        let op_len = if [">=", "<=", "==", "!="].contains(&two.as_str()) {
            2
        } else if ch == '>' || ch == '<' {
            1
        } else {
            0
        };
        if op_len > 0 {
            let mut j = i + op_len;
            while j < c.len() && c[j].is_whitespace() {
                j += 1;
            }
            let start = j;
            if j < c.len() && c[j] == '-' {
                j += 1;
            }
            let digits = j;
            while j < c.len() {
                let exp_sign = (c[j] == '-' || c[j] == '+') && j > digits && c[j - 1] == 'e';
                if c[j].is_ascii_digit() || c[j] == '.' || c[j] == 'e' || exp_sign {
                    j += 1;
                } else {
                    break;
                }
            }
            if j > digits && c[digits].is_ascii_digit() && start < j {
                while out.ends_with(char::is_whitespace) {
                    out.pop();
                }
                i = j;
                continue;
            }
        }
        out.push(ch);
        i += 1;
    }
    out
}

#[test]
fn strip_thresholds_examples() {
    assert_eq!(strip_thresholds("a > 30"), "a");
    assert_eq!(strip_thresholds("(a + b) / (c > 0) > 0.8"), "(a + b) / (c)");
    assert_eq!(
        strip_thresholds("up{job=\"x\"} == 0 or absent(up{job=\"x\"})"),
        "up{job=\"x\"} or absent(up{job=\"x\"})"
    );
    assert_eq!(strip_thresholds("a{op!=\"1\"} > 1e-3"), "a{op!=\"1\"}");
}

/// Dashboard expressions that may return nothing on a healthy agent, and why. Every one
/// of them must still parse and evaluate.
const DASHBOARD_MAY_BE_EMPTY: &[(&str, &str)] = &[
    (
        "panel Errors in range A",
        "no probe fails in the test: no error series exists",
    ),
    (
        "panel Errors by errno A",
        "no probe fails in the test: no error series exists",
    ),
    (
        "annotation Stalls",
        "selects only intervals with a stall (> 0)",
    ),
    (
        "panel Blocked now, by cause A",
        "no call is blocked in the test: the gauge has no series",
    ),
    (
        "panel md sync action A",
        "the test target is not on an md array",
    ),
    (
        "panel md sync progress A",
        "the test target is not on an md array",
    ),
];

/// Alerts whose signal (the condition without thresholds) may be empty, and why.
const ALERT_SIGNAL_MAY_BE_EMPTY: &[(&str, &str)] = &[(
    "alert StallwatchProbeErrors",
    "no probe fails in the test: no error series exists",
)];

#[test]
fn dashboard_and_rules_against_real_prometheus() {
    let tmp = tempfile::tempdir().unwrap();
    let (agent_proc, agent_addr, agent_log) = start_agent(tmp.path());

    // The agent serves metrics before Prometheus is even started.
    let metrics = request(
        &fresh_client(),
        "GET",
        &format!("http://{agent_addr}/metrics"),
        &[],
    )
    .unwrap_or_else(|e| panic!("GET /metrics: {e}"));
    assert_eq!(metrics.status, 200, "/metrics: {}", metrics.text());

    let prom = Prometheus::builder(tmp.path(), "stallwatch")
        .targets(std::slice::from_ref(&agent_addr))
        .rules(&[repo_file("deploy/stallwatch.rules.yml")])
        .interval("1s")
        .start();
    let diagnostics = || {
        format!(
            "--- prometheus log\n{}\n--- stallwatch log\n{}",
            prom.log(),
            agent_log.lock().unwrap().join("\n")
        )
    };

    // Ready, and a few scrapes and probe cycles in the TSDB.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if prom.ready() {
            let scrapes = prom.scalar("sum(count_over_time(up{job=\"stallwatch\"}[1m]))");
            let cycles = prom.scalar("sum(stallwatch_probes_total)");
            let ups = prom.scalar("sum(up{job=\"stallwatch\"})");
            if scrapes >= 8.0 && cycles >= 5.0 && ups >= 1.0 {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus did not scrape stallwatch 8 times within 90s\n{}",
            diagnostics()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // The instance label Prometheus gave the agent.
    let instance = prom.query("up{job=\"stallwatch\"}").unwrap()[0]["metric"]["instance"]
        .as_str()
        .unwrap()
        .to_string();

    let dash = dashboard();
    let mut failures = Vec::new();
    let mut checked = 0;

    // Dashboard: every expression parses; every one returns data unless allow-listed.
    let allowed: HashMap<&str, &str> = DASHBOARD_MAY_BE_EMPTY.iter().cloned().collect();
    for e in dashboard_exprs(&dash) {
        let q = substitute(&e.expr, &instance);
        assert!(
            !q.contains('$'),
            "{}: unsubstituted variable in {q}",
            e.origin
        );
        checked += 1;
        match prom.query(&q) {
            Err(err) => failures.push(format!("{}: does not evaluate: {err}\n    {q}", e.origin)),
            Ok(r) if r.is_empty() => match allowed.get(e.origin.as_str()) {
                Some(why) => eprintln!("empty, allowed ({why}): {}", e.origin),
                None => failures.push(format!("{}: returned no data\n    {q}", e.origin)),
            },
            Ok(r) => eprintln!("{} series: {}", r.len(), e.origin),
        }
    }
    // Variables: the label they list is present, with the test's values.
    for v in dash["templating"]["list"].as_array().unwrap() {
        if v["type"] != "query" {
            continue;
        }
        let (inner, label) = label_values_query(v["query"]["query"].as_str().unwrap()).unwrap();
        let r = prom
            .query(&substitute(&inner, &instance))
            .unwrap_or_default();
        let values: BTreeSet<&str> = r
            .iter()
            .filter_map(|s| s["metric"][&label].as_str())
            .collect();
        let want = match label.as_str() {
            "instance" => instance.as_str(),
            "target" => "deploytest",
            "op" => "fsync",
            _ => continue,
        };
        if !values.contains(want) {
            failures.push(format!(
                "variable {}: {label} values {values:?} lack {want}",
                v["name"]
            ));
        }
    }

    // Rules: every alert expression parses and evaluates; its signal has data.
    let allowed: HashMap<&str, &str> = ALERT_SIGNAL_MAY_BE_EMPTY.iter().cloned().collect();
    for (name, expr) in alert_rules() {
        let origin = format!("alert {name}");
        checked += 1;
        if let Err(err) = prom.query(&expr) {
            failures.push(format!("{origin}: does not evaluate: {err}\n    {expr}"));
            continue;
        }
        let signal = strip_thresholds(&expr);
        match prom.query(&signal) {
            Err(err) => failures.push(format!(
                "{origin}: signal does not evaluate: {err}\n    {signal}"
            )),
            Ok(r) if r.is_empty() => match allowed.get(origin.as_str()) {
                Some(why) => eprintln!("empty signal, allowed ({why}): {origin}"),
                None => failures.push(format!("{origin}: signal returned no data\n    {signal}")),
            },
            Ok(r) => eprintln!("{} series in the signal of {origin}", r.len()),
        }
    }
    // Prometheus itself loaded and evaluated the rules file without error.
    let rules = prom.rules();
    let loaded = rules.len();
    for (_, name, health, last_error) in &rules {
        if health != "ok" {
            failures.push(format!("rule {name} health {health}: {last_error}"));
        }
    }
    if loaded != alert_rules().len() {
        failures.push(format!(
            "Prometheus loaded {loaded} rules, the file has {}",
            alert_rules().len()
        ));
    }

    if !failures.is_empty() {
        let mut msg = format!("{} of {checked} expressions failed:\n", failures.len());
        for f in &failures {
            msg.push_str(&format!("  - {f}\n"));
        }
        panic!("{msg}\n{}", diagnostics());
    }
    drop(prom);
    drop(agent_proc);
}
