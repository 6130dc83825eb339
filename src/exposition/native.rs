//! The native (sparse exponential) buckets of a latency histogram, as Prometheus's
//! native histograms define them, kept beside the classic buckets and updated with them
//! at each observation (under the series' one lock).
//!
//! - **Schema 3** at the start: bucket `i` holds the values in `(2^((i-1)/8), 2^(i/8)]`,
//!   a factor of 2^(1/8) ≈ 1.09 between bounds (a quantile is off by at most ~4.4 %
//!   from the bucket's geometric middle). The index of `v` is `ceil(log2(v) · 2^schema)`.
//! - **Zero bucket**: values at or below [`ZERO_THRESHOLD`] = 2^-30 s ≈ 0.93 ns. The
//!   probes time with `CLOCK_MONOTONIC` in whole nanoseconds, so every call that took
//!   any time at all (≥ 1 ns) gets an exponential bucket of its own; only a zero reading
//!   (a clock that did not advance) lands in the zero bucket. 2^-30 is also a bucket
//!   bound at every schema down to −1, so there the zero bucket overlaps no regular one.
//! - **At most [`MAX_BUCKETS`] populated buckets** per series. When an observation would
//!   populate one more, the resolution is halved (schema − 1, each pair of buckets
//!   merged into one), as client_golang does when no reset interval is configured; the
//!   series keeps the lower schema until the agent restarts. Never below schema −4.
//!   Probe latencies from 10 µs to 300 s span 25 doublings: 200 buckets at schema 3 if
//!   every one of them were populated, so a lane that sees the whole range over its
//!   life ends at schema 2 (factor 1.19); a healthy disk populates 20–80.

/// Values at or below this many seconds are counted in the zero bucket.
pub const ZERO_THRESHOLD: f64 = 1.0 / (1u64 << 30) as f64;
/// The schema a series starts at.
pub const SCHEMA: i8 = 3;
/// The most populated buckets a series keeps before lowering its schema.
pub const MAX_BUCKETS: usize = 160;
/// The lowest schema Prometheus accepts.
const MIN_SCHEMA: i8 = -4;

/// Native buckets of one series: the schema, the zero bucket and the populated positive
/// buckets in index order (latencies are never negative).
#[derive(Clone, Debug, PartialEq)]
pub struct Native {
    pub schema: i8,
    pub zero_count: u64,
    /// (index, count), ascending by index, counts > 0.
    pub buckets: Vec<(i32, u64)>,
}

impl Default for Native {
    fn default() -> Native {
        Native {
            schema: SCHEMA,
            zero_count: 0,
            buckets: Vec::new(),
        }
    }
}

/// The index of the bucket of `v` (> 0, finite) at `schema`: `ceil(log2(v) · 2^schema)`.
pub fn index(v: f64, schema: i8) -> i32 {
    if schema <= 0 {
        // Exact from the binary exponent: v = frac · 2^exp with frac in [0.5, 1), so
        // ceil(log2 v) is exp, or exp − 1 for an exact power of two.
        let bits = v.to_bits();
        let (exp, exact) = if bits >> 52 == 0 {
            // Subnormal: far below the zero threshold, never asked for.
            (-1074, false)
        } else {
            (
                ((bits >> 52) & 0x7ff) as i32 - 1022,
                bits & ((1 << 52) - 1) == 0,
            )
        };
        let e = if exact { exp - 1 } else { exp };
        // ceil(e / 2^-schema)
        let shift = -i32::from(schema);
        (e + (1 << shift) - 1) >> shift
    } else {
        (libm::log2(v) * f64::from(1u32 << schema)).ceil() as i32
    }
}

impl Native {
    /// Counts `v` (seconds, ≥ 0).
    pub fn observe(&mut self, v: f64) {
        if v.is_nan() || v <= ZERO_THRESHOLD {
            self.zero_count += 1;
            return;
        }
        let i = index(v, self.schema);
        match self.buckets.binary_search_by_key(&i, |b| b.0) {
            Ok(at) => self.buckets[at].1 += 1,
            Err(at) => {
                self.buckets.insert(at, (i, 1));
                while self.buckets.len() > MAX_BUCKETS && self.schema > MIN_SCHEMA {
                    self.halve();
                }
            }
        }
    }

    /// Schema − 1: bucket `i` goes to `ceil(i / 2)`.
    fn halve(&mut self) {
        self.schema -= 1;
        let mut merged: Vec<(i32, u64)> = Vec::with_capacity(self.buckets.len() / 2 + 1);
        for &(i, c) in &self.buckets {
            let j = (i + 1) >> 1;
            match merged.last_mut() {
                Some(last) if last.0 == j => last.1 += c,
                _ => merged.push((j, c)),
            }
        }
        self.buckets = merged;
    }

    /// The populated buckets as spans (offset from the end of the previous span, or
    /// from index 0 for the first; length) and deltas (each count minus the previous
    /// one, the first against 0), as the protobuf format wants them. Gaps of one or two
    /// empty buckets are sent as zero deltas inside a span (cheaper than a new span),
    /// as client_golang does.
    pub fn spans_and_deltas(&self, spans: &mut Vec<(i32, u32)>, deltas: &mut Vec<i64>) {
        spans.clear();
        deltas.clear();
        let mut prev_count = 0i64;
        let mut next_index = 0i32;
        for (n, &(i, c)) in self.buckets.iter().enumerate() {
            let gap = i - next_index;
            if n == 0 || gap > 2 {
                spans.push((if n == 0 { i } else { gap }, 0));
            } else {
                for _ in 0..gap {
                    deltas.push(-prev_count);
                    prev_count = 0;
                }
                if let Some(s) = spans.last_mut() {
                    s.1 += gap as u32;
                }
            }
            if let Some(s) = spans.last_mut() {
                s.1 += 1;
            }
            deltas.push(c as i64 - prev_count);
            prev_count = c as i64;
            next_index = i + 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_at_schema_3_are_ceil_log2_times_8() {
        assert_eq!(index(1.0, 3), 0);
        assert_eq!(index(1.0000001, 3), 1);
        assert_eq!(index(2.0, 3), 8);
        assert_eq!(index(0.5, 3), -8);
        // 1 ms: log2 = -9.966 → × 8 = -79.7 → -79
        assert_eq!(index(0.001, 3), -79);
        let ub = |i: i32| (f64::from(i) / 8.0).exp2();
        for v in [1e-6, 3.3e-5, 0.0015, 0.0125, 0.3, 7.0, 299.0] {
            let i = index(v, 3);
            assert!(
                ub(i - 1) < v && v <= ub(i) * (1.0 + 1e-12),
                "{v} in bucket {i}"
            );
        }
    }

    #[test]
    fn indexes_as_the_c_librarys_log2_gives_them() {
        // The probes' readings are whole nanoseconds: 1 ns to ~300 s, log-spaced, and
        // the nanoseconds on either side of each schema-3 bound.
        let mut ns = 1u64;
        let mut readings = Vec::new();
        while ns < 300_000_000_000 {
            readings.push(ns);
            ns += ns / 64 + 1;
        }
        for i in -240..70 {
            let bound = (f64::from(i) / 8.0).exp2() * 1e9;
            let b = bound as u64;
            readings.extend([b.saturating_sub(1), b, b + 1]);
        }
        for ns in readings.into_iter().filter(|&n| n > 0) {
            let v = ns as f64 / 1e9;
            for schema in 1..=3 {
                let c = (v.log2() * f64::from(1u32 << schema)).ceil() as i32;
                assert_eq!(index(v, schema), c, "{ns} ns at schema {schema}");
            }
        }
    }

    #[test]
    fn indexes_at_low_schemas_from_the_exponent() {
        assert_eq!(index(1.0, 0), 0);
        assert_eq!(index(1.5, 0), 1);
        assert_eq!(index(2.0, 0), 1);
        assert_eq!(index(2.1, 0), 2);
        assert_eq!(index(0.3, 0), -1);
        assert_eq!(index(4.0, -1), 1);
        assert_eq!(index(4.1, -1), 2);
        assert_eq!(index(16.0, -2), 1);
        assert_eq!(index(17.0, -2), 2);
        assert_eq!(index(0.25, -1), -1);
        assert_eq!(index(0.2, -1), -1);
        assert_eq!(index(0.1, -1), -1);
        assert_eq!(index(0.06, -1), -2);
    }

    #[test]
    fn the_zero_bucket_takes_only_a_zero_reading() {
        let mut n = Native::default();
        n.observe(0.0);
        n.observe(1e-9);
        assert_eq!(n.zero_count, 1);
        assert_eq!(n.buckets, vec![(index(1e-9, 3), 1)]);
        const { assert!(ZERO_THRESHOLD < 1e-9) };
    }

    #[test]
    fn too_many_buckets_halve_the_resolution() {
        let mut n = Native::default();
        // 25 doublings × 8 = 200 distinct buckets at schema 3.
        let mut total = 0;
        for k in 0..200 {
            n.observe(1e-5 * (f64::from(k) / 8.0).exp2() * 1.01);
            total += 1;
        }
        assert_eq!(n.schema, 2);
        assert!(n.buckets.len() <= MAX_BUCKETS);
        assert_eq!(n.buckets.iter().map(|b| b.1).sum::<u64>(), total);
        assert!(n.buckets.windows(2).all(|w| w[0].0 < w[1].0));
        // Each value still lies in its merged bucket.
        let mut check = Native {
            schema: 2,
            ..Native::default()
        };
        for k in 0..200 {
            check.observe(1e-5 * (f64::from(k) / 8.0).exp2() * 1.01);
        }
        assert_eq!(check.buckets, n.buckets);
    }

    #[test]
    fn spans_and_deltas_as_the_format_wants() {
        let n = Native {
            schema: 3,
            zero_count: 0,
            buckets: vec![(-80, 2), (-79, 5), (-77, 1), (-60, 4)],
        };
        let (mut s, mut d) = (Vec::new(), Vec::new());
        n.spans_and_deltas(&mut s, &mut d);
        assert_eq!(s, vec![(-80, 4), (16, 1)]);
        assert_eq!(d, vec![2, 3, -5, 1, 3]);
        let empty = Native::default();
        empty.spans_and_deltas(&mut s, &mut d);
        assert!(s.is_empty() && d.is_empty());
    }
}
