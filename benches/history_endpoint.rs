//! The cost figures of BENCHMARKS.md ("The history and `/api/history`"): a full hour of
//! 8 targets served by `/api/history`, timed in memory through the router. Prints
//! figures; run in release: `cargo bench --bench history_endpoint`.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::http::StatusCode;
use stallwatch::agent::fixture::{full_hour, full_hour_of};
use stallwatch::http::{history_json, overview_json};

/// This thread's CPU time, so time waiting for a CPU held by other processes of a
/// shared machine is not counted.
fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * stallwatch::kernel::vm::page_size()
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs a bench target
    // without it, to see that it starts: it has nothing to check, so it stops here.
    if !std::env::args().any(|a| a == "--bench") {
        println!("history_endpoint: figures only under `cargo bench --bench history_endpoint`");
        return;
    }
    let (app, rss, _) = full_hour(rss_bytes);
    println!(
        "history of 8 targets x 5 ops, 1 s interval, full hour: {} bytes allocated ({:.2} MiB), RSS grew {:.2} MiB while filling",
        app.history.allocated_bytes(),
        app.history.allocated_bytes() as f64 / (1 << 20) as f64,
        rss as f64 / (1 << 20) as f64
    );
    // Where the time of a full hour goes: copying and folding the points, or JSON.
    let from = (SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 3600) as u32;
    let t = Instant::now();
    let mut n = 0;
    for _ in 0..20 {
        for i in 0..8 {
            for s in &app.history.target(i).unwrap().series {
                n += s.stepped(from, 10).len();
            }
        }
    }
    println!(
        "copy of 40 series x 1 h in 10 s steps: {:.3} ms ({} points)",
        t.elapsed().as_secs_f64() * 1e3 / 20.0,
        n / 20
    );
    let t = Instant::now();
    let mut n = 0;
    for _ in 0..20 {
        for i in 0..8 {
            for s in &app.history.target(i).unwrap().series {
                n += s.stepped(from + 3300, 1).len();
            }
        }
    }
    println!(
        "copy of 40 series x 5 min in 1 s steps: {:.3} ms ({} points)",
        t.elapsed().as_secs_f64() * 1e3 / 20.0,
        n / 20
    );
    let t = Instant::now();
    for _ in 0..20 {
        std::hint::black_box(history_json(&app, None, Some(3600), None, None));
    }
    println!(
        "history_json, 1 h: {:.3} ms",
        t.elapsed().as_secs_f64() * 1e3 / 20.0
    );
    let body = history_json(&app, None, Some(3600), None, None);
    for level in [1, 6] {
        let t = Instant::now();
        let mut size = 0;
        for _ in 0..20 {
            use std::io::Write as _;
            let mut z = flate2::write::GzEncoder::new(
                Vec::with_capacity(body.len() / 2),
                flate2::Compression::new(level),
            );
            z.write_all(body.as_bytes()).unwrap();
            size = z.finish().unwrap().len();
        }
        println!(
            "gzip level {level} of the 1 h answer ({} bytes) by flate2 directly: {:.3} ms, {size} bytes",
            body.len(),
            t.elapsed().as_secs_f64() * 1e3 / 20.0
        );
    }
    // The live page's overview (issue 22): 64 targets, 1 h, its budget 150 KB gzip.
    {
        let (app64, _, _) = full_hour_of(64, || 0);
        let t = Instant::now();
        for _ in 0..20 {
            std::hint::black_box(overview_json(&app64, None, Some(3600), None));
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / 20.0;
        let body = overview_json(&app64, None, Some(3600), None);
        use std::io::Write as _;
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        z.write_all(body.as_bytes()).unwrap();
        println!(
            "overview_json, 64 targets, 1 h: {ms:.3} ms, {} bytes, {} gzip level 1",
            body.len(),
            z.finish().unwrap().len()
        );
    }
    let t = Instant::now();
    for _ in 0..20 {
        std::hint::black_box(serde_json::to_string(&app.stalls.events()).unwrap());
    }
    println!(
        "256 stall events to JSON: {:.3} ms",
        t.elapsed().as_secs_f64() * 1e3 / 20.0
    );
    let app = Arc::new(app);
    let router = stallwatch::http::app(Arc::clone(&app));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    // The page's poll carries the stalls_version of its last answer: the events
    // come again only when the log changed (the first two rows, 256 of them).
    let version = app.stalls.events_if_changed(None).0;
    let cases = [
        (
            "poll, 5 min range (since 2 s ago), stall log changed",
            format!("/api/history?range=300&since={}", now - 2.0),
        ),
        (
            "poll, 1 h range (since 10 s ago), stall log changed",
            format!("/api/history?range=3600&since={}", now - 10.0),
        ),
        (
            "poll, 5 min range (since 2 s ago)",
            format!(
                "/api/history?range=300&since={}&stalls_version={version}",
                now - 2.0
            ),
        ),
        (
            "poll, 1 h range (since 10 s ago)",
            format!(
                "/api/history?range=3600&since={}&stalls_version={version}",
                now - 10.0
            ),
        ),
        (
            "first load, 5 min range",
            "/api/history?range=300".to_owned(),
        ),
        (
            "first load, 1 h range (10 s steps)",
            "/api/history?range=3600".to_owned(),
        ),
    ];
    for (what, uri) in &cases {
        for gzip in [false, true] {
            let mut times = Vec::new();
            let mut cpu = Vec::new();
            let mut bytes = 0;
            let n = 400;
            for _ in 0..n {
                let mut req = axum::http::Request::get(uri.as_str());
                if gzip {
                    req = req.header("accept-encoding", "gzip");
                }
                let req = req.body(axum::body::Body::empty()).unwrap();
                let t = Instant::now();
                let c0 = thread_cpu_ns();
                let body = rt.block_on(async {
                    use tower::ServiceExt as _;
                    let r = router.clone().oneshot(req).await.unwrap();
                    assert_eq!(r.status(), StatusCode::OK);
                    axum::body::to_bytes(r.into_body(), usize::MAX)
                        .await
                        .unwrap()
                });
                times.push(t.elapsed());
                cpu.push(thread_cpu_ns() - c0);
                bytes = body.len();
            }
            times.sort();
            cpu.sort();
            let p = |q: f64| times[((n as f64 * q) as usize).min(n - 1)].as_secs_f64() * 1e3;
            let c = |q: f64| cpu[((n as f64 * q) as usize).min(n - 1)] as f64 / 1e6;
            println!(
                "{what}{}: {bytes} bytes; wall p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms; CPU p50 {:.3} ms, p99 {:.3} ms ({n} requests)",
                if gzip { ", gzip" } else { "" },
                p(0.5),
                p(0.99),
                times[n - 1].as_secs_f64() * 1e3,
                c(0.5),
                c(0.99),
            );
        }
    }
}
