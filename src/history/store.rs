//! The whole history: per target and op a series, and the kernel's seconds; written by
//! the lanes and the sampler under each series' own lock, read by the page.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use super::code::*;
use super::layout::*;
use super::ring::*;
use super::step::*;
use crate::base::labels::{Mode, Op};
use crate::base::sync::lock;
use crate::kernel::vm::VmSample;

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

impl TargetHistory {
    /// A call of `mode` `op` completed at `at` after `elapsed`. The lanes' pending
    /// calls (`probe/pending.rs`) record into the history they looked up once
    /// ([`History::target`]), without the whole history's lock.
    pub fn record(&self, mode: Mode, op: Op, elapsed: Duration, at: SystemTime) {
        if let Some(s) = self.series.iter().find(|s| s.mode == mode && s.op == op) {
            lock(&s.ring).record(unix_secs(at), elapsed.as_secs_f32());
        }
    }
}

pub(super) struct KernelRing {
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
        if let Some(t) = self.target(index) {
            t.record(mode, op, elapsed, at);
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
