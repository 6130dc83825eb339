//! The bounded history behind the live page (`/` and `/api/history`): per target and op
//! the last hour of probe latencies, and the last hour of kernel samples.
//!
//! Latencies are kept in one-second slots: a slot holds the count, min, median and max
//! of the calls that returned in that second. At the 1-10 s intervals probes usually
//! run at, a slot holds one call, so every cycle is kept as it was measured; at faster
//! intervals (down to the 100 ms minimum) a second's calls are summarised. Kernel
//! samples are kept one per second (the peak dirty and writeback of the second when the
//! sampler runs faster, and its peak I/O pressure).
//!
//! Each series is a fixed ring allocated once, sized for an hour at its target's
//! interval, so memory does not grow with uptime; beside it a ring of 10-second steps
//! (`COARSE_STEP`), filled as each second closes, answers the 1 h view. The probe lanes and the sampler write
//! under a per-series lock held for a few stores; readers hold it only to copy the
//! points out. Neither ever holds it across a system call, so a lane never waits on a
//! page load beyond that copy.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use crate::config::Mode;
use crate::op::Op;
use crate::sync::lock;
use crate::vm::VmSample;

/// How far back the history reaches.
pub const RETAIN: Duration = Duration::from_secs(3600);

/// Calls of one slot whose values are kept for its median; a slot gets at most 10 at
/// the 100 ms minimum interval. Beyond this, count/min/max stay exact and the median is
/// that of the first `MEDIAN_OF` calls.
const MEDIAN_OF: usize = 16;

/// `v` to `digits` significant digits: far finer than a latency means, and a third of
/// the JSON of a full f32.
fn round_sig(v: f32, digits: i32) -> f32 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let scale = 10f64.powi(digits - 1 - (v.abs() as f64).log10().floor() as i32);
    ((v as f64 * scale).round() / scale) as f32
}

/// Unix time in whole seconds.
fn unix_secs(t: SystemTime) -> u32 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs().min(u32::MAX as u64) as u32)
}

/// A fixed-capacity ring, oldest first; allocated once.
struct Ring<T> {
    buf: Vec<T>,
    cap: usize,
    /// Index of the oldest element once the ring is full.
    head: usize,
}

impl<T: Copy> Ring<T> {
    fn new(cap: usize) -> Ring<T> {
        Ring {
            buf: Vec::with_capacity(cap),
            cap,
            head: 0,
        }
    }

    fn push(&mut self, v: T) {
        if self.buf.len() < self.cap {
            self.buf.push(v);
        } else {
            self.buf[self.head] = v;
            self.head = (self.head + 1) % self.cap;
        }
    }

    fn last_mut(&mut self) -> Option<&mut T> {
        if self.buf.is_empty() {
            return None;
        }
        let i = (self.head + self.buf.len() - 1) % self.buf.len();
        self.buf.get_mut(i)
    }

    fn iter(&self) -> impl DoubleEndedIterator<Item = &T> {
        let (a, b) = self.buf.split_at(self.head);
        b.iter().chain(a.iter())
    }

    fn bytes(&self) -> usize {
        self.buf.capacity() * std::mem::size_of::<T>()
    }
}

/// One second (or, aggregated for a query, one step) of one op's latencies, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencyPoint {
    /// Unix seconds: the second the calls returned in (the step's start when stepped).
    pub t: u32,
    pub count: u32,
    pub min: f32,
    pub p50: f32,
    pub max: f32,
}

/// The slot being filled.
#[derive(Clone, Copy)]
struct Open {
    t: u32,
    count: u32,
    min: f32,
    max: f32,
    n: usize,
    values: [f32; MEDIAN_OF],
}

impl Open {
    fn new(t: u32, v: f32) -> Open {
        let mut values = [0.0; MEDIAN_OF];
        values[0] = v;
        Open {
            t,
            count: 1,
            min: v,
            max: v,
            n: 1,
            values,
        }
    }

    fn add(&mut self, v: f32) {
        self.count += 1;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        if self.n < MEDIAN_OF {
            self.values[self.n] = v;
            self.n += 1;
        }
    }

    fn point(&self) -> LatencyPoint {
        let mut v = self.values;
        let v = &mut v[..self.n];
        v.sort_by(f32::total_cmp);
        let p50 = if v.len() % 2 == 1 {
            v[v.len() / 2]
        } else {
            (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
        };
        LatencyPoint {
            t: self.t,
            count: self.count,
            min: self.min,
            p50,
            max: self.max,
        }
    }
}

/// Seconds per point of the coarse ring, which answers the 1 h view without folding an
/// hour of one-second slots at every page load.
pub const COARSE_STEP: u32 = 10;

/// A coarse step being filled from closed one-second slots.
#[derive(Clone, Copy)]
struct CoarseOpen {
    t: u32,
    count: u32,
    min: f32,
    max: f32,
    n: usize,
    /// Each second's median and call count.
    medians: [(f32, u32); COARSE_STEP as usize],
}

impl CoarseOpen {
    fn new(p: &LatencyPoint) -> CoarseOpen {
        let mut c = CoarseOpen {
            t: p.t - p.t % COARSE_STEP,
            count: 0,
            min: f32::INFINITY,
            max: f32::NEG_INFINITY,
            n: 0,
            medians: [(0.0, 0); COARSE_STEP as usize],
        };
        c.add(p);
        c
    }

    fn add(&mut self, p: &LatencyPoint) {
        self.count += p.count;
        self.min = self.min.min(p.min);
        self.max = self.max.max(p.max);
        if self.n < self.medians.len() {
            self.medians[self.n] = (p.p50, p.count);
            self.n += 1;
        }
    }

    fn point(&self) -> LatencyPoint {
        let mut m = self.medians;
        LatencyPoint {
            t: self.t,
            count: self.count,
            min: self.min,
            p50: weighted_median(&mut m[..self.n]),
            max: self.max,
        }
    }
}

/// The count-weighted median of (value, count) pairs; sorts them.
fn weighted_median(v: &mut [(f32, u32)]) -> f32 {
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: u32 = v.iter().map(|x| x.1).sum();
    let mut acc = 0;
    v.iter()
        .find(|(_, c)| {
            acc += c;
            acc * 2 >= total
        })
        .map_or(f32::NAN, |x| x.0)
}

struct LatencyRing {
    done: Ring<LatencyPoint>,
    open: Option<Open>,
    /// The same calls in steps of `COARSE_STEP` seconds.
    coarse: Ring<LatencyPoint>,
    coarse_open: Option<CoarseOpen>,
}

impl LatencyRing {
    /// The rings for an hour of calls every `interval`.
    fn new(interval: Duration) -> LatencyRing {
        let coarse = interval.max(Duration::from_secs(COARSE_STEP as u64));
        LatencyRing {
            done: Ring::new(slots_for(interval)),
            open: None,
            coarse: Ring::new(slots_for(coarse)),
            coarse_open: None,
        }
    }

    fn record(&mut self, t: u32, seconds: f32) {
        match &mut self.open {
            Some(o) if o.t == t => o.add(seconds),
            // A clock stepped back: fold into the open slot rather than go back in time.
            Some(o) if t < o.t => o.add(seconds),
            Some(o) => {
                let p = o.point();
                self.done.push(p);
                self.open = Some(Open::new(t, seconds));
                self.fold_coarse(&p);
            }
            None => self.open = Some(Open::new(t, seconds)),
        }
    }

    fn fold_coarse(&mut self, p: &LatencyPoint) {
        match &mut self.coarse_open {
            Some(c) if c.t == p.t - p.t % COARSE_STEP => c.add(p),
            Some(c) => {
                let done = c.point();
                self.coarse.push(done);
                self.coarse_open = Some(CoarseOpen::new(p));
            }
            None => self.coarse_open = Some(CoarseOpen::new(p)),
        }
    }

    /// The one-second points at or after `from`, oldest first.
    fn since(&self, from: u32, out: &mut Vec<LatencyPoint>) {
        let newer = self.done.iter().rev().take_while(|p| p.t >= from).count();
        out.reserve(newer + 1);
        out.extend(self.done.iter().skip(self.done.buf.len() - newer).copied());
        if let Some(o) = self.open.as_ref().filter(|o| o.t >= from) {
            out.push(o.point());
        }
    }

    /// The `COARSE_STEP`-second points whose step starts at or after `from`, oldest
    /// first, the steps being filled included.
    fn since_coarse(&self, from: u32, out: &mut Vec<LatencyPoint>) {
        let newer = self.coarse.iter().rev().take_while(|p| p.t >= from).count();
        out.reserve(newer + 2);
        out.extend(
            self.coarse
                .iter()
                .skip(self.coarse.buf.len() - newer)
                .copied(),
        );
        let mut tail = self.coarse_open;
        if let Some(o) = &self.open {
            let p = o.point();
            match &mut tail {
                Some(c) if c.t == p.t - p.t % COARSE_STEP => c.add(&p),
                Some(c) => {
                    out.push(c.point());
                    tail = Some(CoarseOpen::new(&p));
                }
                None => tail = Some(CoarseOpen::new(&p)),
            }
        }
        out.extend(tail.filter(|c| c.t >= from).map(|c| c.point()));
    }
}

/// One op's series.
pub struct OpSeries {
    pub mode: Mode,
    pub op: Op,
    ring: Mutex<LatencyRing>,
}

/// The latency series of one target.
pub struct TargetHistory {
    pub name: String,
    pub series: Vec<OpSeries>,
}

/// Slots an hour needs at `interval`: one per cycle, one per second at most, and two
/// more: the hour is kept whole beside the second being filled.
fn slots_for(interval: Duration) -> usize {
    let per = interval.as_secs_f64().max(1.0);
    (RETAIN.as_secs_f64() / per).ceil() as usize + 2
}

/// One second of the kernel's state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelPoint {
    pub t: u32,
    pub dirty_bytes: u64,
    pub writeback_bytes: u64,
    pub dirty_background_threshold_bytes: u64,
    pub dirty_threshold_bytes: u64,
    /// Share of the time some task was stalled on I/O (PSI io some), 0-1; NaN without PSI.
    pub io_some: f32,
    /// Share of the time all non-idle tasks were (PSI io full), 0-1; NaN without PSI.
    pub io_full: f32,
}

struct KernelRing {
    ring: Ring<KernelPoint>,
    /// The previous sample's PSI totals and time, for the rates.
    prev: Option<(std::time::Instant, f64, f64)>,
}

/// The whole history: written by the lanes and the sampler, read by the page.
pub struct History {
    targets: RwLock<BTreeMap<usize, Arc<TargetHistory>>>,
    kernel: Mutex<KernelRing>,
}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}

impl History {
    pub fn new() -> History {
        History {
            targets: RwLock::default(),
            kernel: Mutex::new(KernelRing {
                ring: Ring::new(slots_for(Duration::from_secs(1))),
                prev: None,
            }),
        }
    }

    /// Starts the (empty) history of target number `index`, probed every `interval`.
    pub fn add_target(&self, index: usize, name: &str, ops: &[(Mode, Op)], interval: Duration) {
        let h = TargetHistory {
            name: name.to_owned(),
            series: ops
                .iter()
                .map(|&(mode, op)| OpSeries {
                    mode,
                    op,
                    ring: Mutex::new(LatencyRing::new(interval)),
                })
                .collect(),
        };
        self.targets
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(index, Arc::new(h));
    }

    /// Forgets a target no longer probed.
    pub fn remove_target(&self, index: usize) {
        self.targets
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&index);
    }

    /// The history of target number `index`.
    pub fn target(&self, index: usize) -> Option<Arc<TargetHistory>> {
        self.targets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&index)
            .cloned()
    }

    /// A call of `mode` `op` on target `index` completed at `at` after `elapsed`.
    pub fn record(&self, index: usize, mode: Mode, op: Op, elapsed: Duration, at: SystemTime) {
        let Some(t) = self.target(index) else {
            return;
        };
        if let Some(s) = t.series.iter().find(|s| s.mode == mode && s.op == op) {
            let v = round_sig(elapsed.as_secs_f32(), 4);
            lock(&s.ring).record(unix_secs(at), v);
        }
    }

    /// A kernel sample taken at `at` (wall clock) from the sampler.
    pub fn record_kernel(&self, s: &VmSample, at: SystemTime) {
        let t = unix_secs(at);
        let mut k = lock(&self.kernel);
        let (some, full) = match (s.pressure, k.prev) {
            (Some(p), Some((at0, s0, f0))) => {
                let dt = s.at.saturating_duration_since(at0).as_secs_f64();
                if dt > 0.0 {
                    (
                        round_sig(((p.some_seconds - s0) / dt).clamp(0.0, 1.0) as f32, 3),
                        round_sig(((p.full_seconds - f0) / dt).clamp(0.0, 1.0) as f32, 3),
                    )
                } else {
                    (f32::NAN, f32::NAN)
                }
            }
            _ => (f32::NAN, f32::NAN),
        };
        k.prev = s.pressure.map(|p| (s.at, p.some_seconds, p.full_seconds));
        let c = &s.counters;
        let p = KernelPoint {
            t,
            dirty_bytes: c.dirty_bytes,
            writeback_bytes: c.writeback_bytes,
            dirty_background_threshold_bytes: c.dirty_background_threshold_bytes,
            dirty_threshold_bytes: c.dirty_threshold_bytes,
            io_some: some,
            io_full: full,
        };
        match k.ring.last_mut() {
            // The sampler runs faster than 1/s: keep the second's peak.
            Some(last) if last.t == t => {
                last.dirty_bytes = last.dirty_bytes.max(p.dirty_bytes);
                last.writeback_bytes = last.writeback_bytes.max(p.writeback_bytes);
                last.dirty_background_threshold_bytes = p.dirty_background_threshold_bytes;
                last.dirty_threshold_bytes = p.dirty_threshold_bytes;
                if !p.io_some.is_nan() {
                    last.io_some = p.io_some.max(last.io_some);
                    last.io_full = p.io_full.max(last.io_full);
                }
            }
            _ => k.ring.push(p),
        }
    }

    /// The kernel points at or after `from`, oldest first.
    pub fn kernel_since(&self, from: u32) -> Vec<KernelPoint> {
        let k = lock(&self.kernel);
        let newer = k.ring.iter().rev().take_while(|p| p.t >= from).count();
        k.ring
            .iter()
            .skip(k.ring.buf.len() - newer)
            .copied()
            .collect()
    }

    /// Bytes allocated for the points of every series (the rings are allocated whole
    /// when a target is added, so this is what an hour of history costs).
    pub fn allocated_bytes(&self) -> usize {
        let targets = self.targets.read().unwrap_or_else(|e| e.into_inner());
        let lat: usize = targets
            .values()
            .flat_map(|t| t.series.iter())
            .map(|s| {
                std::mem::size_of::<OpSeries>()
                    + lock(&s.ring).done.bytes()
                    + std::mem::size_of::<Open>()
            })
            .sum();
        lat + lock(&self.kernel).ring.bytes()
    }
}

impl OpSeries {
    /// The points at or after `from`, oldest first, including the second being filled.
    pub fn since(&self, from: u32) -> Vec<LatencyPoint> {
        let mut out = Vec::new();
        lock(&self.ring).since(from, &mut out);
        out
    }

    /// The points at or after `from` in steps of `step` seconds (see [`step_latency`]):
    /// from the coarse ring when `step` is a multiple of [`COARSE_STEP`], so an hour is
    /// 360 points to copy, not 3600 to fold.
    pub fn stepped(&self, from: u32, step: u32) -> Vec<LatencyPoint> {
        let mut out = Vec::new();
        if step > 1 && step.is_multiple_of(COARSE_STEP) {
            lock(&self.ring).since_coarse(from - from % COARSE_STEP, &mut out);
            if step == COARSE_STEP {
                return out;
            }
        } else {
            lock(&self.ring).since(from, &mut out);
        }
        step_latency(&out, step)
    }
}

/// Folds latency points into steps of `step` seconds (aligned to multiples of `step` in
/// Unix time): count summed, min of the mins, max of the maxima, and as median the
/// count-weighted median of the points' medians.
pub fn step_latency(points: &[LatencyPoint], step: u32) -> Vec<LatencyPoint> {
    if step <= 1 {
        return points.to_vec();
    }
    let mut out = Vec::new();
    let mut i = 0;
    let mut buf: Vec<(f32, u32)> = Vec::new();
    while i < points.len() {
        let t = points[i].t - points[i].t % step;
        let j = i + points[i..]
            .iter()
            .take_while(|p| p.t - p.t % step == t)
            .count();
        let group = &points[i..j];
        buf.clear();
        buf.extend(group.iter().map(|p| (p.p50, p.count)));
        let total: u32 = group.iter().map(|p| p.count).sum();
        let p50 = weighted_median(&mut buf);
        out.push(LatencyPoint {
            t,
            count: total,
            min: group.iter().map(|p| p.min).fold(f32::INFINITY, f32::min),
            p50,
            max: group
                .iter()
                .map(|p| p.max)
                .fold(f32::NEG_INFINITY, f32::max),
        });
        i = j;
    }
    out
}

/// Folds one-second kernel points into steps of `step` seconds: dirty and writeback at
/// their peak, the thresholds as last seen, PSI shares averaged.
pub fn step_kernel(points: &[KernelPoint], step: u32) -> Vec<KernelPoint> {
    if step <= 1 {
        return points.to_vec();
    }
    let mut out: Vec<KernelPoint> = Vec::new();
    let mut n = 0u32;
    for p in points {
        let t = p.t - p.t % step;
        match out.last_mut() {
            Some(o) if o.t == t => {
                n += 1;
                o.dirty_bytes = o.dirty_bytes.max(p.dirty_bytes);
                o.writeback_bytes = o.writeback_bytes.max(p.writeback_bytes);
                o.dirty_background_threshold_bytes = p.dirty_background_threshold_bytes;
                o.dirty_threshold_bytes = p.dirty_threshold_bytes;
                // A running mean; NaN (no PSI) stays NaN.
                o.io_some += (p.io_some - o.io_some) / n as f32;
                o.io_full += (p.io_full - o.io_full) / n as f32;
            }
            _ => {
                n = 1;
                out.push(KernelPoint { t, ..*p });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::{IoPressureTotals, VmCounters};
    use std::time::Instant;

    fn at(unix: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(unix)
    }

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn one_call_per_second_is_kept_as_measured_and_faster_ones_are_summarised() {
        let h = History::new();
        h.add_target(3, "t", &[(Mode::Overwrite, Op::Fsync)], ms(100));
        for (i, v) in [5u64, 1, 9, 3].iter().enumerate() {
            h.record(
                3,
                Mode::Overwrite,
                Op::Fsync,
                ms(*v),
                at(1000) + ms(i as u64),
            );
        }
        h.record(3, Mode::Overwrite, Op::Fsync, ms(7), at(1002));
        // Another op or target is not this series.
        h.record(3, Mode::Overwrite, Op::Write, ms(700), at(1002));
        h.record(4, Mode::Overwrite, Op::Fsync, ms(700), at(1002));
        let s = &h.target(3).unwrap().series[0];
        let p = s.since(0);
        assert_eq!(p.len(), 2, "{p:?}");
        assert_eq!((p[0].t, p[0].count), (1000, 4));
        assert_eq!((p[0].min, p[0].max), (0.001, 0.009));
        assert!(
            (p[0].p50 - 0.004).abs() < 1e-6,
            "median of 1,3,5,9 ms: {}",
            p[0].p50
        );
        assert_eq!((p[1].t, p[1].count, p[1].p50), (1002, 1, 0.007));
        assert_eq!(
            s.since(1001),
            vec![p[1]],
            "since is inclusive, in Unix seconds"
        );
    }

    #[test]
    fn latencies_are_kept_to_four_digits() {
        assert_eq!(round_sig(0.001_234_567, 4), 0.001_235);
        assert_eq!(round_sig(12.345_67, 4), 12.35);
        assert_eq!(round_sig(0.0, 4), 0.0);
        assert_eq!(
            serde_json::to_string(&round_sig(0.000_018_972_341, 4)).unwrap(),
            "0.00001897"
        );
    }

    #[test]
    fn an_hour_is_kept_and_no_more_at_any_interval() {
        for interval in [ms(100), ms(1000), ms(10_000)] {
            let h = History::new();
            h.add_target(0, "t", &[(Mode::Create, Op::Create)], interval);
            let step = interval.as_millis().max(1000) as u64 / 1000;
            let hours = 2 * RETAIN.as_secs();
            for s in (0..hours).step_by(step as usize) {
                h.record(0, Mode::Create, Op::Create, ms(1), at(10_000 + s));
            }
            let p = h.target(0).unwrap().series[0].since(0);
            let span = p.last().unwrap().t - p.first().unwrap().t;
            assert!(span as u64 >= RETAIN.as_secs(), "{interval:?}: {span} s");
            assert!(
                (span as u64) < RETAIN.as_secs() + 100,
                "{interval:?}: {span} s"
            );
        }
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
    fn the_coarse_ring_answers_as_folding_the_seconds_would() {
        let h = History::new();
        h.add_target(0, "t", &[(Mode::Create, Op::Create)], ms(100));
        let mut x: u64 = 88172645463325252;
        for i in 0..2000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            h.record(
                0,
                Mode::Create,
                Op::Create,
                ms(1 + x % 50),
                at(7_000) + ms(i * 130),
            );
        }
        let s = &h.target(0).unwrap().series[0];
        for from in [0, 7_003, 7_010, 7_250] {
            let want = step_latency(&s.since(from - from % 10), 10);
            assert_eq!(s.stepped(from, 10), want, "from {from}");
            // Longer steps fold the 10 s steps: the same counts and extremes; the median
            // is the weighted median of the 10 s medians.
            for step in [20, 60] {
                let want = step_latency(&s.since(from - from % 10), step);
                let got = s.stepped(from, step);
                let key = |v: &[LatencyPoint]| -> Vec<(u32, u32, f32, f32)> {
                    v.iter().map(|p| (p.t, p.count, p.min, p.max)).collect()
                };
                assert_eq!(key(&got), key(&want), "from {from} step {step}");
            }
        }
        assert_eq!(s.stepped(7_003, 5), step_latency(&s.since(7_003), 5));
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

    /// The memory figure of README/BENCHMARKS.md: 8 targets with every mode (13 ops
    /// each) at the 100 ms minimum interval, so every one-second slot of the hour is
    /// filled, plus the kernel ring. Run with `--nocapture` to see it.
    #[test]
    fn memory_of_a_full_hour_with_eight_targets() {
        let h = History::new();
        let ops: Vec<(Mode, Op)> = [
            Mode::Create,
            Mode::Overwrite,
            Mode::Direct,
            Mode::Replace,
            Mode::Append,
        ]
        .iter()
        .flat_map(|&m| {
            crate::op::ops_of(m, crate::config::SyncKind::Fsync)
                .iter()
                .map(move |&o| (m, o))
        })
        .collect();
        assert_eq!(ops.len(), 13);
        for i in 0..8 {
            h.add_target(i, &format!("t{i}"), &ops, ms(100));
        }
        let before = h.allocated_bytes();
        let t0 = Instant::now();
        for s in 0..RETAIN.as_secs() + 60 {
            for i in 0..8 {
                for &(m, o) in &ops {
                    for k in 0..10 {
                        h.record(i, m, o, ms(k + 1), at(50_000 + s) + ms(k * 100));
                    }
                }
            }
            h.record_kernel(
                &sample(t0 + Duration::from_secs(s), s, s as f64),
                at(50_000 + s),
            );
        }
        assert_eq!(h.allocated_bytes(), before, "allocated once, never grows");
        let full = h.target(7).unwrap().series[12].since(0).len();
        assert!(full as u64 > RETAIN.as_secs(), "{full} points");
        let mib = before as f64 / (1 << 20) as f64;
        println!("history: 8 targets x 13 ops at 100 ms + kernel, full hour: {before} bytes = {mib:.2} MiB");
        assert!(mib <= 8.0, "{mib:.2} MiB");
    }
}
