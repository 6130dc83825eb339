//! A real VictoriaMetrics for tests, the second metrics engine of the fleet test: Debian's
//! `victoria-metrics` scraping the given targets (`-promscrape.config`, the same scrape
//! config as [`super::prom::Prometheus`]'), and its `vmalert` evaluating the given rule
//! files against it (`-datasource.url`) and writing recorded series and `ALERTS` back
//! (`-remoteWrite.url`). Both on 127.0.0.1, on ports the test picked, with their data in
//! the test's directory; stopped by their pids on drop. Queries go to VictoriaMetrics'
//! Prometheus-compatible `/api/v1/query`, the rules' health to vmalert's `/api/v1/rules`.
//!
//! vmalert wants a notifier when alerting rules are loaded: it gets a local port nobody
//! listens on (its failed deliveries are logged, and left out of [`Engine::log`]; the
//! alerts still reach `ALERTS` through the remote write).

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::SystemTime;

use serde_json::Value;

use super::cmd::tool;
use super::prom::{
    api_client, api_get, api_query, api_query_range, api_rules, free_port, spawn_logged,
    stop_child, Engine,
};

/// VictoriaMetrics and its vmalert; both SIGTERMed (then SIGKILLed) on drop, vmalert first.
pub struct VictoriaMetrics {
    vmalert: Child,
    vm: Child,
    vm_addr: String,
    vmalert_addr: String,
    dir: PathBuf,
    http: ureq::Agent,
}

impl VictoriaMetrics {
    /// Starts VictoriaMetrics in `dir` (scrape config, data and logs there): one job `job`
    /// scraping `targets` every `interval`; and vmalert evaluating `rule_files` as often.
    pub fn start(
        dir: &Path,
        job: &str,
        targets: &[String],
        rule_files: &[PathBuf],
        interval: &str,
    ) -> VictoriaMetrics {
        let install = "apt-get install victoria-metrics";
        let (vm_bin, vmalert_bin) = (tool("victoria-metrics", install), tool("vmalert", install));
        let targets: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
        let config = dir.join("scrape.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: {interval}\n  scrape_timeout: {interval}\n\
                 scrape_configs:\n  - job_name: {job}\n    static_configs:\n      - targets: [{}]\n",
                targets.join(", ")
            ),
        )
        .unwrap();
        let vm_addr = format!("127.0.0.1:{}", free_port());
        let vm = spawn_logged(
            &vm_bin,
            &[
                format!("-promscrape.config={}", config.display()),
                format!("-httpListenAddr={vm_addr}"),
                format!("-storageDataPath={}", dir.join("data").display()),
                // Queries see the newest samples (the default hides the last 30 s), and
                // no cached results: the test asks again and again as the data changes.
                "-search.latencyOffset=0s".into(),
                "-search.disableCache".into(),
                "-memory.allowedBytes=256MiB".into(),
                "-loggerLevel=WARN".into(),
            ],
            &dir.join("victoria-metrics.log"),
            dir,
        );
        let vmalert_addr = format!("127.0.0.1:{}", free_port());
        let vm_url = format!("http://{vm_addr}");
        let mut args: Vec<String> = rule_files
            .iter()
            .map(|r| format!("-rule={}", r.display()))
            .collect();
        args.extend([
            format!("-datasource.url={vm_url}"),
            format!("-remoteWrite.url={vm_url}"),
            format!("-remoteWrite.flushInterval={interval}"),
            format!("-notifier.url=http://127.0.0.1:{}", free_port()),
            format!("-httpListenAddr={vmalert_addr}"),
            format!("-evaluationInterval={interval}"),
            "-loggerLevel=WARN".into(),
        ]);
        let vmalert = spawn_logged(&vmalert_bin, &args, &dir.join("vmalert.log"), dir);
        VictoriaMetrics {
            vmalert,
            vm,
            vm_addr,
            vmalert_addr,
            dir: dir.to_path_buf(),
            http: api_client(),
        }
    }
}

/// The last `n` lines of a file, without vmalert's failed deliveries to the notifier
/// nobody listens on.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.contains("failed to send alerts"))
        .collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl Engine for VictoriaMetrics {
    fn ready(&self) -> bool {
        [&self.vm_addr, &self.vmalert_addr]
            .iter()
            .all(|a| matches!(api_get(&self.http, a, "/health", &[]), Ok((200, _))))
    }

    fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        api_query(&self.http, &self.vm_addr, expr)
    }

    fn query_range(&self, expr: &str, start: SystemTime, step: &str) -> Result<Vec<Value>, String> {
        api_query_range(&self.http, &self.vm_addr, expr, start, step)
    }

    fn rules(&self) -> Vec<(String, String, String, String)> {
        api_rules(&self.http, &self.vmalert_addr)
    }

    fn log(&self) -> String {
        format!(
            "--- victoria-metrics log (last 40 lines)\n{}\n--- vmalert log (last 40 lines)\n{}",
            tail(&self.dir.join("victoria-metrics.log"), 40),
            tail(&self.dir.join("vmalert.log"), 40)
        )
    }
}

impl Drop for VictoriaMetrics {
    fn drop(&mut self) {
        stop_child(&mut self.vmalert);
        stop_child(&mut self.vm);
    }
}
