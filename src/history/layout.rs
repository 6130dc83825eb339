//! How a series stores its hour, by its target's interval: every call's code and a
//! per-second count (1 s or slower), or a summary per second (faster), and the
//! 10-second steps below 10 s intervals.

use std::time::Duration;

use super::code::*;
use super::ring::*;
use super::step::*;

/// How far back the history reaches.
pub const RETAIN: Duration = Duration::from_secs(3600);

/// Calls of one second whose values are kept for its median; a second gets at most 10
/// at the 100 ms minimum interval. Beyond this, count/min/max stay exact and the median
/// is that of the first `MEDIAN_OF` calls.
pub(super) const MEDIAN_OF: usize = 16;

/// A second or a step as kept: the calls and the codes of the fastest, the median and
/// the slowest. 10 bytes (2-byte aligned); a count of 0 is an empty slot.
#[derive(Clone, Copy, Default)]
#[repr(C, packed(2))]
pub(super) struct Summary {
    count: u32,
    min: u16,
    p50: u16,
    max: u16,
}

impl Summary {
    pub(super) fn of(p: &LatencyPoint) -> Summary {
        Summary {
            count: p.count,
            min: encode(p.min),
            p50: encode(p.p50),
            max: encode(p.max),
        }
    }

    pub(super) fn point(self, t: u32) -> LatencyPoint {
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
pub(super) struct Open {
    t: u32,
    count: u32,
    min: f32,
    max: f32,
    n: usize,
    values: [f32; MEDIAN_OF],
}

impl Open {
    pub(super) fn new(t: u32, v: f32) -> Open {
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

    pub(super) fn add(&mut self, v: f32) {
        self.count += 1;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        if self.n < MEDIAN_OF {
            self.values[self.n] = v;
            self.n += 1;
        }
    }

    /// As it will be kept when the second closes, so it reads the same before and after.
    pub(super) fn summary(&self) -> Summary {
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

/// Calls a second holds at intervals of 1 s or more: a lane starts at most one cycle a
/// second, so a second gets its own call and one still returning from the cycle before
/// (two calls); a third needs the wall clock to step back. A call beyond is kept in the
/// next second.
pub(super) const CALLS_PER_SECOND: u32 = 3;

/// The calls of a series at intervals of 1 s or more: each call's code in order, and the
/// number of calls per second of the hour (2 bits a second).
pub(super) struct Calls {
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
    pub(super) fn new(secs: u32, calls: usize) -> Calls {
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

    pub(super) fn count(&self, s: u32) -> u32 {
        self.count_at((s % self.secs) as usize)
    }

    /// The count in slot `i`.
    pub(super) fn count_at(&self, i: usize) -> u32 {
        u32::from((self.counts[i / 4] >> (i % 4 * 2)) & 3)
    }

    pub(super) fn set_count(&mut self, s: u32, c: u32) {
        let i = (s % self.secs) as usize;
        let shift = i % 4 * 2;
        let b = &mut self.counts[i / 4];
        *b = (*b & !(3 << shift)) | ((c as u8) << shift);
    }

    /// Whether second `t` holds all the calls it can.
    pub(super) fn full(&self, t: u32) -> bool {
        self.head == Some(t) && self.count(t) == CALLS_PER_SECOND
    }

    /// A call of second `t`, not older than the newest.
    pub(super) fn push(&mut self, t: u32, code: u16) {
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
    pub(super) fn each(&self, from: u32, mut f: impl FnMut(LatencyPoint)) {
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

    pub(super) fn bytes(&self) -> usize {
        self.counts.capacity() + self.codes.capacity() * 2
    }
}

/// The seconds of a series at intervals under 1 s: a summary per second of the hour.
pub(super) struct Seconds {
    closed: Wheel<Summary>,
    open: Option<Open>,
}

impl Seconds {
    /// A call of second `t`, not older than the one being filled.
    pub(super) fn push(&mut self, t: u32, v: f32) {
        match &mut self.open {
            Some(o) if o.t == t => o.add(v),
            Some(o) => {
                self.closed.set(o.t, o.summary());
                self.open = Some(Open::new(t, v));
            }
            None => self.open = Some(Open::new(t, v)),
        }
    }

    pub(super) fn each(&self, from: u32, mut f: impl FnMut(LatencyPoint)) {
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
pub(super) enum Fine {
    Calls(Calls),
    Seconds(Seconds),
}

impl Fine {
    /// The most points it can hold.
    pub(super) fn max_points(&self) -> usize {
        match self {
            Fine::Calls(c) => c.codes.len(),
            Fine::Seconds(s) => s.closed.slots.len() + 1,
        }
    }

    pub(super) fn each(&self, from: u32, f: impl FnMut(LatencyPoint)) {
        match self {
            Fine::Calls(c) => c.each(from, f),
            Fine::Seconds(s) => s.each(from, f),
        }
    }

    /// The newest second with a call.
    pub(super) fn head(&self) -> Option<u32> {
        match self {
            Fine::Calls(c) => c.head,
            Fine::Seconds(s) => s.open.as_ref().map(|o| o.t),
        }
    }
}

pub(super) struct LatencyRing {
    fine: Fine,
    /// The closed `COARSE_STEP` steps, at intervals under `COARSE_STEP`.
    coarse: Option<Wheel<Summary>>,
}

impl LatencyRing {
    /// The storage for an hour of calls every `interval`.
    pub(super) fn new(interval: Duration) -> LatencyRing {
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

    pub(super) fn record(&mut self, t: u32, seconds: f32) {
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
    pub(super) fn since(&self, from: u32, out: &mut Vec<LatencyPoint>) {
        let seconds = self
            .fine
            .head()
            .map_or(0, |h| h.saturating_sub(from) as usize + 1);
        out.reserve(seconds.min(self.fine.max_points()));
        self.fine.each(from, |p| out.push(p));
    }

    /// The `COARSE_STEP`-second points whose step starts at or after `from`, oldest
    /// first, the step being filled included.
    pub(super) fn since_coarse(&self, from: u32, out: &mut Vec<LatencyPoint>) {
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

    pub(super) fn bytes(&self) -> usize {
        let fine = match &self.fine {
            Fine::Calls(c) => c.bytes(),
            Fine::Seconds(s) => s.closed.bytes(),
        };
        fine + self.coarse.as_ref().map_or(0, |c| c.bytes())
    }
}

/// Points an hour needs at `interval`: one per cycle, one per second at most, and two
/// more: the hour is kept whole beside the second being filled.
pub(super) fn slots_for(interval: Duration) -> usize {
    let per = interval.as_secs_f64().max(1.0);
    (RETAIN.as_secs_f64() / per).ceil() as usize + 2
}
