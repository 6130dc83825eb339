//! A real Prometheus for tests: Debian's `prometheus` binary on 127.0.0.1 (a port the test
//! picked), started by [`Prometheus::builder`] (targets, rule files, interval,
//! Alertmanagers, extra flags) through [`spawn_logged`], which VictoriaMetrics and vmalert
//! use too, stopped by its pid on drop; instant queries over its HTTP API; and the PromQL
//! expressions of a Grafana dashboard. Used by the deploy, alerting, exposition,
//! precision, mixin and fleet tests. [`Engine`] is what the fleet checks
//! need of a Prometheus-compatible engine, so the same checks run against Prometheus and
//! against VictoriaMetrics with vmalert ([`super::vm`]).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

/// The running Prometheus; SIGTERM (then SIGKILL) to its pid on drop.
pub struct Prometheus {
    child: Child,
    addr: String,
    log: PathBuf,
    http: ureq::Agent,
}

/// A Prometheus-compatible engine that scrapes agents and evaluates the shipped rules:
/// instant queries over `/api/v1/query`, the loaded rules over `/api/v1/rules`.
pub trait Engine {
    /// Ready to answer queries.
    fn ready(&self) -> bool;
    /// Instant query: the result vector (a scalar as one element), or the API's error.
    fn query(&self, expr: &str) -> Result<Vec<Value>, String>;
    /// Range query from `start` to now (as Grafana asks for annotations and time series),
    /// every `step`: the result matrix, or the API's error.
    fn query_range(&self, expr: &str, start: SystemTime, step: &str) -> Result<Vec<Value>, String>;
    /// The rules it evaluates: (group, name, health, last error).
    fn rules(&self) -> Vec<(String, String, String, String)>;
    /// Its log(s) so far, for failure messages.
    fn log(&self) -> String;

    /// (label value, sample value) of each series of an instant query.
    fn by_label(&self, expr: &str, label: &str) -> Vec<(String, f64)> {
        self.query(expr)
            .unwrap_or_default()
            .iter()
            .map(|s| {
                (
                    s["metric"][label].as_str().unwrap_or("").to_string(),
                    s["value"][1]
                        .as_str()
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(f64::NAN),
                )
            })
            .collect()
    }

    /// The first sample of an instant query, 0 when there is none.
    fn scalar(&self, expr: &str) -> f64 {
        self.by_label(expr, "")
            .first()
            .map(|(_, v)| *v)
            .unwrap_or(0.0)
    }
}

/// An HTTP client for a local API: no proxy, non-2xx statuses as responses.
pub(crate) fn api_client() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into()
}

/// GET `http://{addr}{path}?query`: Ok((status, body)) or Err(transport error).
pub(crate) fn api_get(
    http: &ureq::Agent,
    addr: &str,
    path: &str,
    query: &[(&str, &str)],
) -> Result<(u16, String), String> {
    let mut req = http.get(&format!("http://{addr}{path}"));
    for (k, v) in query {
        req = req.query(*k, *v);
    }
    let mut resp = req.call().map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| e.to_string())?;
    Ok((status, body))
}

/// An instant query over the Prometheus HTTP API at `addr`.
pub(crate) fn api_query(http: &ureq::Agent, addr: &str, expr: &str) -> Result<Vec<Value>, String> {
    api_result(api_get(http, addr, "/api/v1/query", &[("query", expr)])?)
}

/// A range query from `start` to now every `step` over the Prometheus HTTP API at `addr`.
pub(crate) fn api_query_range(
    http: &ureq::Agent,
    addr: &str,
    expr: &str,
    start: SystemTime,
    step: &str,
) -> Result<Vec<Value>, String> {
    let secs =
        |t: SystemTime| format!("{:.3}", t.duration_since(UNIX_EPOCH).unwrap().as_secs_f64());
    let (start, end) = (secs(start), secs(SystemTime::now()));
    api_result(api_get(
        http,
        addr,
        "/api/v1/query_range",
        &[
            ("query", expr),
            ("start", &start),
            ("end", &end),
            ("step", step),
        ],
    )?)
}

/// The result of a query's answer: the result vector or matrix (a scalar as one
/// element), or the API's error.
fn api_result((status, body): (u16, String)) -> Result<Vec<Value>, String> {
    let v: Value =
        serde_json::from_str(&body).map_err(|e| format!("HTTP {status}: {e}: {body}"))?;
    if v["status"] != "success" {
        return Err(format!(
            "HTTP {status}: {} {}",
            v["errorType"].as_str().unwrap_or(""),
            v["error"].as_str().unwrap_or(&body)
        ));
    }
    Ok(match &v["data"]["result"] {
        Value::Array(a) => a.clone(),
        other if !other.is_null() => vec![other.clone()],
        _ => Vec::new(),
    })
}

/// The rules behind `/api/v1/rules` at `addr` (Prometheus' and vmalert's have the same
/// shape): (group, name, health, last error).
pub(crate) fn api_rules(http: &ureq::Agent, addr: &str) -> Vec<(String, String, String, String)> {
    let (_, body) = api_get(http, addr, "/api/v1/rules", &[]).unwrap_or_default();
    let v: Value = serde_json::from_str(&body).unwrap_or_default();
    let mut out = Vec::new();
    for g in v["data"]["groups"].as_array().into_iter().flatten() {
        for r in g["rules"].as_array().into_iter().flatten() {
            let s = |k: &str| r[k].as_str().unwrap_or("").to_string();
            out.push((
                g["name"].as_str().unwrap_or("").to_string(),
                s("name"),
                s("health"),
                s("lastError"),
            ));
        }
    }
    out
}

/// SIGTERM to a child the test started (then SIGKILL after 10 s), reaped.
pub(crate) fn stop_child(child: &mut Child) {
    use rustix::process::{kill_process, Pid, Signal};
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    // Unreaped, so the pid is still our child's.
    if let Some(pid) = Pid::from_raw(child.id() as i32) {
        let _ = kill_process(pid, Signal::TERM);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts a server the test runs: `bin` with `args` in `dir`, stdout and stderr into
/// `log` (created anew), stdin closed. Prometheus and VictoriaMetrics/vmalert start
/// through here; the caller stops the child by its pid ([`stop_child`]).
pub(crate) fn spawn_logged(bin: &Path, args: &[String], log: &Path, dir: &Path) -> Child {
    let out =
        std::fs::File::create(log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .current_dir(dir)
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()))
}

/// How to start a [`Prometheus`]: [`Prometheus::builder`], then the options, then
/// [`PrometheusBuilder::start`]. Defaults: no targets, no rules, a scrape and an
/// evaluation every second, no Alertmanager, no extra flags.
pub struct PrometheusBuilder {
    dir: PathBuf,
    job: String,
    targets: Vec<String>,
    rule_files: Vec<PathBuf>,
    interval: String,
    alertmanagers: Vec<String>,
    flags: Vec<String>,
}

impl PrometheusBuilder {
    /// The scrape job's targets (host:port).
    pub fn targets(mut self, targets: &[String]) -> Self {
        self.targets = targets.to_vec();
        self
    }

    /// Rule files to load.
    pub fn rules(mut self, rule_files: &[PathBuf]) -> Self {
        self.rule_files = rule_files.to_vec();
        self
    }

    /// The scrape and evaluation interval (and scrape timeout), e.g. "1s".
    pub fn interval(mut self, interval: &str) -> Self {
        self.interval = interval.to_string();
        self
    }

    /// Send alerts to the Alertmanagers at these addresses (host:port).
    pub fn alertmanagers(mut self, alertmanagers: &[String]) -> Self {
        self.alertmanagers = alertmanagers.to_vec();
        self
    }

    /// An extra command-line flag, e.g. `--enable-feature=native-histograms`.
    pub fn flag(mut self, flag: &str) -> Self {
        self.flags.push(flag.to_string());
        self
    }

    /// Writes the configuration into the directory and starts Prometheus there (TSDB and
    /// log there too), listening on a free port of 127.0.0.1.
    pub fn start(self) -> Prometheus {
        let bin = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|d| d.join("prometheus"))
            .find(|p| p.is_file())
            .expect("`prometheus` not found: apt-get install prometheus");
        let (dir, interval, job) = (&self.dir, &self.interval, &self.job);
        let rules: String = self
            .rule_files
            .iter()
            .map(|r| format!("  - {}\n", r.display()))
            .collect();
        let quoted = |v: &[String]| -> String {
            v.iter()
                .map(|t| format!("\"{t}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let alerting = if self.alertmanagers.is_empty() {
            String::new()
        } else {
            format!(
                "alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: [{}]\n",
                quoted(&self.alertmanagers)
            )
        };
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: {interval}\n  scrape_timeout: {interval}\n  evaluation_interval: {interval}\n\
                 rule_files:\n{rules}{alerting}\
                 scrape_configs:\n  - job_name: {job}\n    static_configs:\n      - targets: [{}]\n",
                quoted(&self.targets)
            ),
        )
        .unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let log = dir.join("prometheus.log");
        let mut args = vec![
            format!("--config.file={}", config.display()),
            format!("--storage.tsdb.path={}", dir.join("tsdb").display()),
            format!("--web.listen-address={addr}"),
            "--log.level=warn".to_string(),
        ];
        args.extend(self.flags.iter().cloned());
        let child = spawn_logged(&bin, &args, &log, dir);
        Prometheus {
            child,
            addr,
            log,
            http: api_client(),
        }
    }
}

impl Prometheus {
    /// A Prometheus in `dir` (config, TSDB and log there) with one scrape job `job`; see
    /// [`PrometheusBuilder`] for the rest.
    pub fn builder(dir: &Path, job: &str) -> PrometheusBuilder {
        PrometheusBuilder {
            dir: dir.to_path_buf(),
            job: job.to_string(),
            targets: Vec::new(),
            rule_files: Vec::new(),
            interval: "1s".to_string(),
            alertmanagers: Vec::new(),
            flags: Vec::new(),
        }
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GET on its API; Ok(body) or Err(transport error).
    pub fn get(&self, path: &str, query: &[(&str, &str)]) -> Result<(u16, String), String> {
        api_get(&self.http, &self.addr, path, query)
    }

    pub fn ready(&self) -> bool {
        matches!(self.get("/-/ready", &[]), Ok((200, _)))
    }

    /// Instant query: the result vector (a scalar as one element), or the API's error.
    pub fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        api_query(&self.http, &self.addr, expr)
    }

    /// The first sample of an instant query, 0 when there is none.
    pub fn scalar(&self, expr: &str) -> f64 {
        Engine::scalar(self, expr)
    }

    /// The rules Prometheus loaded: (group, name, health, last error).
    pub fn rules(&self) -> Vec<(String, String, String, String)> {
        api_rules(&self.http, &self.addr)
    }
}

impl Engine for Prometheus {
    fn ready(&self) -> bool {
        Prometheus::ready(self)
    }
    fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        Prometheus::query(self, expr)
    }
    fn query_range(&self, expr: &str, start: SystemTime, step: &str) -> Result<Vec<Value>, String> {
        api_query_range(&self.http, &self.addr, expr, start, step)
    }
    fn rules(&self) -> Vec<(String, String, String, String)> {
        Prometheus::rules(self)
    }
    fn log(&self) -> String {
        Prometheus::log(self)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        stop_child(&mut self.child);
    }
}

/// A dashboard expression with Grafana's variables as a panel sees them for the whole
/// fleet of scrape job `job` (target `data`, op `fsync`, a 10s rate interval).
pub fn grafana_substitute(expr: &str, job: &str) -> String {
    expr.replace("$__rate_interval", "10s")
        .replace("$__interval", "2s")
        .replace("$__range", "1m")
        .replace("${instance}", ".+")
        .replace("$instance", ".+")
        .replace("${target}", "data")
        .replace("$target", "data")
        .replace("${op}", "fsync")
        .replace("$op", "fsync")
        .replace("${job}", job)
        .replace("$job", job)
}

/// A PromQL expression of a dashboard, with where it came from.
#[derive(Clone, Debug)]
pub struct DashExpr {
    /// "panel <title> <refId>", "annotation <name>", "variable <name>"
    pub origin: String,
    pub expr: String,
}

/// Every PromQL expression of a Grafana dashboard: panel targets (rows' nested panels
/// included), annotations, and the inner query of `label_values(QUERY, label)` variables.
pub fn dashboard_exprs(dash: &Value) -> Vec<DashExpr> {
    let mut out = Vec::new();
    let mut panels = Vec::new();
    for p in dash["panels"].as_array().into_iter().flatten() {
        panels.push(p);
        panels.extend(p["panels"].as_array().into_iter().flatten());
    }
    for p in panels {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(DashExpr {
                origin: format!(
                    "panel {} {}",
                    p["title"].as_str().unwrap_or("?"),
                    t["refId"].as_str().unwrap_or("?")
                ),
                expr: t["expr"].as_str().unwrap_or("").to_string(),
            });
        }
    }
    for a in dash["annotations"]["list"].as_array().into_iter().flatten() {
        if let Some(e) = a["expr"].as_str() {
            out.push(DashExpr {
                origin: format!("annotation {}", a["name"].as_str().unwrap_or("?")),
                expr: e.to_string(),
            });
        }
    }
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]["query"]
            .as_str()
            .or(v["query"].as_str())
            .unwrap_or("");
        let inner = q
            .trim()
            .strip_prefix("label_values(")
            .and_then(|b| b.strip_suffix(')'))
            .and_then(|b| b.rsplit_once(','))
            .map(|(query, _)| query.trim().to_string())
            .unwrap_or_else(|| {
                panic!(
                    "variable {}: not label_values(QUERY, label): {q}",
                    v["name"]
                )
            });
        out.push(DashExpr {
            origin: format!("variable {}", v["name"].as_str().unwrap_or("?")),
            expr: inner,
        });
    }
    out
}
