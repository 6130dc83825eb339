//! `stallwatch probe PATH`: the agent's probes in the foreground, like ioping or
//! fsync-tester, with a live notice while a call is blocked and a summary per operation.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use crate::config::{self, Mode, SyncKind};
use crate::probe::ops::{self, Failure, Latencies, Observer, Op};
use crate::probe::InflightSlot;

/// Arguments of `stallwatch probe`.
#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// Directory to probe (files go to PATH/.stallwatch and are removed at the end).
    pub path: PathBuf,
    /// Probe mode, repeatable: create, overwrite, direct, replace [default: create, overwrite].
    #[arg(long = "mode", value_name = "M", value_parser = clap::value_parser!(Mode))]
    pub modes: Vec<Mode>,
    /// Number of cycles.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub count: u64,
    /// Time between the starts of two cycles.
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Flush call of the overwrite probe: fsync or fdatasync.
    #[arg(long, default_value = "fsync", value_parser = clap::value_parser!(SyncKind))]
    pub sync: SyncKind,
    /// Bytes written by the overwrite, direct and replace probes (4096, 4KiB, 1MiB).
    #[arg(long, default_value = "4KiB", value_parser = config::parse_size)]
    pub size: u64,
    /// Print JSON (all times in seconds) instead of text.
    #[arg(long)]
    pub json: bool,
}

impl clap::builder::ValueParserFactory for Mode {
    type Parser = fn(&str) -> Result<Mode, String>;
    fn value_parser() -> Self::Parser {
        |s| s.parse()
    }
}

impl clap::builder::ValueParserFactory for SyncKind {
    type Parser = fn(&str) -> Result<SyncKind, String>;
    fn value_parser() -> Self::Parser {
        |s| s.parse()
    }
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    // Zero is allowed here: back-to-back cycles, as ioping -i 0.
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    config::parse_duration(s)
}

/// Latency statistics of one operation, in seconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    pub count: usize,
    pub min: f64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Summarises samples; None when there are none.
pub fn summarize(samples: &[f64]) -> Option<Summary> {
    if samples.is_empty() {
        return None;
    }
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    Some(Summary {
        count: s.len(),
        min: s[0],
        mean: s.iter().sum::<f64>() / s.len() as f64,
        p50: percentile(&s, 50.0),
        p90: percentile(&s, 90.0),
        p99: percentile(&s, 99.0),
        max: s[s.len() - 1],
    })
}

/// A human latency: `85.2 us`, `1.23 ms`, `2.50 s`.
pub fn human(secs: f64) -> String {
    if secs < 1e-3 {
        format!("{:.1} us", secs * 1e6)
    } else if secs < 1.0 {
        format!("{:.2} ms", secs * 1e3)
    } else {
        format!("{secs:.2} s")
    }
}

/// The key of an op in output: its name, or `mode.op` when two selected modes share it.
fn keys(modes: &[Mode], sync: SyncKind) -> Vec<(Mode, Op, String)> {
    let all: Vec<(Mode, Op)> = modes
        .iter()
        .flat_map(|&m| ops::ops_of(m, sync).iter().map(move |&o| (m, o)))
        .collect();
    all.iter()
        .map(|&(m, o)| {
            let shared = all.iter().filter(|(_, x)| *x == o).count() > 1;
            let key = if shared {
                format!("{m}.{o}")
            } else {
                o.to_string()
            };
            (m, o, key)
        })
        .collect()
}

struct Live {
    slot: InflightSlot,
}

impl Observer for Live {
    fn begin(&self, mode: Mode, op: Op) {
        self.slot.begin(mode, op);
    }
    fn end(&self, _: Mode, _: Op, _: Duration, _: Option<Failure>) {
        self.slot.end();
    }
}

enum Msg {
    Cycle(u64, Vec<(Mode, Latencies)>, Vec<ops::OpError>),
    Done,
    Fatal(String),
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: nix::libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Runs the probe command; exit 0 when every cycle succeeded, 1 when any failed.
pub fn run(args: ProbeArgs) -> ExitCode {
    let modes = if args.modes.is_empty() {
        vec![Mode::Create, Mode::Overwrite]
    } else {
        args.modes.clone()
    };
    let mut seen = Vec::new();
    for m in &modes {
        if seen.contains(m) {
            eprintln!("Error: --mode {m} given twice");
            return ExitCode::from(2);
        }
        seen.push(*m);
    }
    if args.size > 64 << 20 {
        eprintln!("Error: --size {} is larger than 64 MiB", args.size);
        return ExitCode::from(2);
    }
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        let _ = nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGINT,
            nix::sys::signal::SigHandler::Handler(on_sigint),
        );
    }
    let live = Arc::new(Live {
        slot: InflightSlot::default(),
    });
    let (tx, rx) = mpsc::channel();
    let worker = {
        let live = Arc::clone(&live);
        let (path, modes) = (args.path.clone(), modes.clone());
        let (count, interval, size, sync) = (args.count, args.interval, args.size, args.sync);
        std::thread::spawn(move || {
            let dir = match ops::open_probe_dir(&path, None) {
                Ok(d) => d,
                Err(e) => {
                    let _ = tx.send(Msg::Fatal(e.to_string()));
                    return;
                }
            };
            dir.remove_own_files();
            let start = Instant::now();
            for seq in 1..=count {
                if INTERRUPTED.load(Ordering::SeqCst) {
                    break;
                }
                let spec = ops::CycleSpec { size, sync, seq };
                let mut lats = Vec::new();
                let mut errs = Vec::new();
                for &m in &modes {
                    match ops::run_mode(m, &dir, &spec, &*live) {
                        Ok(l) => lats.push((m, l)),
                        Err(e) => errs.push(e),
                    }
                }
                let _ = tx.send(Msg::Cycle(seq, lats, errs));
                if seq < count {
                    let due = start + interval * seq as u32;
                    while Instant::now() < due && !INTERRUPTED.load(Ordering::SeqCst) {
                        std::thread::sleep((due - Instant::now()).min(Duration::from_millis(50)));
                    }
                }
            }
            dir.remove_all(&path);
            let _ = tx.send(Msg::Done);
        })
    };

    let keys = keys(&modes, args.sync);
    let mut samples: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut cycles: Vec<BTreeMap<String, serde_json::Value>> = Vec::new();
    let mut failed = false;
    let mut next_notice = Duration::from_secs(1);
    let mut interrupted_blocked = false;
    if !args.json {
        let names: Vec<&str> = modes.iter().map(|m| m.as_str()).collect();
        println!(
            "probing {} ({}, {} bytes, {}), {} cycles every {:?}",
            args.path.display(),
            names.join(", "),
            args.size,
            args.sync.as_str(),
            args.count,
            args.interval
        );
    }
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Msg::Cycle(seq, lats, errs)) => {
                next_notice = Duration::from_secs(1);
                let mut row = BTreeMap::new();
                let mut line = format!("cycle {seq}:");
                for (m, l) in &lats {
                    for (op, d) in l {
                        let key = key_of(&keys, *m, *op);
                        samples
                            .entry(key.clone())
                            .or_default()
                            .push(d.as_secs_f64());
                        row.insert(key.clone(), serde_json::json!(d.as_secs_f64()));
                        line.push_str(&format!("  {key} {}", human(d.as_secs_f64())));
                    }
                }
                if !errs.is_empty() {
                    failed = true;
                    let e: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
                    row.insert("error".into(), serde_json::json!(e.join("; ")));
                    line.push_str(&format!("  FAILED: {}", e.join("; ")));
                }
                if !args.json {
                    println!("{line}");
                }
                cycles.push(row);
            }
            Ok(Msg::Done) => break,
            Ok(Msg::Fatal(e)) => {
                eprintln!("Error: {e}");
                return ExitCode::from(1);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let cur = live.slot.current();
                if let Some(c) = cur {
                    if c.age >= next_notice {
                        eprintln!("{} still blocked after {:.1} s", c.op, c.age.as_secs_f64());
                        next_notice = c.age + Duration::from_secs(2);
                    }
                }
                if INTERRUPTED.load(Ordering::SeqCst) && cur.is_some() {
                    // The call cannot be interrupted; report what we have and leave.
                    interrupted_blocked = true;
                    break;
                }
            }
        }
    }
    let summary: BTreeMap<String, Summary> = samples
        .iter()
        .filter_map(|(k, v)| summarize(v).map(|s| (k.clone(), s)))
        .collect();
    if args.json {
        let out = serde_json::json!({"summary": summary, "cycles": cycles});
        println!("{out}");
    } else {
        if INTERRUPTED.load(Ordering::SeqCst) {
            println!("interrupted after {} cycles", cycles.len());
        }
        println!(
            "\n{:<18} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "op", "count", "min", "mean", "p50", "p90", "p99", "max"
        );
        for (_, _, k) in &keys {
            if let Some(s) = summary.get(k) {
                println!(
                    "{:<18} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
                    k,
                    s.count,
                    human(s.min),
                    human(s.mean),
                    human(s.p50),
                    human(s.p90),
                    human(s.p99),
                    human(s.max)
                );
            }
        }
    }
    let _ = std::io::stdout().flush();
    if interrupted_blocked {
        // Leave without joining: the worker is blocked in the kernel.
        return ExitCode::from(1);
    }
    let _ = worker.join();
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn key_of(keys: &[(Mode, Op, String)], m: Mode, o: Op) -> String {
    keys.iter()
        .find(|(km, ko, _)| *km == m && *ko == o)
        .map(|(_, _, k)| k.clone())
        .unwrap_or_else(|| o.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_percentiles() {
        let v: Vec<f64> = (1..=100).map(|x| x as f64).collect();
        let s = summarize(&v).unwrap();
        assert_eq!((s.count, s.min, s.max), (100, 1.0, 100.0));
        assert_eq!((s.p50, s.p90, s.p99), (50.0, 90.0, 99.0));
        assert_eq!(s.mean, 50.5);
        assert!(summarize(&[]).is_none());
        let one = summarize(&[0.5]).unwrap();
        assert_eq!((one.p50, one.p99), (0.5, 0.5));
    }

    #[test]
    fn keys_disambiguate_shared_ops() {
        let k = keys(&[Mode::Overwrite], SyncKind::Fdatasync);
        assert_eq!(
            k.iter().map(|x| x.2.as_str()).collect::<Vec<_>>(),
            ["write", "fdatasync"]
        );
        let k = keys(&[Mode::Overwrite, Mode::Create], SyncKind::Fsync);
        assert_eq!(
            k.iter().map(|x| x.2.as_str()).collect::<Vec<_>>(),
            ["write", "fsync", "create", "close", "unlink"]
        );
        let k = keys(&[Mode::Overwrite, Mode::Replace], SyncKind::Fsync);
        assert!(k.iter().any(|x| x.2 == "overwrite.write"));
        assert!(k.iter().any(|x| x.2 == "replace.write"));
        assert!(k.iter().any(|x| x.2 == "rename"));
    }

    #[test]
    fn human_units() {
        assert_eq!(human(0.0000852), "85.2 us");
        assert_eq!(human(0.00123), "1.23 ms");
        assert_eq!(human(2.5), "2.50 s");
    }
}
