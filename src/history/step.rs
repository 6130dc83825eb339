//! Points and their folding into steps: a second's or a step's latencies, a second of
//! the kernel's state, and the fold of seconds into the steps a query asks for.

/// Seconds per point of the coarse steps, which answer the 1 h view without folding an
/// hour of one-second points at every page load.
pub const COARSE_STEP: u32 = 10;

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

/// A step being folded from its seconds, as [`step_latency`] folds them.
#[derive(Clone, Copy)]
pub(super) struct StepFold {
    pub(super) t: u32,
    count: u32,
    min: f32,
    max: f32,
    n: usize,
    /// Each second's median and call count.
    medians: [(f32, u32); COARSE_STEP as usize],
}

impl StepFold {
    pub(super) fn new(t: u32) -> StepFold {
        StepFold {
            t,
            count: 0,
            min: f32::INFINITY,
            max: f32::NEG_INFINITY,
            n: 0,
            medians: [(0.0, 0); COARSE_STEP as usize],
        }
    }

    pub(super) fn add(&mut self, p: &LatencyPoint) {
        self.count += p.count;
        self.min = self.min.min(p.min);
        self.max = self.max.max(p.max);
        if self.n < self.medians.len() {
            self.medians[self.n] = (p.p50, p.count);
            self.n += 1;
        }
    }

    pub(super) fn point(&self) -> LatencyPoint {
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
pub(super) fn weighted_median(v: &mut [(f32, u32)]) -> f32 {
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
