//! The scrape-cost figures of BENCHMARKS.md ("Exposition formats (issue 21)"): the
//! registry of 8 and 64 default targets encoded in each format `/metrics` serves (text
//! 0.0.4, OpenMetrics, protobuf with native histograms), timed in this thread's CPU
//! time, with the sizes plain and gzipped (the fastest level, as the router does), and
//! the cost of an observation with its native bucket. Prints figures; run in release:
//! `cargo bench --bench exposition`.

use std::io::Write as _;

use stallwatch::agent::fixture::scrape_registry;
use stallwatch::exposition::native::Native;
use stallwatch::exposition::registry::{encode, encode_openmetrics, encode_protobuf};

fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn gzip(b: &[u8]) -> (usize, u64) {
    let t = thread_cpu_ns();
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    let n = e.finish().unwrap().len();
    (n, thread_cpu_ns() - t)
}

/// Median and p99 of `runs` timings of `f`, in µs, and the output's last size.
fn time<T: AsRef<[u8]>>(runs: usize, mut f: impl FnMut() -> T) -> (f64, f64, Vec<u8>) {
    let mut ns = Vec::with_capacity(runs);
    let mut last = Vec::new();
    for _ in 0..runs {
        let t = thread_cpu_ns();
        let out = f();
        ns.push(thread_cpu_ns() - t);
        last = out.as_ref().to_vec();
    }
    ns.sort_unstable();
    let at = |q: f64| ns[((runs as f64 * q) as usize).min(runs - 1)] as f64 / 1e3;
    (at(0.5), at(0.99), last)
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("exposition: figures only under `cargo bench --bench exposition`");
        return;
    }
    let per_series = 3600;
    for targets in [8usize, 64] {
        let (r, took) = scrape_registry(targets, per_series);
        let observations = targets * 5 * per_series;
        println!(
            "{targets} targets: {observations} observations (classic + native bucket, lookup by labels) {:.0} ns each",
            took as f64 / observations as f64
        );
        println!("| targets | format | median µs | p99 µs | bytes | gzip bytes | gzip µs |");
        for (name, f) in [
            ("text 0.0.4", 0),
            ("OpenMetrics", 1),
            ("protobuf (classic + native)", 2),
        ] {
            let (p50, p99, out) = time(300, || match f {
                0 => encode(&r).into_bytes(),
                1 => encode_openmetrics(&r).into_bytes(),
                _ => encode_protobuf(&r),
            });
            let (gz, gz_ns) = gzip(&out);
            println!(
                "| {targets} | {name} | {p50:.0} | {p99:.0} | {} | {gz} | {:.0} |",
                out.len(),
                gz_ns as f64 / 1e3
            );
        }
    }
    // The native bucket alone: the index (log2) and the sorted-vector update.
    let mut n = Native::default();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let values: Vec<f64> = (0..1_000_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            20e-6 * 1000f64.powf((x >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect();
    let t = thread_cpu_ns();
    for &v in &values {
        n.observe(v);
    }
    println!(
        "native bucket update alone: {:.1} ns per observation ({} buckets populated)",
        (thread_cpu_ns() - t) as f64 / values.len() as f64,
        n.buckets.len()
    );
}
