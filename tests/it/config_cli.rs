//! Bad configuration, through the binary: every broken file is refused by both
//! `stallwatch check-config FILE` and `stallwatch --config FILE` with exit status 2 and a
//! message that names the file and the line or the key, and the agent writes nothing.
//!
//! No root needed: targets point at a temporary directory with `require_mountpoint:
//! false`, so an agent that wrongly started would create `.stallwatch` there at once.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_stallwatch");

/// `TARGET` in a case stands for the temporary probe directory of the test.
struct Case {
    name: &'static str,
    yaml: &'static str,
    /// Each must appear in the message (besides the file name).
    words: &'static [&'static str],
}

const CASES: &[Case] = &[
    // Syntax.
    Case {
        name: "unclosed flow sequence",
        yaml: "targets: [\n",
        words: &["line 2"],
    },
    Case {
        name: "tab indentation",
        yaml: "targets:\n  - path: TARGET\n\tname: tab\n",
        words: &["line 3"],
    },
    Case {
        name: "unclosed quote",
        yaml: "listen_address: \"127.0.0.1:0\ntargets:\n  - path: TARGET\n",
        words: &["line "],
    },
    Case {
        name: "empty file",
        yaml: "",
        words: &["targets"],
    },
    Case {
        name: "not a mapping",
        yaml: "- path: TARGET\n",
        words: &["line 1"],
    },
    // Unknown keys.
    Case {
        name: "unknown top-level key",
        yaml: "colour: red\ntargets:\n  - path: TARGET\n",
        words: &["unknown field `colour`", "line 1"],
    },
    Case {
        name: "misspelt target key",
        yaml: "targets:\n  - path: TARGET\n    intervall: 5s\n",
        words: &["targets[0]", "unknown field `intervall`", "line 3"],
    },
    Case {
        name: "unknown key in defaults",
        yaml: "defaults:\n  colour: red\ntargets:\n  - path: TARGET\n",
        words: &["defaults", "unknown field `colour`", "line 2"],
    },
    // Wrong types.
    Case {
        name: "targets is a mapping",
        yaml: "targets:\n  path: TARGET\n",
        words: &["targets", "line 2"],
    },
    Case {
        name: "target entry is a string",
        yaml: "targets:\n  - TARGET\n",
        words: &["targets[0]", "mapping", "line 2"],
    },
    Case {
        name: "defaults is a number",
        yaml: "defaults: 3\ntargets:\n  - path: TARGET\n",
        words: &["defaults", "mapping", "line 1"],
    },
    Case {
        name: "interval is a number",
        yaml: "targets:\n  - path: TARGET\n    interval: 5\n",
        words: &["interval", "line 3"],
    },
    Case {
        name: "modes is a string",
        yaml: "targets:\n  - path: TARGET\n    modes: create\n",
        words: &["modes", "line 3"],
    },
    Case {
        name: "require_mountpoint is not a bool",
        yaml: "targets:\n  - path: TARGET\n    require_mountpoint: maybe\n",
        words: &["targets[0].require_mountpoint", "line 3"],
    },
    Case {
        name: "stall_log_size is text",
        yaml: "stall_log_size: many\ntargets:\n  - path: TARGET\n",
        words: &["stall_log_size", "line 1"],
    },
    Case {
        name: "unknown mode",
        yaml: "targets:\n  - path: TARGET\n    modes: [create, fsync]\n",
        words: &["targets[0].modes", "unknown variant `fsync`", "line 3"],
    },
    Case {
        name: "unknown sync",
        yaml: "defaults:\n  sync: sometimes\ntargets:\n  - path: TARGET\n",
        words: &["defaults.sync", "unknown variant `sometimes`", "line 2"],
    },
    // Zero, negative, too small, too large.
    Case {
        name: "zero interval",
        yaml: "targets:\n  - path: TARGET\n    interval: 0s\n",
        words: &["targets[0].interval", "greater than zero", "line 3"],
    },
    Case {
        name: "negative interval",
        yaml: "targets:\n  - path: TARGET\n    interval: -5s\n",
        words: &["targets[0].interval", "line 3"],
    },
    Case {
        name: "interval below the minimum",
        yaml: "defaults:\n  interval: 10ms\ntargets:\n  - path: TARGET\n",
        words: &["defaults.interval", "minimum"],
    },
    Case {
        name: "zero vm_interval",
        yaml: "vm_interval: 0s\ntargets:\n  - path: TARGET\n",
        words: &["vm_interval", "greater than zero", "line 1"],
    },
    Case {
        name: "negative stall_threshold",
        yaml: "targets:\n  - path: TARGET\n    stall_threshold: -1s\n",
        words: &["stall_threshold", "line 3"],
    },
    Case {
        name: "zero size",
        yaml: "targets:\n  - path: TARGET\n    size: 0\n",
        words: &["targets[0].size", "greater than zero", "line 3"],
    },
    Case {
        name: "negative size",
        yaml: "defaults:\n  size: -4096\ntargets:\n  - path: TARGET\n",
        words: &["defaults.size", "greater than zero", "line 2"],
    },
    Case {
        name: "size with a bad unit",
        yaml: "targets:\n  - path: TARGET\n    size: 4 parsecs\n",
        words: &["targets[0].size", "invalid size", "line 3"],
    },
    Case {
        name: "size above the maximum",
        yaml: "targets:\n  - path: TARGET\n    size: 1GiB\n",
        words: &["targets[0].size", "maximum"],
    },
    Case {
        name: "zero stall_log_size",
        yaml: "stall_log_size: 0\ntargets:\n  - path: TARGET\n",
        words: &["stall_log_size", "line 1"],
    },
    Case {
        name: "no modes",
        yaml: "targets:\n  - path: TARGET\n    modes: []\n",
        words: &["targets[0].modes", "at least one mode"],
    },
    // Targets.
    Case {
        name: "no targets",
        yaml: "targets: []\n",
        words: &["targets", "at least one target"],
    },
    Case {
        name: "missing targets",
        yaml: "listen_address: \"127.0.0.1:0\"\n",
        words: &["missing field `targets`"],
    },
    Case {
        name: "target without path",
        yaml: "targets:\n  - name: x\n",
        words: &["targets[0]", "missing field `path`", "line 2"],
    },
    Case {
        name: "duplicate target names",
        yaml: "targets:\n  - path: TARGET\n    name: x\n  - path: /srv/b\n    name: x\n",
        words: &["targets[1].name", "already used", "line 5"],
    },
    Case {
        name: "duplicate paths",
        yaml: "targets:\n  - path: TARGET\n  - path: TARGET\n",
        words: &["targets[1].path", "already probed", "line 3"],
    },
    Case {
        name: "relative path",
        yaml: "targets:\n  - path: TARGET\n  - path: srv/raid0\n",
        words: &["targets[1].path", "relative", "line 3"],
    },
    Case {
        name: "path with ..",
        yaml: "targets:\n  - path: TARGET/../etc\n",
        words: &["targets[0].path", "..", "line 2"],
    },
    Case {
        name: "empty name",
        yaml: "targets:\n  - path: TARGET\n    name: \"\"\n",
        words: &["targets[0].name", "line 3"],
    },
    // Addresses and paths of the HTTP side.
    Case {
        name: "listen address without a port",
        yaml: "listen_address: nowhere\ntargets:\n  - path: TARGET\n",
        words: &["listen_address", "not an IP:port", "line 1"],
    },
    Case {
        name: "listen port out of range",
        yaml: "listen_address: \"10.0.0.1:99999\"\ntargets:\n  - path: TARGET\n",
        words: &["listen_address", "line 1"],
    },
    Case {
        name: "listen address is a host name",
        yaml: "listen_address: \"localhost:19858\"\ntargets:\n  - path: TARGET\n",
        words: &["listen_address", "line 1"],
    },
    Case {
        name: "relative telemetry path",
        yaml: "telemetry_path: metrics\ntargets:\n  - path: TARGET\n",
        words: &["telemetry_path", "line 1"],
    },
    Case {
        name: "telemetry path shadows /healthz",
        yaml: "telemetry_path: /healthz\ntargets:\n  - path: TARGET\n",
        words: &["telemetry_path", "line 1"],
    },
];

/// Runs the binary with a deadline; a refused configuration must never start the agent.
fn run(args: &[&std::ffi::OsStr]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start stallwatch");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "stallwatch {args:?} still running after 10 s (it should have refused its configuration); stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Every file and directory below `dir`, relative, sorted.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            out.push(e.path().strip_prefix(dir).unwrap().to_path_buf());
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
    out.sort();
    out
}

struct Refusal {
    status: Option<i32>,
    stdout: String,
    stderr: String,
}

impl From<Output> for Refusal {
    fn from(o: Output) -> Refusal {
        Refusal {
            status: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

/// Checks one refused run: exit 2, the file and the words in the message, no probe
/// directory and nothing else new in the probe directory's parent.
fn assert_refused(what: &str, r: &Refusal, file: &str, words: &[&str]) {
    assert_eq!(
        r.status,
        Some(2),
        "{what}: expected exit status 2\nstdout:\n{}\nstderr:\n{}",
        r.stdout,
        r.stderr
    );
    assert!(
        r.stderr.contains(file),
        "{what}: the message does not name {file}:\n{}",
        r.stderr
    );
    // Messages speak of the file's keys, not of the agent's Rust types.
    assert!(
        !r.stderr.contains("Raw") && !r.stderr.contains("i64"),
        "{what}: the message names internal types:\n{}",
        r.stderr
    );
    for w in words {
        assert!(
            r.stderr.contains(w),
            "{what}: the message lacks {w:?}:\n{}",
            r.stderr
        );
    }
}

#[test]
fn broken_files_are_refused_by_check_config_and_the_agent() {
    assert!(CASES.len() >= 20);
    let tmp = tempfile::tempdir().unwrap();
    // The probe directory the cases name; it exists, so only the config can be wrong.
    let target = tmp.path().join("target");
    std::fs::create_dir(&target).unwrap();
    let target_s = target.to_str().unwrap();
    let before = tree(tmp.path());
    let mut failures = Vec::new();
    for (i, case) in CASES.iter().enumerate() {
        let file = tmp.path().join(format!("case{i:02}.yaml"));
        // Were the case wrongly accepted, the agent would probe TARGET at once and write
        // there. Appended at the end, so the case's own line numbers stay.
        let mut yaml = case.yaml.replace("TARGET", target_s);
        if case.yaml.contains("- path: TARGET")
            && !case.yaml.contains("defaults:")
            && !case.yaml.contains("require_mountpoint")
        {
            yaml.push_str("defaults:\n  require_mountpoint: false\n");
        }
        std::fs::write(&file, &yaml).unwrap();
        let file_s = file.to_str().unwrap();
        let checked: Refusal = run(&["check-config".as_ref(), file.as_os_str()]).into();
        let started: Refusal = run(&[
            "--config".as_ref(),
            file.as_os_str(),
            "--web.listen-address".as_ref(),
            "127.0.0.1:0".as_ref(),
        ])
        .into();
        let r = std::panic::catch_unwind(|| {
            assert_refused(
                &format!("check-config, case {:?}", case.name),
                &checked,
                file_s,
                case.words,
            );
            assert_refused(
                &format!("--config, case {:?}", case.name),
                &started,
                file_s,
                case.words,
            );
            assert!(
                !started.stderr.contains("listening on"),
                "case {:?}: the agent started listening:\n{}",
                case.name,
                started.stderr
            );
        });
        if r.is_err() {
            failures.push(case.name);
        }
        std::fs::remove_file(&file).unwrap();
        assert_eq!(
            tree(tmp.path()),
            before,
            "case {:?}: something was written",
            case.name
        );
    }
    assert!(
        failures.is_empty(),
        "cases not refused properly: {failures:?}"
    );
}

#[test]
fn missing_unreadable_and_non_text_files_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope.yaml");
    let dir = tmp.path().join("a-directory.yaml");
    std::fs::create_dir(&dir).unwrap();
    let binary = tmp.path().join("binary.yaml");
    std::fs::write(&binary, b"targets:\n  - path: /srv/\xff\xfe\n").unwrap();
    let before = tree(tmp.path());
    for (file, words) in [
        (&missing, &["cannot read: No such file"][..]),
        (&dir, &["cannot read"][..]),
        (&binary, &[][..]),
    ] {
        let f = file.to_str().unwrap();
        let checked: Refusal = run(&["check-config".as_ref(), file.as_os_str()]).into();
        assert_refused(&format!("check-config {f}"), &checked, f, words);
        let started: Refusal = run(&[
            "--config".as_ref(),
            file.as_os_str(),
            "--web.listen-address".as_ref(),
            "127.0.0.1:0".as_ref(),
        ])
        .into();
        assert_refused(&format!("--config {f}"), &started, f, words);
        // The reason is given once, not once per level of the error chain.
        assert_eq!(
            started.stderr.matches("os error").count(),
            checked.stderr.matches("os error").count().min(1),
            "{}",
            started.stderr
        );
    }
    assert_eq!(tree(tmp.path()), before);
}

#[test]
fn bad_listen_address_flag_is_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("target");
    std::fs::create_dir(&target).unwrap();
    let file = tmp.path().join("ok.yaml");
    std::fs::write(
        &file,
        format!(
            "targets:\n  - path: {}\n    require_mountpoint: false\n    interval: 100ms\n",
            target.display()
        ),
    )
    .unwrap();
    // The file itself is valid.
    let ok = run(&["check-config".as_ref(), file.as_os_str()]);
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let before = tree(tmp.path());
    for bad in [
        "nowhere",
        "127.0.0.1",
        "127.0.0.1:99999",
        ":19858x",
        "",
        "localhost:0",
    ] {
        let r: Refusal = run(&[
            "--config".as_ref(),
            file.as_os_str(),
            "--web.listen-address".as_ref(),
            bad.as_ref(),
        ])
        .into();
        assert_refused(
            &format!("--web.listen-address {bad:?}"),
            &r,
            "--web.listen-address",
            &[],
        );
        assert!(
            r.stderr.contains(&format!("{bad:?}")),
            "--web.listen-address {bad:?}: the value is not named:\n{}",
            r.stderr
        );
        assert_eq!(
            tree(tmp.path()),
            before,
            "--web.listen-address {bad:?}: something was written"
        );
    }
}

#[test]
fn port_in_use_fails_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("target");
    std::fs::create_dir(&target).unwrap();
    let file = tmp.path().join("ok.yaml");
    std::fs::write(
        &file,
        format!(
            "targets:\n  - path: {}\n    require_mountpoint: false\n    interval: 100ms\n",
            target.display()
        ),
    )
    .unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let before = tree(tmp.path());
    let r: Refusal = run(&[
        "--config".as_ref(),
        file.as_os_str(),
        "--web.listen-address".as_ref(),
        addr.as_ref(),
    ])
    .into();
    // Not a configuration error: the file is fine, the machine is not.
    assert_eq!(r.status, Some(1), "stderr:\n{}", r.stderr);
    assert!(r.stderr.contains(&addr), "stderr:\n{}", r.stderr);
    assert_eq!(tree(tmp.path()), before);
}
