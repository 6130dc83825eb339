//! Alerts delivered end to end (issue 22, item 4): the agent on a loop filesystem, a real
//! Prometheus with the shipped rule files (deploy/stallwatch.rules.yml and the recording
//! rules, unchanged; only the scrape and evaluation interval are the test's, 1 s), a real
//! Alertmanager (Debian's `prometheus-alertmanager`) with the shipped example
//! configuration (deploy/alertmanager.example.yml; the receiver URL and `group_wait` are
//! the test's), and a webhook receiver of the test's own. During a freeze,
//! `StallwatchStalls` (within seconds) and `StallwatchProbeBlocked` (after 30 s) arrive at
//! the webhook with the target, the op and the cause (`frozen`), grouped by alertname,
//! instance and target, and every link in
//! them works: the `runbook_url` (into the packaged docs/alerts.md, at a heading) and the
//! `stall_page_url` (the agent's /stalls page for that target, listing the stall).
//!
//! Needs: root (loop device, fsfreeze), prometheus, prometheus-alertmanager (amtool).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::agent::Agent;
use crate::support::alertmanager::{Alertmanager, Webhook};
use crate::support::cmd::{repo, tool};
use crate::support::http::{fresh_client, request};
use crate::support::loopfs::LoopFs;
use crate::support::machine;
use crate::support::prom::Prometheus;
use crate::support::root::require_root;

/// The target's name: a space and an `&`, so the stall page link must escape it.
const TARGET: &str = "db&wal 1";

/// The receiver URL in the shipped example, replaced by the test's webhook.
const EXAMPLE_URL: &str = "http://127.0.0.1:5001/stallwatch";

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// `amtool check-config FILE`: Ok(output) or Err(output).
fn amtool_check(file: &std::path::Path) -> Result<String, String> {
    let o = Command::new(tool("amtool", "apt-get install prometheus-alertmanager"))
        .arg("check-config")
        .arg(file)
        .output()
        .expect("run amtool");
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    if o.status.success() {
        Ok(out)
    } else {
        Err(out)
    }
}

/// The repository file the Debian package installs at `/usr/…` (Cargo.toml's
/// `[package.metadata.deb] assets`, `["SRC", "DEST", "MODE"]` one a line; a SRC of the
/// form `dir/*.ext` installs each such file into the DEST directory).
fn packaged_source(installed: &str) -> Option<PathBuf> {
    let want = installed.trim_start_matches('/');
    read("Cargo.toml").lines().find_map(|l| {
        let l = l.trim().strip_prefix("[\"")?;
        let mut parts = l.split("\", \"");
        let (src, dest) = (parts.next()?, parts.next()?);
        if dest == want {
            return Some(repo().join(src));
        }
        let name = want.strip_prefix(dest).filter(|_| dest.ends_with('/'))?;
        let (dir, ext) = src.split_once("/*")?;
        (!name.contains('/') && name.ends_with(ext))
            .then(|| repo().join(dir).join(name))
            .filter(|p| p.is_file())
    })
}

/// What is wrong with a `runbook_url`: it must be the packaged docs/alerts.md (or an
/// http(s) page, which the test cannot open), at a heading named after the alert.
fn runbook_problem(alertname: &str, url: &str) -> Option<String> {
    let Some(path) = url.strip_prefix("file://") else {
        return Some(format!(
            "{alertname}: runbook_url {url} is not a file:// URL"
        ));
    };
    let (file, anchor) = path.split_once('#').unwrap_or((path, ""));
    let Some(src) = packaged_source(file) else {
        return Some(format!(
            "{alertname}: runbook_url {url}: the package installs nothing at {file}"
        ));
    };
    let md = std::fs::read_to_string(&src).unwrap_or_default();
    let slugs = crate::mixin::heading_slugs(&md);
    if anchor != alertname.to_lowercase() || !slugs.contains(anchor) {
        return Some(format!(
            "{alertname}: runbook_url {url}: no heading #{anchor} for it in {}",
            src.display()
        ));
    }
    None
}

/// Each alert the webhook received (firing), with the group labels and the receiver of
/// its notification.
struct Received {
    at: Instant,
    receiver: String,
    group: BTreeMap<String, String>,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

fn strings(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
        .collect()
}

fn firing_alerts(webhook: &Webhook) -> Vec<Received> {
    let mut out = Vec::new();
    for n in webhook.received() {
        for a in n.body["alerts"].as_array().into_iter().flatten() {
            if a["status"] != "firing" {
                continue;
            }
            out.push(Received {
                at: n.at,
                receiver: n.body["receiver"].as_str().unwrap_or("").to_string(),
                group: strings(&n.body["groupLabels"]),
                labels: strings(&a["labels"]),
                annotations: strings(&a["annotations"]),
            });
        }
    }
    out
}

/// A text node as askama escapes it, for finding the target's name in the page.
fn html_escape(s: &str) -> String {
    s.replace('&', "&#38;")
        .replace('<', "&#60;")
        .replace('>', "&#62;")
        .replace('"', "&#34;")
        .replace('\'', "&#39;")
}

#[test]
fn the_example_alertmanager_config_checks_and_routes_stallwatch_alerts() {
    let example = repo().join("deploy/alertmanager.example.yml");
    if let Err(out) = amtool_check(&example) {
        panic!("amtool check-config deploy/alertmanager.example.yml:\n{out}");
    }
    let doc: yaml_serde::Value = yaml_serde::from_str(&read("deploy/alertmanager.example.yml"))
        .expect("alertmanager.example.yml is YAML");
    // The stallwatch route groups by alertname, instance and target.
    let routes = doc["route"]["routes"].as_sequence().expect("route.routes");
    let group_by: Vec<&str> = routes[0]["group_by"]
        .as_sequence()
        .expect("group_by")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(group_by, ["alertname", "instance", "target"]);
    // The package ships it.
    assert_eq!(
        packaged_source("/usr/share/doc/stallwatch/examples/alertmanager.example.yml"),
        Some(example.clone()),
        "Cargo.toml [package.metadata.deb] assets must install deploy/alertmanager.example.yml"
    );
    // And every stallwatch alert reaches it (the names of the shipped rules).
    let rules = read("deploy/stallwatch.rules.yml");
    let names: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(|n| n.trim_matches('"'))
        .collect();
    assert!(names.len() >= 9, "{names:?}");
    for name in names.iter().copied().chain(["NodeFilesystemAlmostFull"]) {
        let o = Command::new(tool("amtool", "apt-get install prometheus-alertmanager"))
            .args(["config", "routes", "test", "--config.file"])
            .arg(&example)
            .arg(format!("alertname={name}"))
            .output()
            .unwrap();
        let receiver = String::from_utf8_lossy(&o.stdout).trim().to_string();
        let want = if name.starts_with("Stallwatch") {
            "storage-oncall"
        } else {
            "default"
        };
        assert_eq!(receiver, want, "alert {name} routed to {receiver:?}");
    }
}

#[test]
fn a_freeze_alerts_the_webhook_with_target_op_cause_and_working_links() {
    if !require_root("a_freeze_alerts_the_webhook_with_target_op_cause_and_working_links") {
        return;
    }
    let _machine = machine::shared();
    tool("prometheus", "apt-get install prometheus");
    let tmp = tempfile::tempdir().unwrap();

    // The shipped example configuration, pointed at the test's webhook; group_wait 1s
    // instead of 30s so the freeze can be short. Everything else as shipped.
    let webhook = Webhook::start();
    let example = read("deploy/alertmanager.example.yml");
    assert_eq!(example.matches(EXAMPLE_URL).count(), 1, "{example}");
    assert_eq!(example.matches("group_wait: 30s").count(), 1, "{example}");
    let am_config = tmp.path().join("alertmanager.yml");
    std::fs::write(
        &am_config,
        example
            .replace(EXAMPLE_URL, &webhook.url("/stallwatch"))
            .replace("group_wait: 30s", "group_wait: 1s"),
    )
    .unwrap();
    if let Err(out) = amtool_check(&am_config) {
        panic!("amtool check-config of the test's copy:\n{out}");
    }
    let mut am = Alertmanager::start(tmp.path(), &am_config);
    assert!(
        am.wait_ready(Duration::from_secs(30)),
        "Alertmanager not ready within 30s:\n{}",
        am.log()
    );

    let mut fs = LoopFs::new("ext4", 64);
    let yaml = format!(
        "targets:\n  - path: {}\n    name: \"{TARGET}\"\n    interval: 1s\n",
        fs.path().display()
    );
    let agent = Agent::start(&yaml);
    assert!(agent.wait_up(TARGET), "{}", agent.log_tail(30));

    let prom = Prometheus::builder(tmp.path(), "stallwatch")
        .targets(&[agent.addr().to_string()])
        .rules(&[
            repo().join("deploy/stallwatch.rules.yml"),
            repo().join("deploy/stallwatch.recording.rules.yml"),
        ])
        .interval("1s")
        .alertmanagers(&[am.addr().to_string()])
        .start();
    let diagnostics = |webhook: &Webhook| {
        format!(
            "--- webhook\n{:#?}\n--- prometheus log\n{}\n--- alertmanager log\n{}\n--- agent log\n{}",
            webhook
                .received()
                .iter()
                .map(|n| (n.path.clone(), n.body.to_string()))
                .collect::<Vec<_>>(),
            prom.log(),
            am.log(),
            agent.log_tail(40)
        )
    };
    // Scraped a few times, the rules loaded, the Alertmanager discovered.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if prom.ready()
            && prom.scalar("sum(count_over_time(up{job=\"stallwatch\"}[1m]))") >= 3.0
            && prom.rules().len() >= 9
            && prom
                .get("/api/v1/alertmanagers", &[])
                .is_ok_and(|(_, b)| b.contains(am.addr()))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus not scraping within 60s\n{}",
            diagnostics(&webhook)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    for (_, name, health, err) in prom.rules() {
        assert_eq!(health, "ok", "rule {name}: {err}");
    }
    let ours = |a: &Received| a.labels.get("target").map(String::as_str) == Some(TARGET);
    assert!(
        !firing_alerts(&webhook).iter().any(ours),
        "an alert for {TARGET} before the freeze\n{}",
        diagnostics(&webhook)
    );

    // Freeze until both alerts have arrived (at most 120 s: ProbeBlocked needs 30 s
    // blocked, then a scrape, an evaluation and the group_wait). Thawed before anything
    // else is dropped, even when an assertion fails: an agent stopped while its probes
    // are frozen cannot exit until the thaw.
    fs.freeze();
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let frozen_at = Instant::now();
        let want = ["StallwatchProbeBlocked", "StallwatchStalls"];
        let deadline = frozen_at + Duration::from_secs(120);
        let alerts = loop {
            let alerts: Vec<Received> = firing_alerts(&webhook).into_iter().filter(ours).collect();
            let names: BTreeSet<&str> = alerts
                .iter()
                .map(|a| a.labels["alertname"].as_str())
                .collect();
            if want.iter().all(|w| names.contains(w)) {
                break alerts;
            }
            assert!(
                Instant::now() < deadline,
                "within 120s of the freeze, the webhook got {names:?}, not both of {want:?}\n{}",
                diagnostics(&webhook)
            );
            std::thread::sleep(Duration::from_millis(250));
        };
        let first = |name: &str| {
            alerts
                .iter()
                .find(|a| a.labels["alertname"] == name)
                .unwrap()
                .at
                .duration_since(frozen_at)
        };
        eprintln!(
            "arrived after the freeze: StallwatchStalls {:?}, StallwatchProbeBlocked {:?}",
            first("StallwatchStalls"),
            first("StallwatchProbeBlocked")
        );
        // The stall is counted at the crossing of stall_threshold (1 s): its alert comes
        // first; the blocked-call alert only once the call has been held 30 s.
        assert!(
            first("StallwatchStalls") < first("StallwatchProbeBlocked")
                && first("StallwatchProbeBlocked") >= Duration::from_secs(30),
            "StallwatchStalls after {:?}, StallwatchProbeBlocked after {:?}",
            first("StallwatchStalls"),
            first("StallwatchProbeBlocked")
        );

        // Still frozen: the agent's ongoing stalls of the target.
        let (status, body, _) = agent.get("/api/stalls");
        assert_eq!(status, 200, "{body}");
        let events: Vec<Value> = serde_json::from_str(&body).unwrap();
        let ongoing: Vec<&Value> = events
            .iter()
            .filter(|e| e["target"] == TARGET && e["ongoing"] == true)
            .collect();
        assert!(!ongoing.is_empty(), "no ongoing stall of {TARGET}: {body}");

        let http = fresh_client();
        for a in &alerts {
            let name = a.labels["alertname"].as_str();
            let (mode, op, cause) = (&a.labels["mode"], &a.labels["op"], &a.labels["cause"]);
            // Delivered to the stallwatch receiver, grouped by alertname, instance, target.
            assert_eq!(a.receiver, "storage-oncall", "{name}");
            assert_eq!(
                a.group.keys().map(String::as_str).collect::<Vec<_>>(),
                ["alertname", "instance", "target"],
                "{name}: group labels {:?}",
                a.group
            );
            assert_eq!(a.group["instance"], agent.addr(), "{name}");
            // The op of a stall the agent holds for this target, and the freeze as its cause.
            let event = ongoing
                .iter()
                .find(|e| e["mode"] == mode.as_str() && e["op"] == op.as_str())
                .unwrap_or_else(|| {
                    panic!("{name}: {mode} {op} is not an ongoing stall of {TARGET}: {body}")
                });
            let event_cause = match name {
                "StallwatchStalls" => &event["counted_cause"],
                _ => &event["cause"],
            };
            assert_eq!(cause, "frozen", "{name}: labels {:?}", a.labels);
            assert_eq!(
                event_cause.as_str(),
                Some("frozen"),
                "{name}: event {event}"
            );

            // The runbook link.
            let runbook = a
                .annotations
                .get("runbook_url")
                .unwrap_or_else(|| panic!("{name}: no runbook_url: {:?}", a.annotations));
            if let Some(problem) = runbook_problem(name, runbook) {
                panic!("{problem}");
            }
            // The stall page link: opens, and lists this stall of this target.
            let page = a
                .annotations
                .get("stall_page_url")
                .unwrap_or_else(|| panic!("{name}: no stall_page_url: {:?}", a.annotations));
            assert!(
                a.annotations["description"].contains(page.as_str()),
                "{name}: the description does not name the stall page"
            );
            let resp = request(&http, "GET", page, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
            let html = resp.text();
            assert_eq!(resp.status, 200, "{name}: GET {page}: {html}");
            let id = event["id"].as_str().unwrap();
            for want in [
                format!("<h2>Stalls of {}</h2>", html_escape(TARGET)),
                format!("<a href=\"/stalls/{id}\">"),
                "class=\"ongoing\"".to_string(),
            ] {
                assert!(
                    html.contains(&want),
                    "{name}: GET {page}: no {want:?} in\n{html}"
                );
            }
            assert!(!html.contains("id=\"no-stalls\""), "{name}: {html}");
        }
    }));
    fs.thaw();
    if let Err(panic) = checked {
        std::panic::resume_unwind(panic);
    }
}
