//! The bounded history behind the live page (`/` and `/api/history`): per target and op
//! the last hour of probe latencies, and the last hour of kernel samples.
//!
//! Latencies are kept per second: the count, min, median and max of the calls that
//! returned in that second. At the 1-10 s intervals probes usually run at, a second holds
//! one call, so every cycle is kept as it was measured; at faster intervals (down to the
//! 100 ms minimum) a second's calls are summarised. Kernel samples are kept one per
//! second (the peak dirty and writeback of the second when the sampler runs faster, and
//! its peak I/O pressure).
//!
//! A latency is kept as a 16-bit code (a float with a 6-bit exponent and a 10-bit
//! mantissa: within 1/2048 of the latency, 0.05 %, from 1 ps to 194 days). How a series
//! stores its hour depends on its target's interval, which bounds how many calls a
//! second can hold:
//!
//! - 1 s or slower: the calls' codes in order (2 bytes a call, a ring sized for an hour
//!   of cycles) and, per second of the hour, how many of them returned in it (2 bits, a
//!   wheel indexed by the second). 11.5 KiB a series at 1 s with the 10 s steps below,
//!   1.6 KiB at 10 s.
//! - faster than 1 s: per second of the hour a summary (count and the codes of min,
//!   median and max: 10 bytes, a wheel indexed by the second), the second being filled
//!   apart. 39 KiB a series.
//!
//! Below 10 s intervals a wheel of 10-second steps (`COARSE_STEP`, 10 bytes a step),
//! filled as each step closes, answers the 1 h view without folding an hour of seconds;
//! at 10 s or slower the steps are folded from the calls, which are as few.
//!
//! Each series is allocated once when its target starts, so memory does not grow with
//! uptime. The probe lanes (or a reader folding their pending calls first, see
//! `probe/pending.rs`) and the sampler write under a per-series lock held for a few
//! stores; readers hold it only to copy the points out. Neither ever holds it across a
//! system call, so a lane never waits on a page load beyond that copy.
//!
//! `code` is the 16-bit latency code, `ring` the generic stores, `layout` how a series
//! keeps its hour, `step` the points and their folding into steps, `store` the history
//! itself.

mod code;
mod layout;
mod ring;
mod step;
mod store;

pub use layout::RETAIN;
pub use step::{step_kernel, step_latency, KernelPoint, LatencyPoint, COARSE_STEP};
pub use store::{History, OpSeries, TargetHistory};

#[cfg(test)]
mod tests {
    use super::code::*;
    use super::layout::*;
    use super::step::*;
    use super::*;
    use crate::base::labels::{Mode, Op};
    use crate::kernel::vm::VmSample;
    use crate::kernel::vm::{IoPressureTotals, VmCounters};
    use std::time::Instant;
    use std::time::{Duration, SystemTime};

    fn at(unix: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(unix)
    }

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn us(v: u64) -> Duration {
        Duration::from_micros(v)
    }

    /// A xorshift step, for latencies and times that do not line up by accident.
    fn next(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    /// One (Create, Create) series of target 0 probed every `interval`.
    fn one_series(interval: Duration) -> History {
        let h = History::new();
        h.add_target(0, "t", &[(Mode::Create, Op::Create)], interval);
        h
    }

    fn points(h: &History, from: u32) -> Vec<LatencyPoint> {
        h.target(0).unwrap().series[0].since(from)
    }

    fn rel(a: f32, b: f32) -> f64 {
        ((a as f64 - b as f64) / b as f64).abs()
    }

    #[test]
    fn rounding_as_with_the_c_librarys_log10() {
        // Every 101st positive finite f32: the decade from libm's log10 is the C
        // library's.
        for bits in (1..0x7f80_0000u32).step_by(101) {
            let v = f32::from_bits(bits);
            let scale = 10f64.powi(2 - (v as f64).log10().floor() as i32);
            let c = ((v as f64 * scale).round() / scale) as f32;
            assert_eq!(round_sig(v, 3).to_bits(), c.to_bits(), "{v}");
        }
    }

    #[test]
    fn codes_keep_a_latency_within_a_2048th_of_itself() {
        let mut x = 0x2545_f491_4f6c_dd1d;
        for _ in 0..200_000 {
            // Log-uniform from 1 ns to 10^6 s.
            let v = (10f64.powf(-9.0 + 15.0 * (next(&mut x) % 1_000_000) as f64 / 1e6)) as f32;
            let got = quantise(v);
            assert!(rel(got, v) <= 1.0 / 2048.0, "{v} kept as {got}");
        }
        // Every code stands for one latency, in order, and encodes back to itself.
        let mut prev = -1.0f32;
        for c in 0..=u16::MAX {
            let v = decode(c);
            assert!(v > prev, "code {c}: {v} after {prev}");
            assert_eq!(encode(v), c, "{v}");
            prev = v;
        }
        assert_eq!(encode(0.0), 0);
        assert_eq!(decode(0), 0.0);
        assert_eq!(encode(1e-13), 0, "under a picosecond is zero");
        assert!(decode(u16::MAX) > 1.6e7, "194 days: {}", decode(u16::MAX));
        assert_eq!(encode(1e9), u16::MAX, "beyond, the largest");
        assert_eq!(encode(f32::INFINITY), u16::MAX);
    }

    #[test]
    fn every_cycle_is_kept_for_an_hour_at_one_and_ten_seconds() {
        for interval in [1u64, 10] {
            let h = one_series(Duration::from_secs(interval));
            let mut x = 88172645463325252u64;
            let mut calls = Vec::new();
            // Two hours of cycles; each call returns somewhere in its cycle's second.
            for i in 0..2 * RETAIN.as_secs() / interval {
                let t = 100_000 + i * interval;
                let v = us(1 + next(&mut x) % 500_000);
                h.record(0, Mode::Create, Op::Create, v, at(t) + ms(x % 1000));
                calls.push((t as u32, v.as_secs_f32()));
            }
            let last = calls.last().unwrap().0;
            let want: Vec<_> = calls.iter().filter(|c| c.0 >= last - 3600).collect();
            let got = points(&h, last - 3600);
            assert_eq!(got.len(), want.len(), "every {interval} s");
            assert_eq!(want.len() as u64, 3600 / interval + 1);
            for (p, (t, v)) in got.iter().zip(&want) {
                assert_eq!((p.t, p.count), (*t, 1));
                assert!(rel(p.max, *v) <= 1.0 / 2048.0, "{} for {v}", p.max);
                assert_eq!(
                    (p.min, p.p50),
                    (p.max, p.max),
                    "one call is min = p50 = max"
                );
            }
            // The hour before is gone (the wheel holds two seconds more than the hour).
            let all = points(&h, 0);
            assert!(all[0].t >= last - 3601, "{} kept at {last}", all[0].t);
        }
    }

    #[test]
    fn a_second_with_two_calls_keeps_both_and_an_empty_second_is_no_point() {
        let h = one_series(Duration::from_secs(1));
        let rec = |v: Duration, t: SystemTime| h.record(0, Mode::Create, Op::Create, v, t);
        rec(ms(500), at(100) + ms(200));
        // A slow call of the cycle started at 100.8 returns at 101.1, the next (101.8) is
        // fast: two calls in second 101, none in 102.
        rec(ms(300), at(101) + ms(100));
        rec(ms(5), at(101) + ms(900));
        rec(ms(7), at(103) + ms(300));
        // Another op or target is not this series.
        h.record(0, Mode::Overwrite, Op::Write, ms(700), at(102));
        h.record(4, Mode::Create, Op::Create, ms(700), at(102));
        let p = points(&h, 0);
        let summary: Vec<_> = p.iter().map(|p| (p.t, p.count)).collect();
        assert_eq!(summary, [(100, 1), (101, 2), (103, 1)], "{p:?}");
        assert_eq!((p[1].min, p[1].max), (quantise(0.005), quantise(0.3)));
        assert_eq!(p[1].p50, quantise((quantise(0.005) + quantise(0.3)) / 2.0));
        assert_eq!(
            points(&h, 102),
            vec![p[2]],
            "since is inclusive, in Unix seconds"
        );
        // The wall clock stepped back: into the newest second, and a fourth call of a
        // second into the next one.
        for v in [1, 2, 3] {
            rec(ms(v), at(50));
        }
        let p = points(&h, 103);
        let summary: Vec<_> = p.iter().map(|p| (p.t, p.count)).collect();
        assert_eq!(summary, [(103, 3), (104, 1)], "{p:?}");
        assert_eq!(
            (p[0].min, p[0].p50, p[0].max),
            (quantise(0.001), quantise(0.002), quantise(0.007))
        );
        assert_eq!(p[1].max, quantise(0.003));
    }

    #[test]
    fn faster_than_a_second_each_second_is_summarised() {
        let h = one_series(ms(100));
        for (i, v) in [5u64, 1, 9, 3].iter().enumerate() {
            h.record(
                0,
                Mode::Create,
                Op::Create,
                ms(*v),
                at(1000) + ms(i as u64 * 100),
            );
        }
        h.record(0, Mode::Create, Op::Create, ms(7), at(1002));
        let p = points(&h, 0);
        assert_eq!(p.len(), 2, "{p:?}");
        assert_eq!((p[0].t, p[0].count), (1000, 4));
        assert_eq!((p[0].min, p[0].max), (quantise(0.001), quantise(0.009)));
        assert_eq!(p[0].p50, quantise(0.004), "median of 1,3,5,9 ms");
        assert_eq!((p[1].t, p[1].count, p[1].p50), (1002, 1, quantise(0.007)));
        // An hour of ten calls a second: every second, as the calls were.
        let h = one_series(ms(100));
        let t0 = 200_000;
        for s in 0..RETAIN.as_secs() + 600 {
            for k in 0..10 {
                let v = us(100 * (k + 1) + s % 7);
                h.record(0, Mode::Create, Op::Create, v, at(t0 + s) + ms(k * 100));
            }
        }
        let last = (t0 + RETAIN.as_secs() + 599) as u32;
        let p = points(&h, last - 3600);
        assert_eq!(p.len(), 3601);
        for (i, p) in p.iter().enumerate() {
            let s = (last - 3600 - t0 as u32) as u64 + i as u64;
            let (lo, hi) = (100 + s % 7, 1000 + s % 7);
            assert_eq!((p.t, p.count), (last - 3600 + i as u32, 10));
            assert_eq!(
                (p.min, p.max),
                (quantise(lo as f32 / 1e6), quantise(hi as f32 / 1e6))
            );
            // The median of 10 calls, 100 µs apart: between the fifth and the sixth.
            let mid = (500 + 600) as f32 / 2e6 + (s % 7) as f32 / 1e6;
            assert!(rel(p.p50, mid) <= 1.0 / 2048.0, "{} for {mid}", p.p50);
        }
    }

    #[test]
    fn an_hour_is_kept_and_no_more_at_any_interval() {
        for interval in [ms(100), ms(500), ms(1000), ms(1500), ms(10_000), ms(60_000)] {
            let h = one_series(interval);
            let step = interval.as_millis() as u64;
            let hours = 2 * RETAIN.as_millis() as u64;
            let mut last = 0;
            for t in (0..hours).step_by(step as usize) {
                h.record(0, Mode::Create, Op::Create, ms(1), at(10_000) + ms(t));
                last = 10_000 + t / 1000;
            }
            let p = points(&h, 0);
            let span = p.last().unwrap().t - p.first().unwrap().t;
            assert_eq!(p.last().unwrap().t as u64, last, "{interval:?}");
            let cycle = step.div_ceil(1000) as u32;
            assert!(
                span + cycle > RETAIN.as_secs() as u32,
                "{interval:?}: {span} s"
            );
            assert!(
                span <= RETAIN.as_secs() as u32 + 1,
                "{interval:?}: {span} s"
            );
            let calls: u32 = p.iter().map(|p| p.count).sum();
            let want = (span as u64 * 1000 / step.max(1)) as u32;
            assert!(
                calls.abs_diff(want) <= 11,
                "{interval:?}: {calls} calls, {want}"
            );
        }
    }

    #[test]
    fn more_calls_than_an_hour_of_cycles_drops_the_oldest() {
        // Three calls a second at a 10 s interval (only a clock stepping back could do
        // this): 364 calls kept, the newest, and still in their seconds.
        let h = one_series(ms(10_000));
        for s in 0..1000u64 {
            for k in 0..3 {
                h.record(0, Mode::Create, Op::Create, us(s * 3 + k + 1), at(5000 + s));
            }
        }
        let p = points(&h, 0);
        let calls: u32 = p.iter().map(|p| p.count).sum();
        assert_eq!(calls, 364);
        assert_eq!(p.len(), 122, "121 seconds whole and one with a call left");
        assert_eq!((p[0].t, p[0].count), (5878, 1));
        let last = p.last().unwrap();
        assert_eq!((last.t, last.count), (5999, 3));
        assert_eq!((last.min, last.max), (quantise(2998e-6), quantise(3000e-6)));
        assert_eq!(p[0].max, quantise(2637e-6), "the newest of second 5878");
    }

    #[test]
    fn steps_fold_min_max_count_and_median() {
        let p = |t, count, min, p50, max| LatencyPoint {
            t,
            count,
            min,
            p50,
            max,
        };
        let pts = [
            p(100, 1, 1.0, 1.0, 1.0),
            p(101, 3, 0.5, 2.0, 9.0),
            p(109, 1, 3.0, 3.0, 3.0),
            p(110, 1, 4.0, 4.0, 4.0),
        ];
        let s = step_latency(&pts, 10);
        assert_eq!(s, vec![p(100, 5, 0.5, 2.0, 9.0), p(110, 1, 4.0, 4.0, 4.0)]);
        assert_eq!(step_latency(&pts, 1), pts.to_vec());
    }

    #[test]
    fn the_coarse_steps_answer_as_folding_the_seconds_would() {
        fn check(s: &OpSeries, from: u32, what: &str) {
            let want = step_latency(&s.since(from - from % 10), 10);
            let got = s.stepped(from, 10);
            let diff = got.iter().zip(&want).find(|(a, b)| a != b);
            assert_eq!(diff, None, "{what} from {from}");
            assert_eq!(got.len(), want.len(), "{what} from {from}");
            // Longer steps fold the 10 s steps: the same counts and extremes; the median
            // is the weighted median of the 10 s medians.
            for step in [20, 60] {
                let want = step_latency(&s.since(from - from % 10), step);
                let got = s.stepped(from, step);
                let key = |v: &[LatencyPoint]| -> Vec<(u32, u32, f32, f32)> {
                    v.iter().map(|p| (p.t, p.count, p.min, p.max)).collect()
                };
                assert_eq!(key(&got), key(&want), "{what} from {from} step {step}");
            }
        }
        // At 100 ms and at 1 s from the 10 s wheel; at 10 s folded from the calls.
        for (interval, every) in [(100, 130), (1000, 1000), (10_000, 10_000)] {
            let h = one_series(ms(interval));
            let mut x: u64 = 88172645463325252;
            let mut record = |from_ms: u64, to_ms: u64| {
                for i in from_ms / every..to_ms / every {
                    let jitter = next(&mut x) % interval.min(1000);
                    let t = at(7_000) + ms(i * every + jitter);
                    h.record(0, Mode::Create, Op::Create, ms(1 + x % 50), t);
                }
            };
            let what = format!("{interval} ms");
            let s = &h.target(0).unwrap().series[0];
            // The first minutes, then well past the hour (its first step may be only
            // partly in the one-second points, so not from the hour's very edge).
            record(0, 300_000);
            for from in [0, 7_003, 7_010, 7_250] {
                check(s, from, &what);
            }
            assert_eq!(s.stepped(7_003, 5), step_latency(&s.since(7_003), 5));
            record(300_000, 20_000_000);
            for from in [23_410, 24_003, 26_000, 26_995] {
                check(s, from, &what);
            }
            let hour = s.stepped(27_000 - 3600, 10).len();
            assert!(
                (359..=361).contains(&hour),
                "{what}: {hour} steps in the hour"
            );
        }
    }

    fn sample(at: Instant, dirty: u64, some: f64) -> VmSample {
        VmSample {
            at,
            counters: VmCounters {
                dirty_bytes: dirty,
                writeback_bytes: 1,
                dirty_threshold_bytes: 100,
                dirty_background_threshold_bytes: 50,
                ..Default::default()
            },
            pressure: Some(IoPressureTotals {
                some_seconds: some,
                full_seconds: some / 2.0,
            }),
            sysctls: None,
        }
    }

    #[test]
    fn kernel_samples_per_second_with_psi_as_a_share_of_time() {
        let h = History::new();
        let t0 = Instant::now();
        h.record_kernel(&sample(t0, 10, 5.0), at(2000));
        h.record_kernel(&sample(t0 + ms(1000), 30, 5.5), at(2001));
        // A faster sampler: the second keeps its peak.
        h.record_kernel(&sample(t0 + ms(1500), 20, 5.5), at(2001));
        let k = h.kernel_since(0);
        assert_eq!(k.len(), 2);
        assert!(k[0].io_some.is_nan(), "no rate from the first sample");
        assert_eq!((k[1].t, k[1].dirty_bytes), (2001, 30));
        assert!((k[1].io_some - 0.5).abs() < 1e-6, "{}", k[1].io_some);
        assert!((k[1].io_full - 0.25).abs() < 1e-6);
        assert_eq!(h.kernel_since(2001).len(), 1);
        let s = step_kernel(&k, 10);
        assert_eq!((s.len(), s[0].t, s[0].dirty_bytes), (1, 2000, 30));
    }

    /// `targets` targets, each with `ops` at `interval`, filled for an hour and ten
    /// minutes more; the bytes allocated, checked to stay what adding the targets took.
    fn full_hour(targets: usize, ops: &[(Mode, Op)], interval: Duration) -> (History, usize) {
        let h = History::new();
        for i in 0..targets {
            h.add_target(i, &format!("t{i}"), ops, interval);
        }
        let before = h.allocated_bytes();
        let per_second = (1000 / interval.as_millis().min(1000)) as u64;
        let t0 = Instant::now();
        for s in 0..RETAIN.as_secs() + 600 {
            if !s.is_multiple_of(interval.as_secs().max(1)) {
                continue;
            }
            for i in 0..targets {
                for &(m, o) in ops {
                    for k in 0..per_second {
                        let gap = interval.as_millis() as u64 * k;
                        h.record(i, m, o, ms(k + 1), at(50_000 + s) + ms(gap));
                    }
                }
            }
            h.record_kernel(
                &sample(t0 + Duration::from_secs(s), s, s as f64),
                at(50_000 + s),
            );
        }
        assert_eq!(h.allocated_bytes(), before, "allocated once, never grows");
        let last = h.target(targets - 1).unwrap();
        let full = last.series[ops.len() - 1].since(0).len();
        let cycles = RETAIN.as_millis() / interval.as_millis().max(1000);
        assert!(full as u128 > cycles, "{full} points");
        (h, before)
    }

    fn ops_of(modes: &[Mode]) -> Vec<(Mode, Op)> {
        modes
            .iter()
            .flat_map(|&m| {
                crate::base::labels::ops_of(m, crate::base::labels::SyncKind::Fsync)
                    .iter()
                    .map(move |&o| (m, o))
            })
            .collect()
    }

    /// The memory figures of BENCHMARKS.md ("The history and `/api/history`"), each
    /// filled synthetically for a full hour with the kernel ring: 8 and 64 targets with
    /// the default modes (5 ops) at a 1 s interval (and 8 at the default 10 s), and the
    /// worst case the configuration allows, 8 targets with every mode (13 ops each) at
    /// the 100 ms minimum, every second of the hour filled. Run with `--nocapture` to see
    /// them.
    #[test]
    fn memory_of_a_full_hour_with_eight_targets() {
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        let defaults = ops_of(&[Mode::Create, Mode::Overwrite]);
        assert_eq!(defaults.len(), 5);
        let every = ops_of(&[
            Mode::Create,
            Mode::Overwrite,
            Mode::Direct,
            Mode::Replace,
            Mode::Append,
        ]);
        assert_eq!(every.len(), 13);
        for (targets, ops, interval, cap) in [
            (8, &defaults, ms(1000), 0.7),
            (8, &defaults, ms(10_000), 0.3),
            (64, &defaults, ms(1000), 4.0),
            (8, &every, ms(100), 4.5),
        ] {
            let (_, bytes) = full_hour(targets, ops, interval);
            let series = targets * ops.len();
            println!(
                "history: {targets} targets x {} ops at {} ms + kernel, full hour: {bytes} bytes = {:.2} MiB ({} bytes a series)",
                ops.len(),
                interval.as_millis(),
                mib(bytes),
                (bytes - 3602 * std::mem::size_of::<KernelPoint>()) / series,
            );
            assert!(mib(bytes) <= cap, "{:.2} MiB", mib(bytes));
        }
    }
}
