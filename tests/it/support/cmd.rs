//! External commands: found in PATH, run under `timeout`, failures that say what failed.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Default time limit for one external command.
const CMD_TIMEOUT_SECS: u64 = 60;

fn describe(prog: &str, args: &[&str]) -> String {
    std::iter::once(prog)
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The repository (the crate's manifest directory).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// An executable in PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Finds an executable in PATH, or fails with how to install it.
pub fn tool(name: &str, install: &str) -> PathBuf {
    which(name).unwrap_or_else(|| panic!("`{name}` not found: install it ({install})"))
}

/// Runs `timeout -k 5 SECS prog args...`; returns stdout on success, or an error that
/// names the command, its exit status and its stderr.
pub fn run_cmd_timeout(secs: u64, prog: &str, args: &[&str]) -> Result<String, String> {
    let what = describe(prog, args);
    let out = Command::new("timeout")
        .arg("-k")
        .arg("5")
        .arg(secs.to_string())
        .arg(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("`{what}`: cannot start `timeout`: {e}"))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let why = match out.status.code() {
        Some(124) | Some(137) => format!("timed out after {secs}s"),
        _ => format!("failed ({})", out.status),
    };
    Err(format!(
        "`{what}` {why}; stderr: {:?}; stdout: {:?}",
        stderr.trim(),
        stdout.trim()
    ))
}

/// [`run_cmd_timeout`] with the default limit.
pub fn run_cmd(prog: &str, args: &[&str]) -> Result<String, String> {
    run_cmd_timeout(CMD_TIMEOUT_SECS, prog, args)
}

/// [`run_cmd`], panicking with the command's stderr on failure.
pub fn run(prog: &str, args: &[&str]) -> String {
    run_cmd(prog, args).unwrap_or_else(|e| panic!("{e}"))
}

/// `promtool check metrics` on an exposition: it must pass without a warning.
pub fn check_metrics(text: &str) {
    use std::io::Write as _;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is installed by scripts/test (Debian package prometheus)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool failed: {said}");
    assert!(said.trim().is_empty(), "promtool warned: {said}");
}
