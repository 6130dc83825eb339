//! The HTTP server from outside: `--web.config.file` (TLS, client certificates, basic
//! auth, headers, rate limit), the limits against abusive clients (`--web.max-requests`,
//! header size, idle and half-sent connections) and the listener closing on SIGTERM.
//! Certificates are made here with rcgen; all traffic stays on 127.0.0.1.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use tempfile::TempDir;
use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig};

use crate::support::agent::{Agent, AGENT_BIN};
use crate::support::http::{client_config, fresh_client, request, RawResponse};
use crate::support::machine;
use crate::support::wait::wait_until;

// ---------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------

/// A probe target in a temporary directory (not a mount point), and a directory for the
/// web config and its files.
struct Setup {
    probe: TempDir,
    dir: TempDir,
}

impl Setup {
    fn new() -> Setup {
        Setup {
            probe: tempfile::Builder::new()
                .prefix("stallwatch-web-probe-")
                .tempdir()
                .unwrap(),
            dir: tempfile::Builder::new()
                .prefix("stallwatch-web-conf-")
                .tempdir()
                .unwrap(),
        }
    }

    fn config_yaml(&self) -> String {
        format!(
            "targets:\n  - path: {}\n    name: web\n    require_mountpoint: false\n",
            self.probe.path().display()
        )
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// Starts the agent with `web_yaml` as `--web.config.file` plus `extra` arguments.
    fn start(&self, web_yaml: Option<&str>, extra: &[&str]) -> Agent {
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        if let Some(y) = web_yaml {
            let p = self.write("web.yml", y);
            args.push("--web.config.file".into());
            args.push(p.display().to_string());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Agent::start_with_args(&self.config_yaml(), &args)
    }
}

/// A certificate and its key, in PEM.
struct Identity {
    cert_pem: String,
    key_pem: String,
}

/// A CA with a server certificate for localhost/127.0.0.1 and a client certificate.
struct Pki {
    ca: Identity,
    ca_cert: rcgen::Certificate,
    ca_key: KeyPair,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let ca_key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = p.self_signed(&ca_key).unwrap();
        Pki {
            ca: identity(&ca_cert, &ca_key),
            ca_cert,
            ca_key,
        }
    }

    fn issue(&self, sans: &[&str], usage: ExtendedKeyUsagePurpose) -> Identity {
        let key = KeyPair::generate().unwrap();
        let mut p =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        p.distinguished_name.push(DnType::CommonName, sans[0]);
        p.extended_key_usages = vec![usage];
        let cert = p.signed_by(&key, &self.ca_cert, &self.ca_key).unwrap();
        identity(&cert, &key)
    }

    fn server(&self) -> Identity {
        self.issue(
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    fn client(&self, name: &str) -> Identity {
        self.issue(&[name], ExtendedKeyUsagePurpose::ClientAuth)
    }
}

fn identity(cert: &rcgen::Certificate, key: &KeyPair) -> Identity {
    Identity {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

// ---------------------------------------------------------------------------------------
// Clients
// ---------------------------------------------------------------------------------------

/// Raw bytes of a request, for the requests no well-behaved client sends.
fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("\r\n");
    r.into_bytes()
}

/// Reads until EOF; an error after some bytes (a reset, a TLS close without
/// close_notify) ends the read, an error before any byte is returned.
fn read_all(r: &mut impl Read) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        match r.read(&mut buf) {
            Ok(0) => return Ok(out),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) if !out.is_empty() => return Ok(out),
            Err(e) => return Err(e.to_string()),
        }
    }
}

fn connect(addr: &str) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Status and body bytes, exactly as they came, answering raw request bytes sent on a
/// new connection.
fn raw(addr: &str, request: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let mut s = connect(addr);
    s.write_all(request).map_err(|e| format!("write: {e}"))?;
    let raw = read_all(&mut s)?;
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no HTTP response: {text:?}"))?;
    let body = match raw.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(end) => raw[end + 4..].to_vec(),
        None => return Err(format!("no end of headers: {text:?}")),
    };
    Ok((status, body))
}

/// One plain HTTP/1.1 request on a new connection.
fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<RawResponse, String> {
    let url = format!("http://{addr}{path}");
    request(&fresh_client(), method, &url, headers)
}

/// A TLS client trusting `root`, presenting `client` if given. Every request opens a
/// new connection; sessions are resumable only within the same client.
fn tls_client(root: &Identity, client: Option<&Identity>) -> ureq::Agent {
    let pem = |text: &str| Certificate::from_pem(text.as_bytes()).unwrap();
    let client_cert = client.map(|id| {
        let key = PrivateKey::from_pem(id.key_pem.as_bytes()).unwrap();
        ClientCert::new_with_certs(&[pem(&id.cert_pem)], key)
    });
    let tls = TlsConfig::builder()
        .root_certs(RootCerts::new_with_certs(&[pem(&root.cert_pem)]))
        .client_cert(client_cert)
        .build();
    client_config()
        .max_idle_connections(0)
        .tls_config(tls)
        .build()
        .into()
}

/// One HTTPS request to `localhost` (the name the server certificate is checked
/// against); Err when the handshake is refused.
fn https(
    addr: &str,
    client: &ureq::Agent,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<RawResponse, String> {
    let port = addr.rsplit(':').next().unwrap();
    request(
        client,
        "GET",
        &format!("https://localhost:{port}{path}"),
        headers,
    )
}

fn basic(user: &str, pass: &str) -> String {
    let v = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
    format!("Basic {v}")
}

/// Runs the agent expecting it to refuse its web config: (exit code, stderr).
fn refused(setup: &Setup, web_config: &Path) -> (Option<i32>, String) {
    let cfg = setup.write("config.yaml", &setup.config_yaml());
    let mut child = Command::new(AGENT_BIN)
        .arg("--config")
        .arg(&cfg)
        .args(["--web.listen-address", "127.0.0.1:0", "--web.config.file"])
        .arg(web_config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "agent did not refuse {}: still running",
                web_config.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status.code(), err)
}

fn scrape_ok(agent: &Agent, what: &str) -> Duration {
    let r = agent
        .get_raw("/metrics", &[])
        .unwrap_or_else(|e| panic!("{what}: scrape failed: {e}\n{}", agent.log_tail(30)));
    assert_eq!(r.status, 200, "{what}");
    assert!(
        String::from_utf8_lossy(&r.body).contains("stallwatch_build_info"),
        "{what}"
    );
    r.elapsed
}

// ---------------------------------------------------------------------------------------
// TLS and basic auth
// ---------------------------------------------------------------------------------------

#[test]
fn basic_auth_over_tls_answers_401_without_the_right_password() {
    let s = Setup::new();
    let pki = Pki::new("stallwatch test CA");
    let server = pki.server();
    // Relative names: resolved against the web config's directory, not the cwd.
    s.write("server.crt", &server.cert_pem);
    s.write("server.key", &server.key_pem);
    let hash = bcrypt::hash("s3cret", 4).unwrap();
    let agent = s.start(
        Some(&format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n\
             http_server_config:\n  headers:\n    X-Frame-Options: deny\n\
             basic_auth_users:\n  alice: {hash}\n"
        )),
        &[],
    );
    let addr = agent.addr().to_string();
    let cfg = tls_client(&pki.ca, None);

    let r = https(&addr, &cfg, "/metrics", &[]).unwrap();
    assert_eq!(r.status, 401, "no credentials");
    assert_eq!(r.header("www-authenticate"), Some("Basic"));
    assert_eq!(
        r.header("x-frame-options"),
        Some("deny"),
        "headers on a 401 too"
    );

    let wrong = basic("alice", "guess");
    let r = https(&addr, &cfg, "/metrics", &[("Authorization", &wrong)]).unwrap();
    assert_eq!(r.status, 401, "wrong password");
    assert_eq!(r.header("www-authenticate"), Some("Basic"));
    let stranger = basic("mallory", "s3cret");
    let r = https(&addr, &cfg, "/metrics", &[("Authorization", &stranger)]).unwrap();
    assert_eq!(r.status, 401, "unknown user");

    let right = basic("alice", "s3cret");
    for i in 0..3 {
        let r = https(&addr, &cfg, "/metrics", &[("Authorization", &right)]).unwrap();
        assert_eq!(r.status, 200, "right password, try {i}");
        assert!(r.text().contains("stallwatch_build_info"));
        assert_eq!(r.header("x-frame-options"), Some("deny"));
    }
    let r = https(&addr, &cfg, "/healthz", &[("Authorization", &right)]).unwrap();
    assert_eq!(r.status, 200);
    // One stall event by its id: behind the same auth (an id is no password).
    let one = "/api/stalls/019ae3f2c1b0-7f3a09c2-1";
    assert_eq!(https(&addr, &cfg, one, &[]).unwrap().status, 401);
    let r = https(&addr, &cfg, one, &[("Authorization", &right)]).unwrap();
    assert_eq!(r.status, 404, "no such event");
    // The stall pages too, with the same headers.
    for (path, status) in [
        ("/stalls", 200),
        ("/stalls?target=a", 200),
        ("/stalls/019ae3f2c1b0-7f3a09c2-1", 404),
    ] {
        let r = https(&addr, &cfg, path, &[]).unwrap();
        assert_eq!(r.status, 401, "{path} without credentials");
        let r = https(&addr, &cfg, path, &[("Authorization", &right)]).unwrap();
        assert_eq!(r.status, status, "{path}");
        assert_eq!(r.header("x-frame-options"), Some("deny"), "{path}");
        assert!(
            r.header("content-type")
                .unwrap_or("")
                .starts_with("text/html"),
            "{path}"
        );
    }

    // Plain HTTP against the TLS port: no HTTP answer.
    let mut tcp = connect(&addr);
    tcp.write_all(&request_bytes("GET", "/metrics", &[]))
        .unwrap();
    match read_all(&mut tcp) {
        Err(_) => {}
        Ok(raw) => assert!(
            !raw.starts_with(b"HTTP/"),
            "plain HTTP got an HTTP answer: {:?}",
            String::from_utf8_lossy(&raw)
        ),
    }
    // A client that does not trust the server's CA fails its handshake.
    let other = Pki::new("another CA");
    assert!(https(&addr, &tls_client(&other.ca, None), "/metrics", &[]).is_err());
    assert!(agent.wait_log("TLS is enabled", Duration::from_secs(1)));
}

#[test]
fn client_certificate_required_and_verified() {
    let s = Setup::new();
    let pki = Pki::new("stallwatch test CA");
    let server = pki.server();
    s.write("server.crt", &server.cert_pem);
    s.write("server.key", &server.key_pem);
    s.write("clients.crt", &pki.ca.cert_pem);
    let agent = s.start(
        Some(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n\
             \x20 client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: clients.crt\n\
             \x20 client_allowed_sans: [prometheus.example.org]\n",
        ),
        &[],
    );
    let addr = agent.addr().to_string();

    let ok = pki.client("prometheus.example.org");
    let r = https(&addr, &tls_client(&pki.ca, Some(&ok)), "/metrics", &[]).unwrap();
    assert_eq!(r.status, 200);

    let none = https(&addr, &tls_client(&pki.ca, None), "/metrics", &[]);
    assert!(none.is_err(), "no client certificate: {none:?}");
    let stranger_ca = Pki::new("someone else's CA");
    let foreign = stranger_ca.client("prometheus.example.org");
    let r = https(&addr, &tls_client(&pki.ca, Some(&foreign)), "/metrics", &[]);
    assert!(r.is_err(), "certificate from another CA: {r:?}");
    let wrong_san = pki.client("intruder.example.org");
    let r = https(
        &addr,
        &tls_client(&pki.ca, Some(&wrong_san)),
        "/metrics",
        &[],
    );
    assert!(r.is_err(), "SAN not in client_allowed_sans: {r:?}");
}

#[test]
fn a_replaced_certificate_is_served_without_a_restart() {
    let s = Setup::new();
    let old = Pki::new("old CA");
    let old_server = old.server();
    s.write("server.crt", &old_server.cert_pem);
    s.write("server.key", &old_server.key_pem);
    let agent = s.start(
        Some("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"),
        &[],
    );
    let addr = agent.addr().to_string();
    let trust_old = tls_client(&old.ca, None);
    assert_eq!(
        https(&addr, &trust_old, "/healthz", &[]).unwrap().status,
        200
    );

    let new = Pki::new("new CA");
    let new_server = new.server();
    let trust_new = tls_client(&new.ca, None);
    // A broken pair first (new certificate, old key): logged, and the old pair stays.
    s.write("server.crt", &new_server.cert_pem);
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(
        https(&addr, &trust_old, "/healthz", &[]).unwrap().status,
        200
    );
    assert!(agent.wait_log("keeping the previous one", Duration::from_secs(2)));
    s.write("server.key", &new_server.key_pem);
    let rotated = wait_until(Duration::from_secs(5), Duration::from_millis(100), || {
        https(&addr, &trust_new, "/healthz", &[]).is_ok_and(|r| r.status == 200)
    });
    assert!(rotated, "the new certificate was not picked up");
    // A fresh client (no session to resume) that trusts only the old CA is refused now.
    let fresh_old = tls_client(&old.ca, None);
    assert!(https(&addr, &fresh_old, "/healthz", &[]).is_err());
    assert!(agent.wait_log("TLS certificate reloaded", Duration::from_secs(1)));
}

#[test]
fn the_example_web_config_passes_promtool_and_works() {
    let s = Setup::new();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/web-config.example.yml");
    let text = std::fs::read_to_string(&example).unwrap();
    let pki = Pki::new("stallwatch test CA");
    let server = pki.server();
    s.write("stallwatch.crt", &server.cert_pem);
    s.write("stallwatch.key", &server.key_pem);
    let path = s.write("web-config.yml", &text);
    let out = Command::new("promtool")
        .args(["check", "web-config"])
        .arg(&path)
        .output()
        .expect("promtool is installed by scripts/test (Debian package prometheus)");
    assert!(
        out.status.success(),
        "promtool check web-config: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let p = path.display().to_string();
    let agent = s.start(None, &["--web.config.file", &p]);
    let cfg = tls_client(&pki.ca, None);
    let r = https(agent.addr(), &cfg, "/metrics", &[]).unwrap();
    assert_eq!(r.status, 401);
    let auth = basic("prometheus", "change-me");
    let r = https(agent.addr(), &cfg, "/metrics", &[("Authorization", &auth)]).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
}

#[test]
fn invalid_web_configs_are_refused_at_start_with_exit_2() {
    let s = Setup::new();
    let pki = Pki::new("stallwatch test CA");
    let server = pki.server();
    let other = pki.server();
    s.write("server.crt", &server.cert_pem);
    s.write("server.key", &server.key_pem);
    s.write("other.key", &other.key_pem);
    s.write("ca.crt", &pki.ca.cert_pem);
    let tls = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n";
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "unknown key",
            "tls_server_config:\n  cert_fil: server.crt\n".into(),
            "cert_fil",
        ),
        (
            "unknown section",
            "basic_auth:\n  a: b\n".into(),
            "basic_auth",
        ),
        ("yaml syntax", "tls_server_config: [\n".into(), "line"),
        (
            "missing cert file",
            "tls_server_config:\n  cert_file: nope.crt\n  key_file: server.key\n".into(),
            "nope.crt",
        ),
        (
            "key only",
            "tls_server_config:\n  key_file: server.key\n".into(),
            "cert_file",
        ),
        (
            "key of another cert",
            "tls_server_config:\n  cert_file: server.crt\n  key_file: other.key\n".into(),
            "key",
        ),
        (
            "cert is not PEM",
            "tls_server_config:\n  cert_file: config.yaml\n  key_file: server.key\n".into(),
            "certificate",
        ),
        (
            "CA without auth type",
            format!("{tls}  client_ca_file: ca.crt\n"),
            "client_auth_type",
        ),
        (
            "bad auth type",
            format!("{tls}  client_auth_type: Sometimes\n"),
            "Sometimes",
        ),
        (
            "verify without CA",
            format!("{tls}  client_auth_type: RequireAndVerifyClientCert\n"),
            "client_ca",
        ),
        (
            "bad TLS version",
            format!("{tls}  min_version: TLS9\n"),
            "TLS9",
        ),
        (
            "bad cipher",
            format!("{tls}  cipher_suites: [TLS_NOPE]\n"),
            "TLS_NOPE",
        ),
        (
            "not a bcrypt hash",
            "basic_auth_users:\n  alice: hunter2\n".into(),
            "alice",
        ),
        (
            "header not allowed",
            "http_server_config:\n  headers:\n    Server: x\n".into(),
            "Server",
        ),
        (
            "header value",
            "http_server_config:\n  headers:\n    X-Frame-Options: allow\n".into(),
            "X-Frame-Options",
        ),
    ];
    for (what, yaml, needle) in &cases {
        let p = s.write("bad.yml", yaml);
        let (code, err) = refused(&s, &p);
        assert_eq!(code, Some(2), "{what}: exit status; stderr: {err}");
        assert!(err.contains("bad.yml"), "{what}: file not named: {err}");
        assert!(err.contains(needle), "{what}: {needle:?} not in: {err}");
    }
    let (code, err) = refused(&s, &s.dir.path().join("missing.yml"));
    assert_eq!(code, Some(2), "missing file: {err}");
    assert!(err.contains("missing.yml"), "{err}");
    assert!(
        !s.probe.path().join(".stallwatch").exists(),
        "nothing may be written when the start is refused"
    );
}

// ---------------------------------------------------------------------------------------
// HTTP limits
// ---------------------------------------------------------------------------------------

#[test]
fn only_get_and_head_unknown_paths_404_gzip_when_asked() {
    let s = Setup::new();
    let agent = s.start(None, &[]);
    let addr = agent.addr().to_string();

    for m in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
        let r = http(&addr, m, "/metrics", &[("Content-Length", "0")]).unwrap();
        assert_eq!(r.status, 405, "{m} /metrics");
    }
    let r = http(&addr, "POST", "/healthz", &[("Content-Length", "0")]).unwrap();
    assert_eq!(r.status, 405);
    // Raw: a client library would not read a body after HEAD even if one came.
    let (status, body) = raw(&addr, &request_bytes("HEAD", "/metrics", &[])).unwrap();
    assert_eq!(status, 200);
    assert!(body.is_empty(), "HEAD has no body");
    for p in ["/nope", "/metrics/x", "/api", "/healthz/"] {
        assert_eq!(http(&addr, "GET", p, &[]).unwrap().status, 404, "{p}");
    }

    let gz = agent
        .get_raw("/metrics", &[("Accept-Encoding", "gzip")])
        .unwrap();
    assert_eq!(gz.status, 200);
    assert_eq!(gz.header("content-encoding"), Some("gzip"));
    assert_eq!(&gz.body[..2], &[0x1f, 0x8b], "gzip magic");
    let plain = agent.get_raw("/metrics", &[]).unwrap();
    assert_eq!(plain.header("content-encoding"), None);
    assert!(String::from_utf8_lossy(&plain.body).contains("stallwatch_build_info"));
    assert!(gz.body.len() < plain.body.len());
}

#[test]
fn a_header_too_large_gets_431() {
    let s = Setup::new();
    let agent = s.start(None, &[]);
    let big = "a".repeat(20 * 1024);
    let req = request_bytes("GET", "/metrics", &[("X-Big", &big)]);
    assert_eq!(raw(agent.addr(), &req).unwrap().0, 431);
    // Well within the limit is fine.
    let ok = "a".repeat(4 * 1024);
    let r = http(agent.addr(), "GET", "/metrics", &[("X-Ok", &ok)]).unwrap();
    assert_eq!(r.status, 200);
}

#[test]
fn requests_beyond_max_requests_get_503_at_once() {
    let _machine = machine::shared();
    let s = Setup::new();
    // A costly hash keeps each wrong-password request in flight for a while (bcrypt
    // runs one at a time), so that 8 at once exceed a limit of 2.
    let hash = bcrypt::hash("s3cret", 10).unwrap();
    let agent = s.start(
        Some(&format!("basic_auth_users:\n  alice: {hash}\n")),
        &["--web.max-requests", "2"],
    );
    let addr = agent.addr().to_string();
    let n = 8;
    let gate = Arc::new(Barrier::new(n));
    let results: Vec<RawResponse> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..n)
            .map(|i| {
                let (gate, addr) = (Arc::clone(&gate), addr.clone());
                sc.spawn(move || {
                    let wrong = basic("alice", &format!("guess{i}"));
                    gate.wait();
                    http(&addr, "GET", "/metrics", &[("Authorization", &wrong)]).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let busy: Vec<&RawResponse> = results.iter().filter(|r| r.status == 503).collect();
    let denied = results.iter().filter(|r| r.status == 401).count();
    assert_eq!(busy.len() + denied, n, "{results:?}");
    assert!(
        !busy.is_empty(),
        "no 503 beyond --web.max-requests 2: {results:?}"
    );
    assert!(denied >= 1, "{results:?}");
    let slowest_denied = results
        .iter()
        .filter(|r| r.status == 401)
        .map(|r| r.elapsed)
        .max()
        .unwrap();
    for r in &busy {
        assert!(
            r.elapsed < slowest_denied && r.elapsed < Duration::from_secs(1),
            "503 must come at once, not after queueing: {:?} (slowest 401 {:?})",
            r.elapsed,
            slowest_denied
        );
    }
    // The limit frees up again.
    let right = basic("alice", "s3cret");
    let r = http(&addr, "GET", "/metrics", &[("Authorization", &right)]).unwrap();
    assert_eq!(r.status, 200);
}

#[test]
fn rate_limit_answers_429() {
    let s = Setup::new();
    let agent = s.start(Some("rate_limit:\n  burst: 3\n  interval: 1h\n"), &[]);
    let codes: Vec<u16> = (0..5)
        .map(|_| http(agent.addr(), "GET", "/healthz", &[]).unwrap().status)
        .collect();
    assert_eq!(codes, vec![200, 200, 200, 429, 429]);
}

#[test]
fn idle_and_half_sent_connections_do_not_delay_a_scrape() {
    let _machine = machine::shared();
    let s = Setup::new();
    let agent = s.start(None, &[]);
    let addr = agent.addr().to_string();
    scrape_ok(&agent, "before");

    let mut idle: Vec<TcpStream> = (0..300).map(|_| connect(&addr)).collect();
    let opened = Instant::now();
    let half_sent: Vec<TcpStream> = (0..100)
        .map(|i| {
            let mut c = connect(&addr);
            c.write_all(format!("GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow-{i}: ").as_bytes())
                .unwrap();
            c
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    for i in 0..5 {
        let t = scrape_ok(&agent, &format!("with 400 idle/half-sent, scrape {i}"));
        assert!(t < Duration::from_secs(1), "scrape {i} took {t:?}");
    }

    // Past the connection cap (512) the oldest idle connections make room.
    idle.extend((0..250).map(|_| connect(&addr)));
    std::thread::sleep(Duration::from_millis(200));
    for i in 0..3 {
        let t = scrape_ok(&agent, &format!("with 650 open, scrape {i}"));
        assert!(
            t < Duration::from_secs(1),
            "scrape {i} past the cap took {t:?}"
        );
    }
    assert!(agent.wait_log("connection limit (512) reached", Duration::from_secs(2)));

    // Slowloris: a head not finished within the header read timeout (10 s) is dropped.
    let mut last = half_sent.into_iter().last().unwrap();
    last.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let _ = read_all(&mut last);
    let waited = opened.elapsed();
    assert!(
        waited >= Duration::from_secs(8) && waited < Duration::from_secs(15),
        "half-sent connection closed after {waited:?}, expected the 10 s header timeout"
    );
    scrape_ok(&agent, "after");
}

#[test]
fn sigterm_closes_the_listener_at_once() {
    let _machine = machine::shared();
    let s = Setup::new();
    let mut agent = s.start(None, &[]);
    let addr = agent.addr().to_string();
    scrape_ok(&agent, "before");
    // Open connections must not hold the listener or the exit.
    let mut idle = connect(&addr);
    let mut half = connect(&addr);
    half.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));

    let start = Instant::now();
    assert!(agent.signal("TERM"));
    let refused = wait_until(Duration::from_secs(1), Duration::from_millis(10), || {
        TcpStream::connect(&addr).is_err()
    });
    assert!(
        refused,
        "a new connection was still accepted 1 s after SIGTERM; log:\n{}",
        agent.log_tail(20)
    );
    let closed_in = start.elapsed();
    idle.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let _ = read_all(&mut idle);
    assert!(
        start.elapsed() < Duration::from_millis(1500),
        "idle connection kept open {:?} after SIGTERM",
        start.elapsed()
    );
    half.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let _ = read_all(&mut half);
    let status = agent
        .wait_exit(Duration::from_secs(5))
        .expect("agent did not exit within 5 s of SIGTERM");
    assert!(status.success(), "{status}");
    eprintln!("listener closed {closed_in:?} after SIGTERM");
}
