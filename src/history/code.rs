//! The 16-bit latency code (a float with a 6-bit exponent and a 10-bit mantissa) and
//! the rounding of what is kept.

use std::time::SystemTime;

/// `v` to `digits` significant digits: far finer than a ratio means, and a third of
/// the JSON of a full f32.
pub(super) fn round_sig(v: f32, digits: i32) -> f32 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let scale = 10f64.powi(digits - 1 - libm::log10(v.abs() as f64).floor() as i32);
    ((v as f64 * scale).round() / scale) as f32
}

/// Unix time in whole seconds.
pub(super) fn unix_secs(t: SystemTime) -> u32 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs().min(u32::MAX as u64) as u32)
}

/// The exponent of the smallest latency a code holds: 2^-40 s, about a picosecond.
/// The largest is just under 2^24 s (194 days).
pub(super) const CODE_MIN_EXP: i32 = -40;

/// A latency in seconds as a 16-bit code: 0 for zero (and anything under 2^-40 s),
/// else one more than the exponent (0-63, from `CODE_MIN_EXP`) over 10 bits of
/// mantissa, rounded to nearest, so the code is within 2^-11 of the value. Codes order
/// as the latencies do.
pub(super) fn encode(seconds: f32) -> u16 {
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
pub(super) fn decode(code: u16) -> f32 {
    if code == 0 {
        return 0.0;
    }
    let c = (code - 1) as u32;
    let e = (c >> 10) as i32 + CODE_MIN_EXP + 127;
    f32::from_bits(((e as u32) << 23) | ((c & 0x3ff) << 13))
}

/// `v` as a code would keep it.
pub(super) fn quantise(v: f32) -> f32 {
    decode(encode(v))
}
