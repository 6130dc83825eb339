//! The real `stallwatch` binary, started on a temporary config with
//! `--web.listen-address 127.0.0.1:0`, its log captured, with an HTTP client.
//!
//! Ordering advice: declare the `Agent` *after* the `LoopFs` it probes, so the agent is
//! killed first and the filesystem torn down afterwards. Either order is safe: an agent
//! blocked in a frozen filesystem cannot die before the thaw, so `Agent::drop` waits a
//! bounded time and then leaves the reaping to a background thread.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use procfs::process::Process;
use tempfile::TempDir;

use super::cmd::run;
use super::http::{client_config, fresh_client, request, RawResponse};
use super::metrics::Metrics;
use super::wait::wait_until;

/// Path of the binary under test.
pub const AGENT_BIN: &str = env!("CARGO_BIN_EXE_stallwatch");

/// How long [`Agent::start`] waits for `listening on ADDR`.
const AGENT_START_TIMEOUT: Duration = Duration::from_secs(15);

/// The running `stallwatch` binary. Killed (SIGKILL) and reaped on drop.
pub struct Agent {
    child: Option<Child>,
    exited: Option<ExitStatus>,
    pid: u32,
    addr: String,
    logs: Arc<Mutex<Vec<String>>>,
    http: ureq::Agent,
    config_path: PathBuf,
    _dir: TempDir,
}

impl Agent {
    /// Start the agent with `config_yaml` (written to a temp file, passed as `--config`)
    /// and `--web.listen-address 127.0.0.1:0`; waits up to 15 s for `listening on ADDR`.
    pub fn start(config_yaml: &str) -> Agent {
        Agent::start_with_args(config_yaml, &[])
    }

    /// Like [`Agent::start`], with extra command-line arguments. An extra
    /// `--web.listen-address` or `--config` replaces the harness's own.
    pub fn start_with_args(config_yaml: &str, extra_args: &[&str]) -> Agent {
        Agent::start_bin(Path::new(AGENT_BIN), config_yaml, extra_args)
    }

    /// Like [`Agent::start_with_args`], running the binary at `bin` (e.g. a copy of
    /// [`AGENT_BIN`] on a test filesystem).
    pub fn start_bin(bin: &Path, config_yaml: &str, extra_args: &[&str]) -> Agent {
        Agent::start_cmd(Command::new(bin), config_yaml, extra_args)
    }

    /// Like [`Agent::start_with_args`], with `cmd` as the start of the command line: a
    /// program and its leading arguments (e.g. `systemd-socket-activate -l ADDR BIN`),
    /// perhaps a `pre_exec`. `--config` (and, unless `--web.systemd-socket` or
    /// `--web.listen-address` is among `extra_args`, `--web.listen-address 127.0.0.1:0`)
    /// and `extra_args` follow.
    pub fn start_cmd(mut cmd: Command, config_yaml: &str, extra_args: &[&str]) -> Agent {
        let dir = tempfile::Builder::new()
            .prefix("stallwatch-agent-")
            .tempdir()
            .expect("create tempdir");
        let config_path = dir.path().join("config.yaml");
        std::fs::write(&config_path, config_yaml).expect("write config");

        let has = |flag: &str| {
            extra_args
                .iter()
                .any(|a| *a == flag || a.starts_with(&format!("{flag}=")))
        };
        if !has("--config") {
            cmd.arg("--config").arg(&config_path);
        }
        if !has("--web.listen-address") && !has("--web.systemd-socket") {
            cmd.arg("--web.listen-address").arg("127.0.0.1:0");
        }
        cmd.args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        eprintln!("[harness] starting {cmd:?}");
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let pid = child.id();

        let logs = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("stderr pipe");
        let stdout = child.stdout.take().expect("stdout pipe");
        spawn_log_reader(stderr, "[agent] ", logs.clone());
        spawn_log_reader(stdout, "[agent:stdout] ", logs.clone());

        let mut agent = Agent {
            child: Some(child),
            exited: None,
            pid,
            addr: String::new(),
            logs,
            http: client_config().build().into(),
            config_path,
            _dir: dir,
        };

        let deadline = Instant::now() + AGENT_START_TIMEOUT;
        loop {
            if let Some(addr) = agent.logs().iter().find_map(|l| parse_listening(l)) {
                agent.addr = addr;
                break;
            }
            if let Some(status) = agent.try_wait() {
                // Give the readers a moment to collect the last lines.
                thread::sleep(Duration::from_millis(200));
                panic!(
                    "agent exited ({status}) before logging `listening on`; log:\n{}",
                    agent.logs().join("\n")
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "agent did not log `listening on ADDR` within {AGENT_START_TIMEOUT:?}; log:\n{}",
                    agent.logs().join("\n")
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
        agent
    }

    /// The bound address, e.g. `127.0.0.1:40111`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `http://ADDR{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// GET on a pooled connection; non-2xx statuses are responses, not errors. Err on
    /// transport failure (refused, timeout). Body as text (lossy UTF-8).
    pub fn try_get(&self, path: &str) -> Result<(u16, String, Duration), String> {
        let r = request(&self.http, "GET", &self.url(path), &[])?;
        Ok((r.status, r.text(), r.elapsed))
    }

    /// GET → (status, body, elapsed). Panics on transport failure, with the agent's log.
    pub fn get(&self, path: &str) -> (u16, String, Duration) {
        self.try_get(path).unwrap_or_else(|e| {
            panic!("{e}; agent log tail:\n{}", self.log_tail(40));
        })
    }

    /// GET on a new connection: headers exactly as the agent sent them, body undecoded
    /// (e.g. still gzip). For checking `Content-Encoding` and friends.
    pub fn get_raw(&self, path: &str, headers: &[(&str, &str)]) -> Result<RawResponse, String> {
        request(&fresh_client(), "GET", &self.url(path), headers)
    }

    /// GET /metrics, expect 200, parse.
    pub fn scrape(&self) -> Metrics {
        let (status, body, _) = self.get("/metrics");
        assert_eq!(status, 200, "GET /metrics: status {status}, body:\n{body}");
        Metrics::parse(&body).unwrap_or_else(|e| panic!("GET /metrics: {e}\nbody:\n{body}"))
    }

    /// All log lines so far (stderr and stdout, ANSI colours stripped).
    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    /// The last `n` log lines, joined.
    pub fn log_tail(&self, n: usize) -> String {
        let logs = self.logs.lock().unwrap();
        let from = logs.len().saturating_sub(n);
        logs[from..].join("\n")
    }

    /// Waits up to 10 s until `stallwatch_target_up{target}` is 1.
    pub fn wait_up(&self, target: &str) -> bool {
        wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
            self.try_get("/metrics")
                .ok()
                .and_then(|(_, body, _)| Metrics::parse(&body).ok())
                .and_then(|m| m.get("stallwatch_target_up", &[("target", target)]))
                == Some(1.0)
        })
    }

    /// Wait up to `timeout` for a log line containing `substr`.
    pub fn wait_log(&self, substr: &str, timeout: Duration) -> bool {
        wait_until(timeout, Duration::from_millis(20), || {
            self.logs.lock().unwrap().iter().any(|l| l.contains(substr))
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// `Threads:` of /proc/PID/status.
    pub fn thread_count(&self) -> usize {
        let status = Process::new(self.pid as i32)
            .and_then(|p| p.status())
            .unwrap_or_else(|e| panic!("read /proc/{}/status: {e}", self.pid));
        status.threads as usize
    }

    fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(st)) = child.try_wait() {
                    self.exited = Some(st);
                }
            }
        }
        self.exited
    }

    /// True while the child has not exited.
    pub fn is_running(&mut self) -> bool {
        self.try_wait().is_none()
    }

    /// `kill -s SIG PID` to our own child (e.g. `"TERM"`, `"INT"`, `"HUP"`). Returns
    /// false, sending nothing, when the child already exited (it is reaped here, so its
    /// pid can never have been reused while we hold it unreaped).
    pub fn signal(&mut self, sig: &str) -> bool {
        if self.try_wait().is_some() {
            return false;
        }
        run("kill", &["-s", sig, &self.pid.to_string()]);
        true
    }

    /// Wait up to `timeout` for the child to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_wait() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.try_wait().is_some() {
            return;
        }
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = child.kill(); // SIGKILL; the child is unreaped, so the pid is ours.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        // Blocked in the kernel (e.g. a frozen filesystem): it dies at the thaw.
        eprintln!(
            "[harness] agent pid {} survives SIGKILL (blocked in the kernel?); reaping in background",
            self.pid
        );
        thread::spawn(move || {
            let _ = child.wait();
        });
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            // CSI: parameters and intermediates, then a final byte in @..~
            for c2 in chars.by_ref() {
                if ('@'..='~').contains(&c2) {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn spawn_log_reader(
    pipe: impl Read + Send + 'static,
    prefix: &'static str,
    logs: Arc<Mutex<Vec<String>>>,
) {
    thread::spawn(move || {
        let mut r = BufReader::new(pipe);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf);
                    let line = strip_ansi(line.trim_end_matches(['\n', '\r']));
                    eprintln!("{prefix}{line}");
                    logs.lock().unwrap().push(line);
                }
            }
        }
    });
}

/// Address token after `listening on ` in a log line (plain, logfmt or JSON): ends at
/// whitespace or a double quote; an `http://` prefix and trailing `,`/`.` are dropped.
pub fn parse_listening(line: &str) -> Option<String> {
    let idx = line.find("listening on ")?;
    let rest = &line[idx + "listening on ".len()..];
    let tok: String = rest
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != '"' && *c != '\\')
        .collect();
    let tok = tok.strip_prefix("http://").unwrap_or(&tok);
    let tok = tok.trim_end_matches([',', '.', '/']);
    if tok.is_empty() || !tok.contains(':') {
        return None;
    }
    Some(tok.to_string())
}
