//! A full hour for the `/api/history` tests and its benchmark
//! (`benches/history_endpoint.rs`), and a scrape's registry for the exposition benchmark
//! (`benches/exposition.rs`): not used by the agent.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::base::labels::{Mode, Op, SyncKind};
use crate::config::Target;
use crate::exposition::registry::Registry;
use crate::history::{self, History};
use crate::http::App;
use crate::kernel::blockdev::TargetDevices;
use crate::kernel::vm::{IoPressureTotals, VmCounters, VmSample};
use crate::probe::{ProbeMetrics, TargetShared, Targets};
use crate::stall::log::{FinishedCall, LaneKey, StallLog};

/// 8 targets with the default modes (5 ops each) probed every second for a full hour, a
/// kernel sample every second, and a full stall ring (256 events). With how much
/// `rss_bytes` grew while the history filled, and the calls of target 0's first series
/// (Unix second, nanoseconds).
pub fn full_hour(rss_bytes: impl Fn() -> u64) -> (App, u64, Vec<(u64, u64)>) {
    full_hour_of(8, rss_bytes)
}

/// [`full_hour`] with `targets` targets (the stall events spread over the first 8).
pub fn full_hour_of(targets: usize, rss_bytes: impl Fn() -> u64) -> (App, u64, Vec<(u64, u64)>) {
    let registry = Registry::new();
    let metrics = ProbeMetrics::new(&registry);
    let rss0 = rss_bytes();
    let history = Arc::new(History::new());
    let stalls = Arc::new(StallLog::new(256, &registry, Arc::default()));
    let mut shared = Vec::new();
    for i in 0..targets {
        let ts = TargetShared::new(i, default_target(i), i * 2, &metrics);
        history.add_target(i, &ts.target.name, &ts.ops, ts.target.interval);
        shared.push(Arc::new(ts));
    }
    let now = SystemTime::now();
    let t0 = Instant::now();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut calls = Vec::new();
    let hour = history::RETAIN.as_secs();
    for s in 0..hour {
        let at = now - Duration::from_secs(hour - s);
        for ts in &shared {
            for &(mode, op) in &ts.ops {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let ns = 5_000 + x % 2_000_000;
                history.record(ts.index, mode, op, Duration::from_nanos(ns), at);
                if ts.index == 0 && (mode, op) == ts.ops[0] {
                    calls.push((
                        at.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs(),
                        ns,
                    ));
                }
            }
        }
        let sample = VmSample {
            at: t0 + Duration::from_secs(s),
            counters: VmCounters {
                dirty_bytes: (x % (1 << 30)),
                writeback_bytes: x % (1 << 24),
                dirty_threshold_bytes: 4 << 30,
                dirty_background_threshold_bytes: 2 << 30,
                ..Default::default()
            },
            pressure: Some(IoPressureTotals {
                some_seconds: s as f64 * 0.1,
                full_seconds: s as f64 * 0.01,
            }),
            sysctls: None,
        };
        history.record_kernel(&sample, at);
    }
    let rss = rss_bytes().saturating_sub(rss0);
    for seq in 0..256u64 {
        let key = LaneKey {
            devices: &TargetDevices::default(),
            lane: (seq % 16) as usize,
            name: &shared[(seq % 8) as usize % targets].target.name,
        };
        let call = FinishedCall {
            mode: Mode::Overwrite,
            op: Op::Fsync,
            seq,
            elapsed: Duration::from_millis(1500),
            failure: None,
            waits: None,
        };
        stalls.finished(key, call, &[]);
    }
    let app = App {
        registry,
        stalls,
        targets: Arc::new(Targets::new(shared)),
        history,
        latest: Arc::default(),
        telemetry_path: "/metrics".into(),
        reload: None,
        stalls_json: Mutex::default(),
    };
    (app, rss, calls)
}

/// The registry of an agent with `targets` default targets (create and overwrite, 1 s),
/// as a scrape sees it: every probe family and the stall counters created, each
/// latency series fed `per_series` observations spread log-uniformly over 20 µs to
/// 20 ms (the native buckets of two and a half decades), one in 500 a stall with an
/// exemplar. For the scrape-cost figures of BENCHMARKS.md (`benches/exposition.rs`).
/// Returns the registry and the nanoseconds the observations took in all.
pub fn scrape_registry(targets: usize, per_series: usize) -> (Registry, u64) {
    let registry = crate::exposition::registry::registry();
    let metrics = ProbeMetrics::new(&registry);
    let stalls = StallLog::new(256, &registry, Arc::default());
    let mut shared = Vec::new();
    for i in 0..targets {
        let ts = TargetShared::new(i, default_target(i), i * 2, &metrics);
        stalls.add_target(&ts.target.name, &ts.ops);
        shared.push(Arc::new(ts));
    }
    crate::probe::register_inflight(&registry, Arc::new(Targets::new(shared.clone())));
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let t0 = Instant::now();
    for n in 0..per_series {
        for ts in &shared {
            for &(mode, op) in &ts.ops {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // 20 µs × 1000^u, u uniform in [0, 1).
                let u = (x >> 11) as f64 / (1u64 << 53) as f64;
                let d = Duration::from_secs_f64(20e-6 * 1000f64.powf(u));
                let stall = (n % 500 == 499).then(|| (format!("fixture-{n}"), SystemTime::now()));
                metrics.observe(&ts.target.name, mode, op, d, stall);
            }
        }
    }
    let took = t0.elapsed().as_nanos() as u64;
    (registry, took)
}

/// Target `i` of the fixtures: `target{i}` with the default modes at 1 s.
fn default_target(i: usize) -> Target {
    Target {
        name: format!("target{i}"),
        path: format!("/srv/disk{i}").into(),
        interval: Duration::from_secs(1),
        modes: vec![Mode::Create, Mode::Overwrite],
        size: 4096,
        sync: SyncKind::Fsync,
        require_mountpoint: true,
        stall_threshold: Duration::from_secs(1),
        rotate_size: 64 << 20,
    }
}
