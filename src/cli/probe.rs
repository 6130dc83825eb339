//! `stallwatch probe PATH`: the agent's probes in the foreground, like ioping or
//! fsync-tester, with a live notice while a call is blocked and a summary per operation.
//!
//! The system calls run on a worker thread; the main thread only prints. That split is
//! what lets it report a call stuck in the kernel (an fsfreeze, a hung device) while it
//! is stuck, and print the summary on Ctrl-C even then.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use crate::base::labels::{Failure, Mode, Op, SyncKind, UnknownName};
use crate::config;
use crate::probe::ops::{self, Latencies, Observer, PROBE_DIR};

/// Exit status when any cycle failed (or the probe directory could not be set up).
const EXIT_FAILED: u8 = 1;
/// Exit status for bad arguments, as clap uses for its own parse errors.
const EXIT_USAGE: u8 = 2;
/// Largest `--size`: a diagnosis probe, not a throughput benchmark.
const MAX_SIZE: u64 = 64 << 20;
/// A call blocked this long gets its first live notice ...
const NOTICE_FIRST: Duration = Duration::from_secs(1);
/// ... and another one this often while it stays blocked.
const NOTICE_EVERY: Duration = Duration::from_secs(2);

/// Arguments of `stallwatch probe`.
#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// Directory to probe (files go to PATH/.stallwatch and are removed at the end).
    pub path: PathBuf,
    /// Probe mode, repeatable: create, overwrite, direct, replace, append [default: create, overwrite].
    #[arg(long = "mode", value_name = "M", value_parser = clap::value_parser!(Mode))]
    pub modes: Vec<Mode>,
    /// Number of cycles.
    #[arg(long, default_value_t = 10, value_parser = parse_count)]
    pub count: u64,
    /// Time between the starts of two cycles (0: back to back).
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Flush call of the overwrite probe: fsync or fdatasync.
    #[arg(long, default_value = "fsync", value_parser = clap::value_parser!(SyncKind))]
    pub sync: SyncKind,
    /// Bytes written by the overwrite, direct, replace and append probes (4096, 4KiB, 1MiB; at most 64MiB).
    #[arg(long, default_value = "4KiB", value_parser = parse_probe_size)]
    pub size: u64,
    /// Print JSON (all times in seconds) instead of text; notices and errors go to stderr.
    #[arg(long)]
    pub json: bool,
}

/// A command-line value `stallwatch probe` refuses (clap prints it after the flag).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    #[error("must be at least 1")]
    ZeroCount,
    #[error("{0:?} is not a whole number of cycles")]
    Count(String),
    #[error("{0:?} is larger than 64MiB")]
    SizeTooLarge(String),
    #[error(transparent)]
    Value(#[from] config::ValueError),
}

impl clap::builder::ValueParserFactory for Mode {
    type Parser = fn(&str) -> Result<Mode, UnknownName>;
    fn value_parser() -> Self::Parser {
        |s| s.parse()
    }
}

impl clap::builder::ValueParserFactory for SyncKind {
    type Parser = fn(&str) -> Result<SyncKind, UnknownName>;
    fn value_parser() -> Self::Parser {
        |s| s.parse()
    }
}

fn parse_interval(s: &str) -> Result<Duration, config::ValueError> {
    // Zero is allowed here (back-to-back cycles, as ioping -i 0), unlike in the config.
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    match humantime::parse_duration(s.trim()) {
        Ok(d) => Ok(d),
        Err(_) => config::parse_duration(s),
    }
}

fn parse_count(s: &str) -> Result<u64, Error> {
    match s.trim().parse::<u64>() {
        Ok(0) => Err(Error::ZeroCount),
        Ok(n) => Ok(n),
        Err(_) => Err(Error::Count(s.to_owned())),
    }
}

fn parse_probe_size(s: &str) -> Result<u64, Error> {
    let n = config::parse_size(s)?;
    if n > MAX_SIZE {
        return Err(Error::SizeTooLarge(s.to_owned()));
    }
    Ok(n)
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
        .flat_map(|&m| {
            crate::base::labels::ops_of(m, sync)
                .iter()
                .map(move |&o| (m, o))
        })
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

fn key_of(keys: &[(Mode, Op, String)], m: Mode, o: Op) -> String {
    if o == Op::Prepare {
        return format!("{m} set-up");
    }
    keys.iter()
        .find(|(km, ko, _)| *km == m && *ko == o)
        .map(|(_, _, k)| k.clone())
        .unwrap_or_else(|| o.to_string())
}

/// What the worker is blocked in right now.
#[derive(Debug, Clone)]
struct Busy {
    /// Distinguishes two calls with the same name, so each gets its own notices.
    id: u64,
    cycle: u64,
    what: String,
    since: Instant,
}

/// The worker's current call, shared with the printing thread. Also the [`Observer`]
/// of the timed calls; the untimed set-up and clean-up are entered by hand.
struct Live {
    keys: Vec<(Mode, Op, String)>,
    cycle: AtomicU64,
    next_id: AtomicU64,
    current: Mutex<Option<Busy>>,
}

impl Live {
    fn enter(&self, what: String) {
        let busy = Busy {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            cycle: self.cycle.load(Ordering::Relaxed),
            what,
            since: Instant::now(),
        };
        *self.lock() = Some(busy);
    }

    fn leave(&self) {
        *self.lock() = None;
    }

    fn current(&self) -> Option<Busy> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Busy>> {
        // The guarded value is replaced whole, so a poisoned lock still holds a valid one.
        crate::base::sync::lock(&self.current)
    }
}

impl Observer for Live {
    fn begin(&self, mode: Mode, op: Op, _: Instant) {
        self.enter(key_of(&self.keys, mode, op));
    }
    fn end(&self, _: Mode, _: Op, _: Duration, _: Option<Failure>, _: Instant) {
        self.leave();
    }
}

enum Msg {
    Cycle(u64, Vec<(Mode, Latencies)>, Vec<ops::OpError>),
    /// All cycles ran (or Ctrl-C); `left_behind`: PATH/.stallwatch could not be removed.
    Done {
        left_behind: bool,
    },
    Fatal(String),
}

/// Set by the first Ctrl-C.
static INTERRUPTED: LazyLock<Arc<AtomicBool>> = LazyLock::new(Arc::default);

/// First Ctrl-C: finish the current cycle, clean up, print the summary. A second Ctrl-C
/// (the flag already set) kills the process the ordinary way.
fn install_sigint() {
    use signal_hook::consts::SIGINT;
    use signal_hook::flag;
    let flag = &*INTERRUPTED;
    // Registered first, so it sees the flag before the second handler sets it.
    let installed = flag::register_conditional_default(SIGINT, Arc::clone(flag))
        .and_then(|_| flag::register(SIGINT, Arc::clone(flag)));
    if let Err(e) = installed {
        eprintln!("warning: cannot catch Ctrl-C ({e}); it will end the probe without a summary");
    }
}

fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// What the worker needs to run the cycles.
struct Job {
    path: PathBuf,
    modes: Vec<Mode>,
    count: u64,
    interval: Duration,
    size: u64,
    sync: SyncKind,
}

fn work(job: Job, live: &Live, tx: &mpsc::Sender<Msg>) {
    let probe_dir = job.path.join(PROBE_DIR);
    // mkdir blocks on a frozen filesystem like any write: show it as a blocked call.
    live.enter(format!("set-up of {}", probe_dir.display()));
    let dir = ops::open_probe_dir(&job.path, None);
    if let Ok(d) = &dir {
        d.remove_own_files();
    }
    live.leave();
    let dir = match dir {
        Ok(d) => d,
        Err(e) => {
            let _ = tx.send(Msg::Fatal(e.to_string()));
            return;
        }
    };
    let mut due = Instant::now();
    for seq in 1..=job.count {
        if interrupted() {
            break;
        }
        live.cycle.store(seq, Ordering::Relaxed);
        let spec = ops::CycleSpec {
            size: job.size,
            sync: job.sync,
            rotate_size: config::defaults::ROTATE_SIZE,
            seq,
        };
        let mut lats = Vec::new();
        let mut errs = Vec::new();
        for &m in &job.modes {
            match ops::run_mode(m, &dir, &spec, live) {
                Ok(l) => lats.push((m, l)),
                Err(e) => errs.push(e),
            }
        }
        let _ = tx.send(Msg::Cycle(seq, lats, errs));
        if seq == job.count {
            break;
        }
        // Fixed start times; a cycle that overran its interval is followed at once.
        let now = Instant::now();
        due = due.checked_add(job.interval).unwrap_or(now).max(now);
        while !interrupted() {
            let now = Instant::now();
            if now >= due {
                break;
            }
            std::thread::sleep((due - now).min(Duration::from_millis(50)));
        }
    }
    live.enter(format!("clean-up of {}", probe_dir.display()));
    dir.remove_all(&job.path);
    live.leave();
    let left_behind = probe_dir.symlink_metadata().is_ok();
    let _ = tx.send(Msg::Done { left_behind });
}

/// True when `path` is on tmpfs, whose O_DIRECT (Linux 6.6+) is a memory copy.
fn is_tmpfs(path: &Path) -> bool {
    rustix::fs::statfs(path).is_ok_and(|s| s.f_type == libc::TMPFS_MAGIC)
}

/// Everything printed at the end.
#[derive(Default)]
struct Report {
    samples: BTreeMap<String, Vec<f64>>,
    cycles: Vec<BTreeMap<String, f64>>,
    failed_cycles: u64,
}

/// Runs the probe command: exit 0 when every cycle succeeded, 1 when any failed, 2 on
/// bad arguments.
pub fn run(args: ProbeArgs) -> ExitCode {
    let modes = if args.modes.is_empty() {
        vec![Mode::Create, Mode::Overwrite]
    } else {
        args.modes.clone()
    };
    for (i, m) in modes.iter().enumerate() {
        if modes[..i].contains(m) {
            eprintln!("Error: --mode {m} given twice");
            return ExitCode::from(EXIT_USAGE);
        }
    }
    // A missing PATH is a typo, not a failing filesystem; anything else (EIO, EACCES on
    // the probe directory, EROFS) is reported as a failed probe below.
    match std::fs::metadata(&args.path) {
        Ok(m) if !m.is_dir() => {
            eprintln!("Error: {} is not a directory", args.path.display());
            return ExitCode::from(EXIT_USAGE);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("Error: {}: {e}", args.path.display());
            return ExitCode::from(EXIT_USAGE);
        }
        _ => {}
    }
    if modes.contains(&Mode::Direct) && is_tmpfs(&args.path) {
        eprintln!(
            "note: {} is tmpfs, which accepts O_DIRECT (Linux 6.6+) but keeps the data in \
             memory: the direct probe times a memory copy, not a device",
            args.path.display()
        );
    }
    install_sigint();

    let keys = keys(&modes, args.sync);
    let live = Arc::new(Live {
        keys: keys.clone(),
        cycle: AtomicU64::new(0),
        next_id: AtomicU64::new(0),
        current: Mutex::new(None),
    });
    let (tx, rx) = mpsc::channel();
    let worker = {
        let live = Arc::clone(&live);
        let job = Job {
            path: args.path.clone(),
            modes: modes.clone(),
            count: args.count,
            interval: args.interval,
            size: args.size,
            sync: args.sync,
        };
        std::thread::spawn(move || work(job, &live, &tx))
    };

    if !args.json {
        let names: Vec<&str> = modes.iter().map(|m| m.as_str()).collect();
        // --sync only changes the overwrite probe; replace always uses fsync.
        let sync = if modes.contains(&Mode::Overwrite) {
            format!("; {}", args.sync.as_str())
        } else {
            String::new()
        };
        println!(
            "probing {} ({}; {} bytes{sync}), {} cycles every {}",
            args.path.display(),
            names.join(", "),
            args.size,
            args.count,
            humantime::format_duration(args.interval)
        );
    }

    let mut report = Report::default();
    let mut notice: Option<(u64, Duration)> = None;
    let mut blocked: Option<Busy> = None;
    let mut left_behind = false;
    'report: loop {
        // Woken by a 100 ms tick, not by each cycle's message: a thread woken as every
        // cycle ends takes a CPU just when the next cycle's calls need the kernel's
        // workers (the loop device's, the filesystem's log), and the probe times itself
        // against its own reporting (docs/benchmarks/2026-12-02-runs-11-19.md, runs 14 and 15: back to back on a
        // 2-CPU VM, XFS, fdatasync p50 1.22 -> 1.09 times an in-process loop's).
        std::thread::sleep(Duration::from_millis(100));
        loop {
            match rx.try_recv() {
                Ok(Msg::Cycle(seq, lats, errs)) => {
                    record(&args, &keys, &mut report, seq, lats, errs)
                }
                Ok(Msg::Done { left_behind: l }) => {
                    left_behind = l;
                    break 'report;
                }
                Ok(Msg::Fatal(e)) => {
                    eprintln!("Error: {e}");
                    return ExitCode::from(EXIT_FAILED);
                }
                Err(mpsc::TryRecvError::Disconnected) => break 'report,
                Err(mpsc::TryRecvError::Empty) => break,
            }
        }
        let Some(busy) = live.current() else {
            continue;
        };
        let age = busy.since.elapsed();
        let next = match notice {
            Some((id, next)) if id == busy.id => next,
            _ => NOTICE_FIRST,
        };
        notice = Some((busy.id, next));
        if age >= next {
            let cycle = if busy.cycle > 0 {
                format!("cycle {}: ", busy.cycle)
            } else {
                String::new()
            };
            eprintln!(
                "{cycle}{} still blocked after {:.1} s",
                busy.what,
                age.as_secs_f64()
            );
            notice = Some((busy.id, age + NOTICE_EVERY));
        }
        // A call blocked in the kernel cannot be interrupted: report what we have now
        // rather than wait for it. A merely running call is let finish (milliseconds).
        if interrupted() && age >= NOTICE_FIRST {
            blocked = Some(busy);
            break;
        }
    }

    print_report(&args, &keys, &report);
    if let Some(b) = &blocked {
        eprintln!(
            "interrupted: {} has been blocked in the kernel for {:.1} s and cannot be \
             interrupted; the process ends when the call returns, and {} is left behind",
            b.what,
            b.since.elapsed().as_secs_f64(),
            args.path.join(PROBE_DIR).display()
        );
        // Leave without joining: the worker is blocked in the kernel.
        return ExitCode::from(EXIT_FAILED);
    }
    if left_behind {
        eprintln!(
            "note: could not remove {} (read-only now, or it holds files that are not \
             stallwatch's)",
            args.path.join(PROBE_DIR).display()
        );
    }
    let _ = worker.join();
    if report.failed_cycles > 0 {
        ExitCode::from(EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

/// Takes in one cycle: its latencies for the summary, its line (text) or its errors
/// (JSON, on stderr: the `cycles` objects hold op latencies only).
fn record(
    args: &ProbeArgs,
    keys: &[(Mode, Op, String)],
    report: &mut Report,
    seq: u64,
    lats: Vec<(Mode, Latencies)>,
    errs: Vec<ops::OpError>,
) {
    let mut row = BTreeMap::new();
    let mut line = format!("cycle {seq}:");
    for (m, l) in &lats {
        for (op, d) in l {
            let key = key_of(keys, *m, *op);
            let secs = d.as_secs_f64();
            report.samples.entry(key.clone()).or_default().push(secs);
            line.push_str(&format!("  {key} {}", human(secs)));
            row.insert(key, secs);
        }
    }
    if !errs.is_empty() {
        report.failed_cycles += 1;
        let e: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        if args.json {
            eprintln!("cycle {seq}: FAILED: {}", e.join("; "));
        } else {
            line.push_str(&format!("  FAILED: {}", e.join("; ")));
        }
    }
    if !args.json {
        println!("{line}");
    }
    report.cycles.push(row);
}

fn print_report(args: &ProbeArgs, keys: &[(Mode, Op, String)], report: &Report) {
    let summary: BTreeMap<&String, Summary> = report
        .samples
        .iter()
        .filter_map(|(k, v)| summarize(v).map(|s| (k, s)))
        .collect();
    let n = report.cycles.len();
    if args.json {
        let out = serde_json::json!({"summary": summary, "cycles": report.cycles});
        println!("{out}");
        if interrupted() {
            eprintln!("interrupted after {n} cycles");
        }
        if report.failed_cycles > 0 {
            eprintln!("{} of {n} cycles failed", report.failed_cycles);
        }
    } else {
        if interrupted() {
            println!("interrupted after {n} cycles");
        }
        println!(
            "\n{:<18} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "op", "count", "min", "mean", "p50", "p90", "p99", "max"
        );
        for (_, _, k) in keys {
            match summary.get(k) {
                Some(s) => println!(
                    "{:<18} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
                    k,
                    s.count,
                    human(s.min),
                    human(s.mean),
                    human(s.p50),
                    human(s.p90),
                    human(s.p99),
                    human(s.max)
                ),
                // An op that never completed still gets its row: count 0 says so.
                None => println!(
                    "{:<18} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
                    k, 0, "-", "-", "-", "-", "-", "-"
                ),
            }
        }
        if report.failed_cycles > 0 {
            println!("\n{} of {n} cycles failed", report.failed_cycles);
        }
    }
    let _ = std::io::stdout().flush();
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
        assert_eq!(key_of(&k, Mode::Overwrite, Op::Prepare), "overwrite set-up");
    }

    #[test]
    fn human_units() {
        assert_eq!(human(0.0000852), "85.2 us");
        assert_eq!(human(0.00123), "1.23 ms");
        assert_eq!(human(2.5), "2.50 s");
    }

    #[test]
    fn interval_and_size_arguments() {
        assert_eq!(parse_interval("0"), Ok(Duration::ZERO));
        assert_eq!(parse_interval("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_interval("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_interval("soon").is_err());
        assert!(parse_interval("-1s").is_err());
        assert_eq!(parse_count("3"), Ok(3));
        assert!(parse_count("0").is_err());
        assert!(parse_count("-1").is_err());
        assert!(parse_count("many").is_err());
        assert_eq!(parse_probe_size("4KiB"), Ok(4096));
        assert_eq!(parse_probe_size("64MiB"), Ok(64 << 20));
        assert!(parse_probe_size("65MiB")
            .unwrap_err()
            .to_string()
            .contains("64MiB"));
        assert!(parse_probe_size("0").is_err());
        assert!(parse_probe_size("4 bananas").is_err());
    }
}
