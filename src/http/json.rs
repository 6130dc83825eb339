//! The hand-written JSON writer of `/api/history`: columns of numbers straight into one
//! buffer, microseconds to 4 significant digits.

use std::fmt::Write as _;

/// The answer is written straight into one buffer: a first load of an hour is 14 400
/// points, and a `serde_json::Value` or a tuple per point costs more than the points.
pub(super) struct JsonOut(pub(super) Vec<u8>);

impl JsonOut {
    pub(super) fn raw(&mut self, s: &str) {
        self.0.extend_from_slice(s.as_bytes());
    }

    pub(super) fn int(&mut self, v: i64) {
        self.0
            .extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
    }

    /// A JSON string, escaped as serde_json does.
    pub(super) fn str(&mut self, s: &str) {
        serde_json::to_writer(&mut self.0, s).expect("a string serializes");
    }

    /// Seconds as microseconds to 4 significant digits (to the nanosecond below 10 µs),
    /// without trailing zeros: `0.00001897` as `18.97`.
    pub(super) fn micros(&mut self, seconds: f32) {
        if !seconds.is_finite() || seconds < 0.0 {
            self.raw("null");
            return;
        }
        // Rounded half up without a libm call (this runs 43 200 times for an hour).
        let ns = (seconds as f64 * 1e9 + 0.5) as u64;
        // The history keeps a latency to 1/2048 of itself (history/code.rs, `encode`): past 4
        // digits (10 µs and up) that is noise, 12.35 s is not 12349.44 ms. The value is
        // rounded straight to the decimals printed, with constant divisors up to 10 ms.
        let (int, mut frac, mut decimals) = match ns {
            0..10_000 => (ns / 1000, ns % 1000, 3),
            10_000..100_000 => {
                let v = (ns + 5) / 10;
                (v / 100, v % 100, 2)
            }
            100_000..1_000_000 => {
                let v = (ns + 50) / 100;
                (v / 10, v % 10, 1)
            }
            1_000_000..10_000_000 => ((ns + 500) / 1000, 0, 0),
            _ => {
                let (mut p, mut top) = (1_000u64, 10_000_000u64);
                while ns >= top && top <= u64::MAX / 10 {
                    p *= 10;
                    top *= 10;
                }
                ((ns + p / 2) / p * (p / 1000), 0, 0)
            }
        };
        self.int(int as i64);
        if frac != 0 {
            while frac.is_multiple_of(10) {
                frac /= 10;
                decimals -= 1;
            }
            let mut d = [b'.', b'0', b'0', b'0'];
            for i in (1..=decimals).rev() {
                d[i] = b'0' + (frac % 10) as u8;
                frac /= 10;
            }
            self.0.extend_from_slice(&d[..=decimals]);
        }
    }

    /// A ratio as kept (3 significant digits), `null` when unknown.
    pub(super) fn ratio(&mut self, v: f32) {
        if v.is_finite() {
            let _ = write!(self, "{v}");
        } else {
            self.raw("null");
        }
    }

    /// `"key":[v,v,...]` from `f` over `items`.
    pub(super) fn column<T>(
        &mut self,
        key: &str,
        items: &[T],
        mut f: impl FnMut(&mut JsonOut, &T),
    ) {
        self.raw(",\"");
        self.raw(key);
        self.raw("\":[");
        for (i, x) in items.iter().enumerate() {
            if i > 0 {
                self.0.push(b',');
            }
            f(self, x);
        }
        self.0.push(b']');
    }

    /// The `t` column: the first point's offset from `from`, then each point's from the
    /// one before, in seconds.
    pub(super) fn times(&mut self, from: u32, ts: impl Iterator<Item = u32>) {
        self.raw("\"t\":[");
        let mut prev = from;
        for (i, t) in ts.enumerate() {
            if i > 0 {
                self.0.push(b',');
            }
            self.int(t as i64 - prev as i64);
            prev = t;
        }
        self.0.push(b']');
    }
}

impl std::fmt::Write for JsonOut {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.raw(s);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn microseconds_to_four_digits_without_trailing_zeros() {
        let mut o = JsonOut(Vec::new());
        for v in [
            0.000_018_97f32,
            0.001_235,
            12.35,
            0.0,
            0.000_000_5,
            0.000_1,
            0.000_010_05,
            f32::NAN,
            0.001_234_567,
            0.000_123_456,
            0.000_009_876_5,
            0.000_000_123_4,
            1.234_567,
            0.000_099_996,
            0.000_999_97,
            0.009_999_7,
            0.099_996,
            3600.123,
        ] {
            o.micros(v);
            o.raw(" ");
        }
        assert_eq!(
            String::from_utf8(o.0).unwrap(),
            "18.97 1235 12350000 0 0.5 100 10.05 null 1235 123.5 9.877 0.123 1235000 100 1000 10000 100000 3600000000 "
        );
    }
}
