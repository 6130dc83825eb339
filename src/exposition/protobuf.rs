//! The protobuf exposition format (`application/vnd.google.protobuf;
//! proto=io.prometheus.client.MetricFamily;encoding=delimited`): one length-delimited
//! `io.prometheus.client.MetricFamily` message per family, written by hand in one pass
//! into one buffer (the wire format of `metrics.proto` needs varints, fixed 64-bit
//! doubles and length-prefixed messages, nothing more). Field numbers are those of
//! prometheus/client_model's `metrics.proto`; repeated scalars are written packed,
//! which every protobuf decoder accepts for proto2 fields.

/// `MetricType` values.
pub(crate) const COUNTER: u64 = 0;
pub(crate) const GAUGE: u64 = 1;
pub(crate) const HISTOGRAM: u64 = 4;

pub(crate) fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, u64::from(field << 3 | u32::from(wire)));
}

pub(crate) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

pub(crate) fn uint(out: &mut Vec<u8>, field: u32, v: u64) {
    key(out, field, 0);
    varint(out, v);
}

pub(crate) fn sint(out: &mut Vec<u8>, field: u32, v: i64) {
    key(out, field, 0);
    varint(out, zigzag(v));
}

pub(crate) fn double(out: &mut Vec<u8>, field: u32, v: f64) {
    key(out, field, 1);
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    key(out, field, 2);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// A message written by `f` after its length; the length is learnt afterwards, so one
/// byte is reserved and the body moved when it needs more (bodies of 128 bytes or more).
fn prefixed(out: &mut Vec<u8>, f: impl FnOnce(&mut Vec<u8>)) {
    let at = out.len();
    out.push(0);
    f(out);
    let len = out.len() - at - 1;
    if len < 0x80 {
        out[at] = len as u8;
    } else {
        let mut l = Vec::with_capacity(4);
        varint(&mut l, len as u64);
        out.splice(at..=at, l);
    }
}

/// A nested message in `field`.
pub(crate) fn message(out: &mut Vec<u8>, field: u32, f: impl FnOnce(&mut Vec<u8>)) {
    key(out, field, 2);
    prefixed(out, f);
}

/// A `LabelPair` in `field` (1 in `Metric` and `Exemplar`).
pub(crate) fn label_pair(out: &mut Vec<u8>, field: u32, name: &str, value: &str) {
    message(out, field, |m| {
        bytes(m, 1, name.as_bytes());
        bytes(m, 2, value.as_bytes());
    });
}

/// One length-delimited `MetricFamily`: name, help, type, then the `Metric`s (field 4)
/// that `metrics` writes.
pub(crate) fn family(
    out: &mut Vec<u8>,
    name: &str,
    help: &str,
    kind: u64,
    metrics: impl FnOnce(&mut Vec<u8>),
) {
    prefixed(out, |f| {
        bytes(f, 1, name.as_bytes());
        if !help.is_empty() {
            bytes(f, 2, help.as_bytes());
        }
        uint(f, 3, kind);
        metrics(f);
    });
}

/// A `Metric` (field 4 of the family) with pre-encoded label pairs and a counter or
/// gauge value.
pub(crate) fn scalar_metric(out: &mut Vec<u8>, labels: &[u8], kind: u64, v: f64) {
    message(out, 4, |m| {
        m.extend_from_slice(labels);
        // Counter is field 3 of Metric, Gauge field 2; both hold the value in field 1.
        message(m, if kind == COUNTER { 3 } else { 2 }, |c| double(c, 1, v));
    });
}

/// A `google.protobuf.Timestamp` in `field` from Unix seconds.
pub(crate) fn timestamp(out: &mut Vec<u8>, field: u32, unix: f64) {
    let secs = unix.floor();
    let nanos = ((unix - secs) * 1e9).round().min(999_999_999.0);
    message(out, field, |t| {
        uint(t, 1, secs as i64 as u64);
        uint(t, 2, nanos as u64);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_zigzag() {
        let mut o = Vec::new();
        varint(&mut o, 300);
        assert_eq!(o, [0xac, 0x02]);
        assert_eq!(zigzag(0), 0);
        assert_eq!(zigzag(-1), 1);
        assert_eq!(zigzag(1), 2);
        assert_eq!(zigzag(-80), 159);
    }

    #[test]
    fn long_messages_get_a_longer_length() {
        let mut o = Vec::new();
        message(&mut o, 4, |m| m.extend(std::iter::repeat_n(7u8, 300)));
        assert_eq!(&o[..3], [0x22, 0xac, 0x02]);
        assert_eq!(o.len(), 303);
    }
}
