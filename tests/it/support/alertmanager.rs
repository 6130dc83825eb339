//! A real Alertmanager for tests (Debian's `prometheus-alertmanager` on 127.0.0.1, a port
//! the test picked, its own storage directory, clustering off), stopped by its pid on
//! drop; and [`Webhook`], the receiver it notifies: a small HTTP server on 127.0.0.1:0
//! that keeps every POST body.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::cmd::tool;

/// The running Alertmanager; SIGTERM (then SIGKILL) to its pid on drop.
pub struct Alertmanager {
    child: Child,
    addr: String,
    log: PathBuf,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Alertmanager {
    /// Starts Alertmanager with the configuration file `config`; storage and log in `dir`.
    pub fn start(dir: &Path, config: &Path) -> Alertmanager {
        let bin = tool(
            "prometheus-alertmanager",
            "apt-get install prometheus-alertmanager",
        );
        let addr = format!("127.0.0.1:{}", free_port());
        let log = dir.join("alertmanager.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.path={}", dir.join("am-data").display()))
            .arg(format!("--web.listen-address={addr}"))
            // No gossip port: a single instance, nothing listening beyond 127.0.0.1.
            .arg("--cluster.listen-address=")
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .current_dir(dir)
            .spawn()
            .expect("start prometheus-alertmanager");
        Alertmanager { child, addr, log }
    }

    /// host:port, for Prometheus' `alerting` section.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits up to `timeout` for `/-/ready`.
    pub fn wait_ready(&mut self, timeout: Duration) -> bool {
        let http: ureq::Agent = super::http::client_config().build().into();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok(r) = http.get(&format!("http://{}/-/ready", self.addr)).call() {
                if r.status() == 200 {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    }
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        use rustix::process::{kill_process, Pid, Signal};
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // Unreaped, so the pid is still our child's.
        if let Some(pid) = Pid::from_raw(self.child.id() as i32) {
            let _ = kill_process(pid, Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One notification as the webhook received it.
#[derive(Clone, Debug)]
pub struct Notification {
    /// When it arrived.
    pub at: Instant,
    pub path: String,
    /// The POST body, parsed (Alertmanager's webhook JSON); Null if it was not JSON.
    pub body: Value,
}

/// A webhook receiver on 127.0.0.1:0: answers every request 200 and keeps each POST.
/// Serves for at most 15 minutes; stopped and joined on drop.
pub struct Webhook {
    addr: String,
    received: Arc<Mutex<Vec<Notification>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Reads one HTTP/1.1 request (headers, then Content-Length bytes); (method, path, body).
fn read_request(stream: &TcpStream) -> Option<(String, String, Vec<u8>)> {
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next()?.to_string(), parts.next()?.to_string());
    let mut len = 0usize;
    for _ in 0..100 {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.trim().eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; len.min(16 << 20)];
    r.read_exact(&mut body).ok()?;
    Some((method, path, body))
}

impl Webhook {
    pub fn start() -> Webhook {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind webhook");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let received = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (rec, st) = (Arc::clone(&received), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(15 * 60);
            while !st.load(Ordering::Relaxed) && Instant::now() < deadline {
                let mut stream = match listener.accept() {
                    Ok((s, _)) => s,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                };
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
                if let Some((method, path, body)) = read_request(&stream) {
                    if method == "POST" {
                        rec.lock().unwrap().push(Notification {
                            at: Instant::now(),
                            path,
                            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
                        });
                    }
                    let _ = stream.write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                }
            }
        });
        Webhook {
            addr,
            received,
            stop,
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT/PATH`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Every notification so far, oldest first.
    pub fn received(&self) -> Vec<Notification> {
        self.received.lock().unwrap().clone()
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
