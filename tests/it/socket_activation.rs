//! `--web.systemd-socket` without systemd: sockets passed the way systemd passes them
//! (`LISTEN_FDS`, `LISTEN_PID`, descriptors from 3), by `systemd-socket-activate` and by
//! the test itself (two listeners at fds 3 and 4, set up in `pre_exec`). Every path is
//! served on every passed socket, the web configuration (basic auth here) applies, and
//! the refusals (nothing passed, passed to another process, not a listening socket) exit
//! with status 2 and say why. The real systemd case is in `systemd.rs`.

use std::net::TcpListener;
use std::os::fd::AsRawFd as _;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine as _;

use crate::support::agent::{Agent, AGENT_BIN};
use crate::support::http::{client_config, fresh_client, request};

const CONFIG: &str = "vm_interval: 1s\ntargets:\n  - path: /var/tmp\n    name: var_tmp\n    require_mountpoint: false\n    interval: 1s\n";

/// Starts `sh -c 'LISTEN_PID=$$ LISTEN_FDS=N exec AGENT ...'` (exec keeps the pid, so
/// LISTEN_PID names the agent) with `listeners` at fds 3, 4, ...
fn start_with_sockets(listeners: &[&TcpListener], config: &str, extra: &[&str]) -> Agent {
    let fds: Vec<i32> = listeners.iter().map(|l| l.as_raw_fd()).collect();
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "LISTEN_PID=$$ LISTEN_FDS={} exec \"$0\" \"$@\"",
            fds.len()
        ))
        .arg(AGENT_BIN);
    // SAFETY: only dup2/fcntl, async-signal-safe, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // Out of the way first (a source may sit on a target number), then into place.
            let high: Vec<i32> = fds
                .iter()
                .map(|fd| libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 100))
                .collect();
            for (i, fd) in high.iter().enumerate() {
                if *fd < 0 || libc::dup2(*fd, 3 + i as i32) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut args = vec!["--web.systemd-socket"];
    args.extend_from_slice(extra);
    Agent::start_cmd(cmd, config, &args)
}

fn get(addr: &str, path: &str, headers: &[(&str, &str)]) -> u16 {
    request(
        &fresh_client(),
        "GET",
        &format!("http://{addr}{path}"),
        headers,
    )
    .unwrap_or_else(|e| panic!("{e}"))
    .status
}

#[test]
fn systemd_socket_activate_passes_the_socket_and_every_path_is_served() {
    assert!(
        Command::new("systemd-socket-activate")
            .arg("--help")
            .stdout(Stdio::null())
            .status()
            .is_ok(),
        "systemd-socket-activate not found: apt-get install systemd"
    );
    // A free port: bound by the kernel's choice, released, handed to the activator.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut cmd = Command::new("systemd-socket-activate");
    cmd.args(["-l", &addr, AGENT_BIN]);
    // The activator starts the program at the first connection (as systemd does for a
    // socket whose service is not running): this request waits in the socket's backlog
    // until the agent, started for it, accepts it.
    let first = {
        let url = format!("http://{addr}/healthz");
        std::thread::spawn(move || {
            let client: ureq::Agent = client_config()
                .timeout_global(Some(Duration::from_secs(20)))
                .max_idle_connections(0)
                .build()
                .into();
            // The activator may not be listening yet: retry a refused connect briefly.
            let mut last = String::new();
            for _ in 0..50 {
                match request(&client, "GET", &url, &[]) {
                    Ok(r) => return Ok(r.status),
                    Err(e) => last = e,
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(last)
        })
    };
    let agent = Agent::start_cmd(cmd, CONFIG, &["--web.systemd-socket"]);
    assert_eq!(
        first.join().unwrap(),
        Ok(200),
        "the request that started the agent"
    );
    assert_eq!(
        agent.addr(),
        addr,
        "the agent serves the activator's socket"
    );
    assert!(
        agent
            .logs()
            .iter()
            .any(|l| l.contains("listening on") && l.contains("systemd_socket=true")),
        "{}",
        agent.log_tail(10)
    );
    for (path, status) in [
        ("/metrics", 200),
        ("/healthz", 200),
        ("/api/stalls", 200),
        ("/", 200),
        ("/nope", 404),
    ] {
        assert_eq!(get(&addr, path, &[]), status, "GET {path}");
    }
    assert!(agent.wait_up("var_tmp"), "{}", agent.log_tail(20));
}

#[test]
fn every_passed_socket_is_served_with_the_web_config() {
    let a = TcpListener::bind("127.0.0.1:0").unwrap();
    let b = TcpListener::bind("127.0.0.1:0").unwrap();
    let (addr_a, addr_b) = (
        a.local_addr().unwrap().to_string(),
        b.local_addr().unwrap().to_string(),
    );
    let dir = tempfile::tempdir().unwrap();
    let web = dir.path().join("web.yml");
    let hash = bcrypt::hash("s3cret", 4).unwrap();
    std::fs::write(&web, format!("basic_auth_users:\n  alice: {hash}\n")).unwrap();
    let agent = start_with_sockets(
        &[&a, &b],
        CONFIG,
        &["--web.config.file", web.to_str().unwrap()],
    );
    // The test's copies stay open here; the agent accepts on its own (same sockets).
    // The start returns at the first `listening on`; the second socket's line follows.
    for addr in [&addr_a, &addr_b] {
        assert!(
            agent.wait_log(&format!("listening on {addr}"), Duration::from_secs(5)),
            "{addr} not logged:\n{}",
            agent.log_tail(10)
        );
    }
    let logged: Vec<String> = agent
        .logs()
        .iter()
        .filter(|l| l.contains("listening on"))
        .cloned()
        .collect();
    assert_eq!(logged.len(), 2, "one `listening on` per socket: {logged:?}");
    let auth = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("alice:s3cret")
    );
    for addr in [&addr_a, &addr_b] {
        assert!(
            logged.iter().any(|l| l.contains(addr.as_str())),
            "{addr} not logged: {logged:?}"
        );
        // Several rounds: both sockets keep being accepted on, not only the first.
        for _ in 0..3 {
            assert_eq!(get(addr, "/metrics", &[]), 401, "{addr}: no credentials");
            assert_eq!(
                get(addr, "/metrics", &[("Authorization", &auth)]),
                200,
                "{addr}"
            );
            assert_eq!(
                get(addr, "/healthz", &[("Authorization", &auth)]),
                200,
                "{addr}"
            );
        }
    }
}

/// Runs the agent with `--web.systemd-socket` under `sh -c SCRIPT`; (status, stderr).
fn refused(script: &str) -> (Option<i32>, String) {
    let out = Command::new("timeout")
        .args([
            "20",
            "sh",
            "-c",
            script,
            AGENT_BIN,
            "--web.systemd-socket",
            "--config",
        ])
        .arg({
            let p = std::env::temp_dir().join(format!("stallwatch-sa-{}.yaml", std::process::id()));
            std::fs::write(&p, CONFIG).unwrap();
            p
        })
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn without_a_usable_socket_the_agent_refuses_to_start() {
    // Nothing passed.
    let (code, err) = refused("exec \"$0\" \"$@\"");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("no socket activation file descriptors found"),
        "{err}"
    );
    // Passed to another process (LISTEN_PID is not the agent's): not ours.
    let (code, err) = refused("LISTEN_PID=1 LISTEN_FDS=1 exec \"$0\" \"$@\" 3</dev/null");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("no socket activation file descriptors found"),
        "{err}"
    );
    // fd 3 is a file, not a listening socket.
    let (code, err) = refused("LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" \"$@\" 3</dev/null");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("descriptor 3 is not a socket"), "{err}");
    // A bad count.
    let (code, err) = refused("LISTEN_PID=$$ LISTEN_FDS=x exec \"$0\" \"$@\"");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("LISTEN_FDS=\"x\" is not a number"), "{err}");
    let _ = std::fs::remove_file(
        std::env::temp_dir().join(format!("stallwatch-sa-{}.yaml", std::process::id())),
    );
}
