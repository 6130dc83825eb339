//! Bounded fuzzing of everything that parses outside input: the configuration loader
//! and the /proc and /sys parsers. Each must return an error for bad input, never panic.
//!
//! A short pass runs with the ordinary test command (a fixed number of cases per parser,
//! a few seconds in all); `PROPTEST_CASES=100000 cargo test --test it fuzz::` runs a
//! long one.

use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::{Config as PtConfig, FileFailurePersistence};

use stallwatch::config::Config;
use stallwatch::kernel::blockdev;
use stallwatch::kernel::mounts;
use stallwatch::kernel::vm;

/// Cases per property unless `PROPTEST_CASES` says otherwise.
const CASES: u32 = 2000;

fn config() -> PtConfig {
    PtConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(CASES),
        // Failures are reported in the test output; no files written into the tree.
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        max_shrink_iters: 2000,
        ..PtConfig::default()
    }
}

fn fixture(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A valid configuration that uses every key, the seed for mutations.
const VALID_YAML: &str = r#"listen_address: "127.0.0.1:19858"
telemetry_path: /metrics
vm_interval: 1s
stall_threshold: 1s
stall_log_size: 256
defaults:
  interval: 10s
  modes: [create, overwrite]
  size: 4KiB
  sync: fsync
  require_mountpoint: true
targets:
  - path: /srv/raid0
    name: raid0
  - path: /var/lib/postgresql
    modes: [overwrite, direct, replace]
    interval: 5s
    size: 8192
    sync: fdatasync
    stall_threshold: 500ms
"#;

/// Pieces that are likely to matter to a YAML or config parser.
#[rustfmt::skip]
const TOKENS: &[&str] = &[
    ":", "- ", "[", "]", "{", "}", "\"", "'", "\n", "  ", "\t", "#", "&a", "*a", "!!str", "|",
    ">", "~", "null", "0", "-1", "1e309", "18446744073709551616", "0s", "-5s", "0ms", "1ns",
    "9999999999999999999s", "4 parsecs", "0KiB", "99999999999GiB", "/", "..", "relative",
    "modes", "path", "name", "interval", "size", "sync", "targets", "defaults", "fsync",
    "create", "direct", "<<", "? ", "%YAML 1.2\n", "---\n", "...\n", "\u{feff}", "\u{0}",
    "é", "[::1]:0", "256.0.0.1:1",
];

/// Mutates `base` by inserting, deleting and replacing at byte positions (kept on char
/// boundaries), with tokens or arbitrary text.
fn mutated(base: &'static str) -> impl Strategy<Value = String> {
    let edit = (
        0usize..3,
        any::<prop::sample::Index>(),
        0usize..24,
        prop_oneof![
            prop::sample::select(TOKENS).prop_map(str::to_owned),
            ".{0,8}",
        ],
    );
    prop::collection::vec(edit, 1..6).prop_map(move |edits| {
        let mut s = base.to_owned();
        for (kind, at, len, text) in edits {
            let mut i = at.index(s.len() + 1);
            while !s.is_char_boundary(i) {
                i -= 1;
            }
            let mut j = (i + len).min(s.len());
            while !s.is_char_boundary(j) {
                j -= 1;
            }
            match kind {
                0 => s.insert_str(i, &text),
                1 => s.replace_range(i..j, ""),
                _ => s.replace_range(i..j, &text),
            }
        }
        s
    })
}

/// Lines of `base`, some dropped, duplicated, swapped or with fields cut.
fn line_mutated(base: String) -> impl Strategy<Value = String> {
    let lines: Vec<String> = base.lines().map(str::to_owned).collect();
    let n = lines.len().max(1);
    prop::collection::vec((0usize..5, 0..n, 0..n, prop::sample::select(TOKENS)), 0..8).prop_map(
        move |edits| {
            let mut v = lines.clone();
            for (kind, a, b, tok) in edits {
                if v.is_empty() {
                    v.push(tok.to_owned());
                    continue;
                }
                let (a, b) = (a % v.len(), b % v.len());
                match kind {
                    0 => {
                        v.remove(a);
                    }
                    1 => {
                        let l = v[a].clone();
                        v.insert(b, l);
                    }
                    2 => v.swap(a, b),
                    3 => {
                        // Cut the line after a random field.
                        let f: Vec<&str> = v[a].split(' ').collect();
                        v[a] = f[..b % f.len().max(1)].join(" ");
                    }
                    _ => {
                        let mut f: Vec<String> = v[a].split(' ').map(str::to_owned).collect();
                        let k = b % f.len();
                        f[k] = tok.to_owned();
                        v[a] = f.join(" ");
                    }
                }
            }
            let mut s = v.join("\n");
            s.push('\n');
            s
        },
    )
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn config_loader_never_panics_on_text(text in ".{0,300}") {
        let _ = Config::parse(&text, Path::new("fuzz.yaml"));
    }

    #[test]
    fn config_loader_never_panics_on_mutated_yaml(text in mutated(VALID_YAML)) {
        // Every refusal names the file.
        if let Err(e) = Config::parse(&text, Path::new("fuzz.yaml")) {
            prop_assert!(e.to_string().starts_with("fuzz.yaml: "), "{e}");
        }
    }

    #[test]
    fn config_loader_never_panics_on_reordered_yaml(text in line_mutated(VALID_YAML.to_owned())) {
        if let Err(e) = Config::parse(&text, Path::new("fuzz.yaml")) {
            prop_assert!(e.to_string().starts_with("fuzz.yaml: "), "{e}");
        }
    }

    #[test]
    fn mountinfo_never_panics(text in prop_oneof![
        ".{0,400}",
        line_mutated(fixture("proc/mountinfo")),
    ]) {
        let _ = mounts::parse_mountinfo(&text, Path::new("mountinfo"));
    }

    #[test]
    fn vmstat_never_panics(text in prop_oneof![
        ".{0,400}",
        line_mutated(fixture("proc/vmstat")),
    ], page in prop_oneof![Just(4096u64), any::<u64>()]) {
        let _ = vm::parse_vmstat(&text, page);
    }

    #[test]
    fn pressure_never_panics(text in prop_oneof![
        ".{0,200}",
        line_mutated(fixture("proc/pressure/io")),
        mutated("some avg10=0.00 avg60=0.20 avg300=0.50 total=3919731\nfull avg10=0.00 avg60=0.14 avg300=0.43 total=3412354\n"),
    ]) {
        let _ = vm::parse_pressure(&text);
    }

    #[test]
    fn blockdev_parsers_never_panic(text in prop_oneof![
        ".{0,64}",
        "[ 0-9()/a-z\n-]{0,40}",
        mutated("       0        3\n"),
        mutated("12345 / 67890\n"),
        mutated("5 (4)\n"),
        mutated("/var/lib/images/disk 1.img\n"),
    ]) {
        let _ = blockdev::parse_inflight(&text);
        let _ = blockdev::parse_sync_action(&text);
        let _ = blockdev::parse_sync_completed(&text);
        let _ = blockdev::parse_degraded(&text);
        let _ = blockdev::parse_level(&text);
        let _ = blockdev::parse_raid_disks(&text);
        let _ = blockdev::parse_array_state(&text);
        let _ = blockdev::parse_backing_file(&text);
    }
}

/// The seeds themselves are accepted, so the mutations start from valid input.
#[test]
fn seeds_are_valid() {
    Config::parse(VALID_YAML, Path::new("seed.yaml")).unwrap();
    mounts::parse_mountinfo(&fixture("proc/mountinfo"), Path::new("mountinfo")).unwrap();
    vm::parse_vmstat(&fixture("proc/vmstat"), 4096).unwrap();
    vm::parse_pressure(&fixture("proc/pressure/io")).unwrap();
}
