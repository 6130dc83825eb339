//! How exact the quantiles are where they are read (issue 21): the fsync latencies of
//! one probe lane under a load that spreads them over two decades, three ways for the
//! same calls: exact, from the kernel's `raw_syscalls` tracepoints on the lane's thread
//! (support/tracefs.rs: nothing the agent computes); `histogram_quantile` in a real
//! Prometheus over the classic buckets (text scrape); and over the native histogram (a
//! second Prometheus with `--enable-feature=native-histograms`, protobuf scrape).
//!
//! The same calls: a lane's calls are observed one after another by its one thread, so
//! the `N` calls a histogram counts at a scrape are the first `N` fsyncs that thread
//! made, in the order the trace shows their exits; tracing starts before the agent.
//!
//! `cargo test --test it precision:: -- --nocapture` prints the table.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::support::agent::Agent;
use crate::support::loopfs::LoopFs;
use crate::support::machine;
use crate::support::prom::Prometheus;
use crate::support::root::require_root;
use crate::support::tracefs::{SyscallTrace, NR_FDATASYNC, NR_FSYNC};
use crate::support::wait::wait_until;
use crate::support::writer::{random_writer, Kick};

const QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];

/// The exact q-quantile of `sorted` as `histogram_quantile` defines its rank: the
/// smallest value with at least `q·n` values at or below it.
fn exact(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// The thread id of the agent's thread named `comm`.
fn thread_id(pid: u32, comm: &str) -> u32 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| {
            let tid = e.ok()?.file_name().to_str()?.parse::<u32>().ok()?;
            let name = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
            (name.trim_end() == comm).then_some(tid)
        })
        .next()
        .unwrap_or_else(|| panic!("no thread {comm} in {pid}"))
}

/// One instant query's first value at Unix time `t`.
fn value_at(prom: &Prometheus, expr: &str, t: f64) -> Option<f64> {
    let (status, body) = prom
        .get(
            "/api/v1/query",
            &[("query", expr), ("time", &format!("{t:.3}"))],
        )
        .ok()?;
    let v: Value = serde_json::from_str(&body).ok()?;
    assert_eq!(v["status"], "success", "{expr}: HTTP {status} {body}");
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

/// What one Prometheus says at its newest scrape of the lane: how many calls it holds,
/// and its quantiles of them.
struct Read {
    calls: usize,
    quantiles: [f64; 3],
}

fn read(prom: &Prometheus, count: &str, quantile: impl Fn(f64) -> String) -> Read {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let calls = value_at(prom, count, t).unwrap_or_else(|| panic!("no {count}")) as usize;
    let quantiles = QUANTILES
        .map(|q| value_at(prom, &quantile(q), t).unwrap_or_else(|| panic!("no {}", quantile(q))));
    Read { calls, quantiles }
}

#[test]
fn native_quantiles_are_within_ten_percent_of_the_kernels_own_timing() {
    if !require_root("native_quantiles_are_within_ten_percent_of_the_kernels_own_timing") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("ext4", 256);
    // Tracing before the agent starts: every fsync of the lane is in the trace.
    let trace = SyscallTrace::start("stallwatch-precision", &[NR_FSYNC, NR_FDATASYNC], 8192);
    let yaml = format!(
        "stall_threshold: 60s\ntargets:\n  - path: {}\n    name: data\n    interval: 100ms\n    modes: [overwrite]\n",
        fs.path().display()
    );
    let agent = Agent::start(&yaml);
    assert!(agent.wait_up("data"), "{}", agent.log_tail(20));
    let lane = thread_id(agent.pid(), "p0-overwrite");
    let tmp = tempfile::tempdir().unwrap();
    let classic_dir = tmp.path().join("classic");
    std::fs::create_dir(&classic_dir).unwrap();
    let classic = Prometheus::builder(&classic_dir, "stallwatch")
        .targets(&[agent.addr().to_owned()])
        .start();
    let native_dir = tmp.path().join("native");
    std::fs::create_dir(&native_dir).unwrap();
    let native = Prometheus::builder(&native_dir, "stallwatch")
        .targets(&[agent.addr().to_owned()])
        .flag("--enable-feature=native-histograms")
        .start();
    for p in [&classic, &native] {
        assert!(
            wait_until(Duration::from_secs(20), Duration::from_millis(200), || p
                .ready()),
            "{}",
            p.log()
        );
    }

    // The load: quiet, then bursts of buffered random writes into the same filesystem
    // on a device throttled to 4 MB/s, so an fsync waits from a journal commit alone
    // (about a millisecond) to a queue of writeback (hundreds).
    fs.throttle_write_bps(4 << 20);
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(36) {
        std::thread::sleep(Duration::from_secs(2));
        let w = random_writer(
            &fs.path().join("load"),
            Arc::clone(&stop),
            2048,
            Duration::from_secs(3),
            Kick::SyncFileRange,
        );
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    fs.unthrottle();
    std::thread::sleep(Duration::from_secs(3));

    let sel = r#"{target="data",op="fsync"}"#;
    let classic_read = read(
        &classic,
        &format!("stallwatch_probe_duration_seconds_count{sel}"),
        |q| format!("histogram_quantile({q}, stallwatch_probe_duration_seconds_bucket{sel})"),
    );
    let native_read = read(
        &native,
        &format!("histogram_count(stallwatch_probe_duration_seconds{sel})"),
        |q| format!("histogram_quantile({q}, stallwatch_probe_duration_seconds{sel})"),
    );
    let calls = trace.stop();
    drop(trace);
    let lane_calls: Vec<f64> = calls
        .iter()
        .filter(|c| c.tid == lane && c.nr == NR_FSYNC)
        .map(|c| c.seconds())
        .collect();
    // Each Prometheus against the first calls it counted, sorted. On its fresh
    // filesystem the lane's first cycle preallocates its file with an fsync timed as
    // `prepare`, which no histogram counts: the observed fsyncs are the ones after it.
    let first = |n: usize| {
        assert!(
            lane_calls.len() > n && n >= 200,
            "{} fsyncs traced on the lane, {n} counted at the last scrape",
            lane_calls.len(),
        );
        let mut same = lane_calls[1..=n].to_vec();
        same.sort_by(f64::total_cmp);
        same
    };
    let (classic_calls, native_calls) = (first(classic_read.calls), first(native_read.calls));
    let (lo, hi) = (native_calls[0], native_calls[native_calls.len() - 1]);
    eprintln!(
        "{} fsyncs (native) / {} (classic), exact {:.3} .. {:.3} ms",
        native_calls.len(),
        classic_calls.len(),
        lo * 1e3,
        hi * 1e3
    );
    eprintln!("| quantile | exact | native | error | exact | classic | error |");
    eprintln!("|---|---|---|---|---|---|---|");
    let mut native_errors = Vec::new();
    for (i, q) in QUANTILES.iter().enumerate() {
        let (tn, tc) = (exact(&native_calls, *q), exact(&classic_calls, *q));
        let (en, ec) = (
            native_read.quantiles[i] / tn - 1.0,
            classic_read.quantiles[i] / tc - 1.0,
        );
        eprintln!(
            "| p{} | {:.3} ms | {:.3} ms | {:+.1} % | {:.3} ms | {:.3} ms | {:+.1} % |",
            q * 100.0,
            tn * 1e3,
            native_read.quantiles[i] * 1e3,
            en * 100.0,
            tc * 1e3,
            classic_read.quantiles[i] * 1e3,
            ec * 100.0
        );
        native_errors.push((q, en));
    }
    assert!(
        hi / lo >= 100.0,
        "the load spread the fsyncs over less than two decades: {:.3} .. {:.3} ms",
        lo * 1e3,
        hi * 1e3
    );
    for (q, e) in native_errors {
        assert!(
            e.abs() <= 0.10,
            "native p{} off by {:+.1} % from the kernel's timing",
            q * 100.0,
            e * 100.0
        );
    }
}
