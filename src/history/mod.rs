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
//! uptime. The probe lanes and the sampler write under a per-series lock held for a few
//! stores; readers hold it only to copy the points out. Neither ever holds it across a
//! system call, so a lane never waits on a page load beyond that copy.

use std::collections::BTreeMap;
use std::ops::{Range, RangeInclusive};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use crate::base::labels::{Mode, Op};
use crate::base::sync::lock;
use crate::kernel::vm::VmSample;

/// How far back the history reaches.
pub const RETAIN: Duration = Duration::from_secs(3600);

/// Calls of one second whose values are kept for its median; a second gets at most 10
/// at the 100 ms minimum interval. Beyond this, count/min/max stay exact and the median
/// is that of the first `MEDIAN_OF` calls.
const MEDIAN_OF: usize = 16;

/// `v` to `digits` significant digits: far finer than a ratio means, and a third of
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

/// The exponent of the smallest latency a code holds: 2^-40 s, about a picosecond.
/// The largest is just under 2^24 s (194 days).
const CODE_MIN_EXP: i32 = -40;

/// A latency in seconds as a 16-bit code: 0 for zero (and anything under 2^-40 s),
/// else one more than the exponent (0-63, from `CODE_MIN_EXP`) over 10 bits of
/// mantissa, rounded to nearest, so the code is within 2^-11 of the value. Codes order
/// as the latencies do.
fn encode(seconds: f32) -> u16 {
    if seconds.is_nan() || seconds <= 0.0 {
        return 0;
    }
    // Half an ulp of the 10-bit mantissa; a carry moves into the exponent, as it should.
    let bits = seconds.to_bits() + (1 << 12);
    let e = (bits >> 23) as i32 - 127 - CODE_MIN_EXP;
    if e < 0 {
        return 0;
    }
    (((e as u32) << 10) | ((bits >> 13) & 0x3ff)).min(u16::MAX as u32 - 1) as u16 + 1
}

/// The latency a code stands for; `encode(decode(c)) == c`.
fn decode(code: u16) -> f32 {
    if code == 0 {
        return 0.0;
    }
    let c = (code - 1) as u32;
    let e = (c >> 10) as i32 + CODE_MIN_EXP + 127;
    f32::from_bits(((e as u32) << 23) | ((c & 0x3ff) << 13))
}

/// `v` as a code would keep it.
fn quantise(v: f32) -> f32 {
    decode(encode(v))
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

/// A slot per key (a Unix second, or a step) for the last `slots.len()` keys up to the
/// newest one written, key `k` at `k % len`; allocated once. Moving to a newer key
/// empties the slots of the keys passed, whose slots held keys that fell out.
struct Wheel<T> {
    slots: Vec<T>,
    /// The newest key written.
    head: Option<u32>,
}

impl<T: Copy + Default> Wheel<T> {
    fn new(n: usize) -> Wheel<T> {
        Wheel {
            slots: vec![T::default(); n],
            head: None,
        }
    }

    fn len(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Writes key `k`, which is not older than the newest.
    fn set(&mut self, k: u32, v: T) {
        let n = self.len();
        if let Some(h) = self.head.filter(|&h| k > h) {
            for key in passed(h, k, n) {
                self.slots[(key % n) as usize] = T::default();
            }
        }
        self.head = Some(self.head.map_or(k, |h| h.max(k)));
        self.slots[(k % n) as usize] = v;
    }

    /// The keys at or after `from` the wheel still holds, oldest first, with their slots.
    fn since(&self, from: u32) -> impl Iterator<Item = (u32, T)> + '_ {
        let keys = match self.head {
            Some(h) => held(h, from, self.len()),
            None => 0..0,
        };
        keys.clone()
            .zip(slots_from(keys.start, keys.len(), self.slots.len()))
            .map(|(k, i)| (k, self.slots[i]))
    }

    fn bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<T>()
    }
}

/// The keys a ring of `len` slots whose newest key is `h` clears to take `k`, newer
/// than `h`: those after `h`, the last `len` at most.
fn passed(h: u32, k: u32, len: u32) -> RangeInclusive<u32> {
    (h + 1).max(k.saturating_sub(len - 1))..=k
}

/// The keys at or after `from` that a ring of `len` slots whose newest key is `h` still
/// holds.
fn held(h: u32, from: u32, len: u32) -> Range<u32> {
    from.max((h + 1).saturating_sub(len))..h + 1
}

/// The slot indices of `n` keys from `key` in a wheel of `len` slots, without a
/// division per key.
fn slots_from(key: u32, n: usize, len: usize) -> impl Iterator<Item = usize> {
    let start = key as usize % len;
    (start..start + n).map(move |i| if i >= len { i - len } else { i })
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

/// A second or a step as kept: the calls and the codes of the fastest, the median and
/// the slowest. 10 bytes (2-byte aligned); a count of 0 is an empty slot.
#[derive(Clone, Copy, Default)]
#[repr(C, packed(2))]
struct Summary {
    count: u32,
    min: u16,
    p50: u16,
    max: u16,
}

impl Summary {
    fn of(p: &LatencyPoint) -> Summary {
        Summary {
            count: p.count,
            min: encode(p.min),
            p50: encode(p.p50),
            max: encode(p.max),
        }
    }

    fn point(self, t: u32) -> LatencyPoint {
        LatencyPoint {
            t,
            count: self.count,
            min: decode(self.min),
            p50: decode(self.p50),
            max: decode(self.max),
        }
    }
}

/// The second being filled, at intervals under a second.
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

    /// As it will be kept when the second closes, so it reads the same before and after.
    fn summary(&self) -> Summary {
        let mut v = self.values;
        let v = &mut v[..self.n];
        v.sort_by(f32::total_cmp);
        let p50 = if v.len() % 2 == 1 {
            v[v.len() / 2]
        } else {
            (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
        };
        Summary {
            count: self.count,
            min: encode(self.min),
            p50: encode(p50),
            max: encode(self.max),
        }
    }
}

/// Seconds per point of the coarse steps, which answer the 1 h view without folding an
/// hour of one-second points at every page load.
pub const COARSE_STEP: u32 = 10;

/// Calls a second holds at intervals of 1 s or more: a lane starts at most one cycle a
/// second, so a second gets its own call and one still returning from the cycle before
/// (two calls); a third needs the wall clock to step back. A call beyond is kept in the
/// next second.
const CALLS_PER_SECOND: u32 = 3;

/// The calls of a series at intervals of 1 s or more: each call's code in order, and the
/// number of calls per second of the hour (2 bits a second).
struct Calls {
    /// Calls of second `s` at bits `2 * (s % secs)`.
    counts: Vec<u8>,
    secs: u32,
    /// A ring of the calls' codes, oldest at `end - len`.
    codes: Vec<u16>,
    end: usize,
    /// The calls kept: the sum of the counts.
    len: usize,
    /// The newest second with a call.
    head: Option<u32>,
    /// No second before it holds a call.
    tail: u32,
}

impl Calls {
    fn new(secs: u32, calls: usize) -> Calls {
        Calls {
            counts: vec![0; secs.div_ceil(4) as usize],
            secs,
            codes: vec![0; calls],
            end: 0,
            len: 0,
            head: None,
            tail: 0,
        }
    }

    fn count(&self, s: u32) -> u32 {
        self.count_at((s % self.secs) as usize)
    }

    /// The count in slot `i`.
    fn count_at(&self, i: usize) -> u32 {
        u32::from((self.counts[i / 4] >> (i % 4 * 2)) & 3)
    }

    fn set_count(&mut self, s: u32, c: u32) {
        let i = (s % self.secs) as usize;
        let shift = i % 4 * 2;
        let b = &mut self.counts[i / 4];
        *b = (*b & !(3 << shift)) | ((c as u8) << shift);
    }

    /// Whether second `t` holds all the calls it can.
    fn full(&self, t: u32) -> bool {
        self.head == Some(t) && self.count(t) == CALLS_PER_SECOND
    }

    /// A call of second `t`, not older than the newest.
    fn push(&mut self, t: u32, code: u16) {
        if let Some(h) = self.head.filter(|&h| t > h) {
            // The seconds after h take the slots of those that fall out of the hour.
            for s in passed(h, t, self.secs) {
                self.len -= self.count(s) as usize;
                self.set_count(s, 0);
            }
        }
        self.head = Some(t);
        self.tail = self.tail.max((t + 1).saturating_sub(self.secs));
        if self.len == self.codes.len() {
            // More calls than an hour of cycles (only when the clock stepped): the
            // oldest goes.
            while self.count(self.tail) == 0 {
                self.tail += 1;
            }
            let c = self.count(self.tail);
            self.set_count(self.tail, c - 1);
            self.len -= 1;
        }
        self.codes[self.end] = code;
        self.end = (self.end + 1) % self.codes.len();
        self.len += 1;
        let c = self.count(t);
        self.set_count(t, c + 1);
    }

    /// The seconds at or after `from` with calls, oldest first.
    fn each(&self, from: u32, mut f: impl FnMut(LatencyPoint)) {
        let Some(h) = self.head else {
            return;
        };
        let seconds = held(h, from, self.secs);
        let slots = || slots_from(seconds.start, seconds.len(), self.secs as usize);
        let k: usize = slots().map(|i| self.count_at(i) as usize).sum();
        let cap = self.codes.len();
        let mut i = (self.end + cap - k) % cap;
        for (s, slot) in seconds.clone().zip(slots()) {
            let c = self.count_at(slot) as usize;
            if c == 0 {
                continue;
            }
            if c == 1 {
                // The usual second: its one call is its min, median and max.
                let v = decode(self.codes[i]);
                i = if i + 1 == cap { 0 } else { i + 1 };
                f(LatencyPoint {
                    t: s,
                    count: 1,
                    min: v,
                    p50: v,
                    max: v,
                });
                continue;
            }
            let mut v = [0u16; CALLS_PER_SECOND as usize];
            for x in &mut v[..c] {
                *x = self.codes[i];
                i = if i + 1 == cap { 0 } else { i + 1 };
            }
            let v = &mut v[..c];
            v.sort_unstable();
            let p50 = if c % 2 == 1 {
                decode(v[c / 2])
            } else {
                quantise((decode(v[c / 2 - 1]) + decode(v[c / 2])) / 2.0)
            };
            f(LatencyPoint {
                t: s,
                count: c as u32,
                min: decode(v[0]),
                p50,
                max: decode(v[c - 1]),
            });
        }
    }

    fn bytes(&self) -> usize {
        self.counts.capacity() + self.codes.capacity() * 2
    }
}

/// The seconds of a series at intervals under 1 s: a summary per second of the hour.
struct Seconds {
    closed: Wheel<Summary>,
    open: Option<Open>,
}

impl Seconds {
    /// A call of second `t`, not older than the one being filled.
    fn push(&mut self, t: u32, v: f32) {
        match &mut self.open {
            Some(o) if o.t == t => o.add(v),
            Some(o) => {
                self.closed.set(o.t, o.summary());
                self.open = Some(Open::new(t, v));
            }
            None => self.open = Some(Open::new(t, v)),
        }
    }

    fn each(&self, from: u32, mut f: impl FnMut(LatencyPoint)) {
        for (t, s) in self.closed.since(from) {
            if s.count > 0 {
                f(s.point(t));
            }
        }
        if let Some(o) = self.open.as_ref().filter(|o| o.t >= from) {
            f(o.summary().point(o.t));
        }
    }
}

/// How a series keeps its seconds (module doc).
enum Fine {
    Calls(Calls),
    Seconds(Seconds),
}

impl Fine {
    /// The most points it can hold.
    fn max_points(&self) -> usize {
        match self {
            Fine::Calls(c) => c.codes.len(),
            Fine::Seconds(s) => s.closed.slots.len() + 1,
        }
    }

    fn each(&self, from: u32, f: impl FnMut(LatencyPoint)) {
        match self {
            Fine::Calls(c) => c.each(from, f),
            Fine::Seconds(s) => s.each(from, f),
        }
    }

    /// The newest second with a call.
    fn head(&self) -> Option<u32> {
        match self {
            Fine::Calls(c) => c.head,
            Fine::Seconds(s) => s.open.as_ref().map(|o| o.t),
        }
    }
}

/// A step being folded from its seconds, as [`step_latency`] folds them.
#[derive(Clone, Copy)]
struct StepFold {
    t: u32,
    count: u32,
    min: f32,
    max: f32,
    n: usize,
    /// Each second's median and call count.
    medians: [(f32, u32); COARSE_STEP as usize],
}

impl StepFold {
    fn new(t: u32) -> StepFold {
        StepFold {
            t,
            count: 0,
            min: f32::INFINITY,
            max: f32::NEG_INFINITY,
            n: 0,
            medians: [(0.0, 0); COARSE_STEP as usize],
        }
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
    fine: Fine,
    /// The closed `COARSE_STEP` steps, at intervals under `COARSE_STEP`.
    coarse: Option<Wheel<Summary>>,
}

impl LatencyRing {
    /// The storage for an hour of calls every `interval`.
    fn new(interval: Duration) -> LatencyRing {
        // The hour whole beside the second being filled.
        let secs = RETAIN.as_secs() as u32 + 2;
        let fine = if interval >= Duration::from_secs(1) {
            // A few more than the cycles of an hour: the wall clock may run a little
            // slow against the lane's schedule.
            Fine::Calls(Calls::new(secs, slots_for(interval) + 2))
        } else {
            Fine::Seconds(Seconds {
                closed: Wheel::new(secs as usize - 1),
                open: None,
            })
        };
        let coarse = (interval < Duration::from_secs(COARSE_STEP as u64))
            .then(|| Wheel::new(secs.div_ceil(COARSE_STEP) as usize + 1));
        LatencyRing { fine, coarse }
    }

    fn record(&mut self, t: u32, seconds: f32) {
        // A clock stepped back: into the newest second rather than back in time.
        let head = self.fine.head();
        let mut t = head.map_or(t, |h| h.max(t));
        if let Fine::Calls(c) = &self.fine {
            if c.full(t) {
                t += 1;
            }
        }
        if let (Some(h), Some(coarse)) = (head, &mut self.coarse) {
            if t / COARSE_STEP != h / COARSE_STEP {
                // The step of h is complete.
                let mut s = StepFold::new(h - h % COARSE_STEP);
                self.fine.each(s.t, |p| s.add(&p));
                coarse.set(h / COARSE_STEP, Summary::of(&s.point()));
            }
        }
        match &mut self.fine {
            Fine::Calls(c) => c.push(t, encode(seconds)),
            Fine::Seconds(s) => s.push(t, seconds),
        }
    }

    /// The one-second points at or after `from`, oldest first.
    fn since(&self, from: u32, out: &mut Vec<LatencyPoint>) {
        let seconds = self
            .fine
            .head()
            .map_or(0, |h| h.saturating_sub(from) as usize + 1);
        out.reserve(seconds.min(self.fine.max_points()));
        self.fine.each(from, |p| out.push(p));
    }

    /// The `COARSE_STEP`-second points whose step starts at or after `from`, oldest
    /// first, the step being filled included.
    fn since_coarse(&self, from: u32, out: &mut Vec<LatencyPoint>) {
        let Some(h) = self.fine.head() else {
            return;
        };
        let Some(coarse) = &self.coarse else {
            let mut fine = Vec::new();
            self.since(from, &mut fine);
            out.extend(step_latency(&fine, COARSE_STEP));
            return;
        };
        let open = h - h % COARSE_STEP;
        out.reserve((open.saturating_sub(from) / COARSE_STEP) as usize + 1);
        for (k, s) in coarse.since(from.div_ceil(COARSE_STEP)) {
            if s.count > 0 {
                out.push(s.point(k * COARSE_STEP));
            }
        }
        if open >= from {
            let mut s = StepFold::new(open);
            self.fine.each(open, |p| s.add(&p));
            out.push(s.point());
        }
    }

    fn bytes(&self) -> usize {
        let fine = match &self.fine {
            Fine::Calls(c) => c.bytes(),
            Fine::Seconds(s) => s.closed.bytes(),
        };
        fine + self.coarse.as_ref().map_or(0, |c| c.bytes())
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

/// Points an hour needs at `interval`: one per cycle, one per second at most, and two
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
            lock(&s.ring).record(unix_secs(at), elapsed.as_secs_f32());
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

    /// Bytes allocated for every series (each with all it stores, the 10 s steps
    /// included) and the kernel ring: they are allocated whole when a target is added,
    /// so this is what an hour of history costs.
    pub fn allocated_bytes(&self) -> usize {
        let targets = self.targets.read().unwrap_or_else(|e| e.into_inner());
        let lat: usize = targets
            .values()
            .flat_map(|t| t.series.iter())
            .map(|s| std::mem::size_of::<OpSeries>() + lock(&s.ring).bytes())
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
    use crate::kernel::vm::{IoPressureTotals, VmCounters};
    use std::time::Instant;

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

    /// The memory figures of README/BENCHMARKS.md, each filled synthetically for a full
    /// hour with the kernel ring: 8 and 64 targets with the default modes (5 ops) at a
    /// 1 s interval (and 8 at the default 10 s), and the worst case the configuration allows, 8 targets with every
    /// mode (13 ops each) at the 100 ms minimum, every second of the hour filled. Run
    /// with `--nocapture` to see them.
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
