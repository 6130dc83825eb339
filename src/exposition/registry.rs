//! The exposition: one registry into which each module registers the families it owns
//! (probe, stall log, sampler), plus the agent's own `stallwatch_build_info` and
//! `process_*`. Families are encoded in name order, whoever registered them.

use std::fmt::Write as _;
use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use prometheus::proto::{MetricFamily, MetricType};
use prometheus::{IntGaugeVec, Opts, TextEncoder};

use crate::base::sync::lock;
use crate::exposition::family::{escape, header, sample, Dialect, Family};

/// The crate's registry for the small families, beside the [`Family`]s that write
/// their own text (every family with a series per target: the probe histograms,
/// counters and gauges, the stall counters). It derefs to the crate's registry, so
/// `register(Box::new(collector))` works as there.
#[derive(Default)]
pub struct Registry {
    crate_families: prometheus::Registry,
    direct: Mutex<Vec<Arc<dyn Family>>>,
    /// Run before each encoding: the probe lanes record the calls they hold.
    before: Mutex<Vec<BeforeEncode>>,
    /// The buffer of the last scrape's body, once it has been sent ([`Spare`]).
    spare: Arc<Mutex<Vec<u8>>>,
    /// Length of the last text and protobuf exposition: the next one reserves about
    /// that much, not grown from nothing (1.2 MB of text with 64 targets).
    last_len: AtomicUsize,
    last_pb_len: AtomicUsize,
}

type BeforeEncode = Box<dyn Fn() + Send + Sync>;

impl Registry {
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Adds a family that writes its own text. Panics on a name already registered
    /// either way: two families of one name would be an invalid exposition.
    pub fn register_family(&self, f: Arc<dyn Family>) {
        let mut direct = lock(&self.direct);
        let name = f.name().to_owned();
        assert!(
            direct.iter().all(|d| d.name() != name)
                && self
                    .crate_families
                    .gather()
                    .iter()
                    .all(|mf| mf.name() != name),
            "family {name} registered twice"
        );
        direct.push(f);
        direct.sort_by(|a, b| a.name().cmp(b.name()));
    }

    /// Registers `f` as [`Registry::register_family`] does and returns it, for its owner
    /// to write into.
    pub fn add_family<F: Family + 'static>(&self, f: F) -> Arc<F> {
        let f = Arc::new(f);
        self.register_family(Arc::clone(&f) as _);
        f
    }

    /// Runs `f` before each encoding, so what the families hold is current.
    pub fn before_encode(&self, f: impl Fn() + Send + Sync + 'static) {
        lock(&self.before).push(Box::new(f));
    }

    fn run_before(&self) {
        for f in lock(&self.before).iter() {
            f();
        }
    }
}

impl Deref for Registry {
    type Target = prometheus::Registry;

    fn deref(&self) -> &prometheus::Registry {
        &self.crate_families
    }
}

/// A registry holding the families that belong to no module: the build and the process.
pub fn registry() -> Registry {
    let r = Registry::new();
    let build = IntGaugeVec::new(
        Opts::new("stallwatch_build_info", "The running stallwatch version."),
        &["version"],
    )
    .expect("valid metric definition");
    build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
    r.register(Box::new(build)).expect("registered once");
    let pc = prometheus::process_collector::ProcessCollector::for_self();
    r.register(Box::new(pc)).expect("registered once");
    r
}

/// The formats a scrape can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `text/plain; version=0.0.4`: the classic buckets only. The default.
    Text,
    /// Length-delimited `io.prometheus.client.MetricFamily` messages: classic and native.
    Protobuf,
    /// `application/openmetrics-text; version=1.0.0`: the classic buckets with exemplars.
    OpenMetrics,
}

impl Format {
    /// The format for a request's `Accept` header, as client_golang's `expfmt.Negotiate`
    /// picks it: the acceptable type of highest `q` (the first of equal ones) among those
    /// served; protobuf only when asked for with `proto=io.prometheus.client.MetricFamily`
    /// and `encoding=delimited`; text for anything else, and without the header.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let mut best = (Format::Text, -1.0f64);
        for range in accept.unwrap_or("").split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let (mut q, mut proto, mut encoding, mut version) = (1.0, "", "", "");
            for p in parts {
                let Some((k, v)) = p.split_once('=') else {
                    continue;
                };
                let v = v.trim().trim_matches('"');
                match k.trim().to_ascii_lowercase().as_str() {
                    "q" => q = v.parse().unwrap_or(0.0),
                    "proto" => proto = v,
                    "encoding" => encoding = v,
                    "version" => version = v,
                    _ => {}
                }
            }
            let format = match media.as_str() {
                "application/vnd.google.protobuf"
                    if proto == "io.prometheus.client.MetricFamily" && encoding == "delimited" =>
                {
                    Format::Protobuf
                }
                "application/openmetrics-text" if matches!(version, "" | "1.0.0" | "0.0.1") => {
                    Format::OpenMetrics
                }
                "text/plain" | "*/*" | "text/*" => Format::Text,
                _ => continue,
            };
            if q > 0.0 && q > best.1 {
                best = (format, q);
            }
        }
        best.0
    }

    /// The response's `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::Protobuf => {
                "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"
            }
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// Encodes every family of `r` in the protobuf format, in name order as [`encode`]: the
/// crate's families with the crate's protobuf encoder (counters and gauges only: the
/// agent's histograms are all [`Family`]s), ours with their own writer.
pub fn encode_protobuf(r: &Registry) -> Vec<u8> {
    let mut out = Vec::new();
    encode_protobuf_into(r, &mut out);
    out
}

fn encode_protobuf_into(r: &Registry, out: &mut Vec<u8>) {
    use prometheus::Encoder as _;
    r.run_before();
    let families = r.gather();
    let direct = lock(&r.direct).clone();
    out.reserve(room_for(r.last_pb_len.load(Ordering::Relaxed)));
    let enc = prometheus::ProtobufEncoder::new();
    // Family by family: the crate's encoder stops at the first family it refuses.
    let crate_families = |fs: &[MetricFamily], out: &mut Vec<u8>| {
        for mf in fs {
            let _ = enc.encode(std::slice::from_ref(mf), out);
        }
    };
    let mut rest = families.as_slice();
    for d in &direct {
        let n = rest.partition_point(|mf| mf.name() < d.name());
        crate_families(&rest[..n], out);
        rest = &rest[n..];
        d.encode_protobuf(out);
    }
    crate_families(rest, out);
    r.last_pb_len.store(out.len(), Ordering::Relaxed);
}

/// Encodes every family of `r` in the text format.
pub fn encode(r: &Registry) -> String {
    let mut out = String::new();
    encode_in(r, Dialect::Prometheus, &mut out);
    out
}

/// Encodes every family of `r` in OpenMetrics 1.0 text: as [`encode`], with the
/// differences of [`Dialect::OpenMetrics`], the exemplars, and `# EOF`.
pub fn encode_openmetrics(r: &Registry) -> String {
    let mut out = String::new();
    encode_in(r, Dialect::OpenMetrics, &mut out);
    out
}

fn encode_in(r: &Registry, dialect: Dialect, out: &mut String) {
    r.run_before();
    let families = r.gather();
    let direct = lock(&r.direct).clone();
    out.reserve(room_for(r.last_len.load(Ordering::Relaxed)));
    // Both lists are in name order: merge them.
    let mut rest = families.as_slice();
    for d in &direct {
        let n = rest.partition_point(|mf| mf.name() < d.name());
        encode_text(&rest[..n], out, dialect);
        rest = &rest[n..];
        d.encode(out, dialect);
    }
    encode_text(rest, out, dialect);
    if dialect == Dialect::OpenMetrics {
        out.push_str("# EOF\n");
    }
    r.last_len.store(out.len(), Ordering::Relaxed);
}

/// A scrape's response body in `format`, encoded into the buffer of an earlier scrape
/// when one is free ([`Spare`]).
pub fn body(r: &Registry, format: Format) -> Bytes {
    let home = Arc::clone(&r.spare);
    let mut buf = std::mem::take(&mut *lock(&home));
    // Kept empty (`Spare::drop`); cleared here as well: a body starts from nothing.
    buf.clear();
    match format {
        Format::Protobuf => encode_protobuf_into(r, &mut buf),
        Format::Text | Format::OpenMetrics => {
            let dialect = if format == Format::Text {
                Dialect::Prometheus
            } else {
                Dialect::OpenMetrics
            };
            // Empty, so valid UTF-8.
            let mut text = String::from_utf8(buf).unwrap_or_default();
            encode_in(r, dialect, &mut text);
            buf = text.into_bytes();
        }
    }
    Bytes::from_owner(Spare { buf, home })
}

/// Room for an exposition after one of `len` bytes: an eighth more and a page.
fn room_for(len: usize) -> usize {
    len + len / 8 + 4096
}

/// The buffer of a scrape's body, handed back for the next scrape when the body has been
/// sent. A body is about 1.2 MB at 64 targets: a fresh one is a mapping of its own
/// (`agent::resident::fixed_mmap_threshold`), whose ~285 pages each fault in, zeroed
/// and locked, and go back to the kernel when it is freed, on every scrape. One kept
/// buffer costs the RSS of one body and none of that. A second scrape at the same time
/// gets a fresh buffer; the larger of the two is kept, unless the one kept is more
/// than four times what this body needed (the targets became fewer, at a reload): then
/// the smaller replaces it. A buffer far larger than its body is shrunk first.
struct Spare {
    buf: Vec<u8>,
    home: Arc<Mutex<Vec<u8>>>,
}

impl AsRef<[u8]> for Spare {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        let need = room_for(self.buf.len());
        self.buf.clear();
        if self.buf.capacity() > 2 * need {
            self.buf.shrink_to(need);
        }
        let mut spare = lock(&self.home);
        if self.buf.capacity() > spare.capacity() || spare.capacity() > 4 * need {
            *spare = std::mem::take(&mut self.buf);
        }
    }
}

/// The text format exactly as `prometheus::TextEncoder` writes it (the golden test and
/// `same_text_as_the_prometheus_encoder` hold it to that), written in one pass into
/// one buffer: a metric's labels are written once and copied to each of its histogram
/// lines, bucket bounds are formatted once per family, and integral values, which
/// most samples are (counts, counters, flags), are written as integers. With 64
/// targets the exposition is 10,000 lines, 8,000 of them histogram lines.
pub(crate) fn encode_text(families: &[MetricFamily], out: &mut String, dialect: Dialect) {
    let mut labels = String::new();
    let mut bounds: Vec<(u64, String)> = Vec::new();
    for mf in families {
        let kind = mf.get_field_type();
        if !matches!(
            kind,
            MetricType::COUNTER | MetricType::GAUGE | MetricType::HISTOGRAM
        ) {
            // No collector of the agent makes these: leave them to the crate's encoder.
            let _ = TextEncoder::new().encode_utf8(std::slice::from_ref(mf), out);
            continue;
        }
        let name = mf.name();
        let kind_name = match kind {
            MetricType::COUNTER => "counter",
            MetricType::GAUGE => "gauge",
            _ => "histogram",
        };
        header(out, name, mf.help(), kind_name, dialect);
        bounds.clear();
        for m in mf.get_metric() {
            labels.clear();
            for (i, lp) in m.get_label().iter().enumerate() {
                let sep = if i == 0 { '{' } else { ',' };
                let _ = write!(
                    labels,
                    "{sep}{}=\"{}\"",
                    lp.name(),
                    escape(lp.value(), true)
                );
            }
            let ts = m.timestamp_ms();
            match kind {
                MetricType::COUNTER => {
                    sample(out, name, "", &labels, None, m.get_counter().value(), ts)
                }
                MetricType::GAUGE => {
                    sample(out, name, "", &labels, None, m.get_gauge().value(), ts)
                }
                MetricType::HISTOGRAM => {
                    let h = m.get_histogram();
                    let mut inf_seen = false;
                    for (i, b) in h.get_bucket().iter().enumerate() {
                        let ub = b.upper_bound();
                        if bounds.get(i).is_none_or(|(bits, _)| *bits != ub.to_bits()) {
                            bounds.truncate(i);
                            bounds.push((ub.to_bits(), escape(&ub.to_string(), true).into_owned()));
                        }
                        let le = bounds[i].1.as_str();
                        sample(
                            out,
                            name,
                            "_bucket",
                            &labels,
                            Some(("le", le)),
                            b.cumulative_count() as f64,
                            ts,
                        );
                        inf_seen |= ub.is_sign_positive() && ub.is_infinite();
                    }
                    if !inf_seen {
                        sample(
                            out,
                            name,
                            "_bucket",
                            &labels,
                            Some(("le", "+Inf")),
                            h.get_sample_count() as f64,
                            ts,
                        );
                    }
                    sample(out, name, "_sum", &labels, None, h.get_sample_sum(), ts);
                    sample(
                        out,
                        name,
                        "_count",
                        &labels,
                        None,
                        h.get_sample_count() as f64,
                        ts,
                    );
                }
                _ => unreachable!("handled above"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{CounterVec, Gauge, HistogramOpts, HistogramVec};

    /// Every kind of family and value the agent exposes, and the awkward ones: labels
    /// and help that need escaping, -0, NaN, infinities, large and fractional values.
    #[test]
    fn same_text_as_the_prometheus_encoder() {
        // Not `registry()`: its process collector reads the process's CPU time and
        // memory afresh at every gather, so two encodings of it differ.
        let r = Registry::new();
        let c = CounterVec::new(Opts::new("t_total", "a \\ back\nslash"), &["a", "b"]).unwrap();
        c.with_label_values(&["x\"q\\\n", "2"]).inc_by(3.0);
        c.with_label_values(&["y", ""]).inc_by(0.25);
        c.with_label_values(&["z", "big"]).inc_by(1e15);
        c.with_label_values(&["zz", "bigger"]).inc_by(3.5e17);
        r.register(Box::new(c)).unwrap();
        for (name, v) in [
            ("g_neg_zero", -0.0),
            ("g_nan", f64::NAN),
            ("g_inf", f64::INFINITY),
            ("g_minus_inf", f64::NEG_INFINITY),
            ("g_neg", -12.0),
            ("g_frac", 1e-7),
            ("g_time", 1_764_625_000.123),
            ("g_2_53", 9_007_199_254_740_992.0),
            ("g_2_53_less_1", 9_007_199_254_740_991.0),
            ("g_min_int", -9_007_199_254_740_991.0),
            ("g_huge", 1e300),
        ] {
            let g = Gauge::new(name, "g").unwrap();
            g.set(v);
            r.register(Box::new(g)).unwrap();
        }
        let h = HistogramVec::new(
            HistogramOpts::new("h_seconds", "h").buckets(crate::probe::BUCKETS.to_vec()),
            &["target", "op"],
        )
        .unwrap();
        for (t, v) in [("a", 0.000_03), ("a", 2.0), ("b", 400.0), ("c\"", 0.1)] {
            h.with_label_values(&[t, "write"]).observe(v);
        }
        h.with_label_values(&["empty", "fsync"]);
        r.register(Box::new(h)).unwrap();
        let inf = HistogramVec::new(
            HistogramOpts::new("h_inf", "explicit +Inf bucket").buckets(vec![1.0, f64::INFINITY]),
            &["x"],
        )
        .unwrap();
        inf.with_label_values(&["1"]).observe(5.0);
        r.register(Box::new(inf)).unwrap();

        let families = r.gather();
        let want = TextEncoder::new().encode_to_string(&families).unwrap();
        let mut got = String::new();
        encode_text(&families, &mut got, Dialect::Prometheus);
        assert_eq!(got, want);
        assert!(
            want.contains("g_neg_zero -0\n") && want.contains("g_nan NaN\n"),
            "{want}"
        );
        assert_eq!(encode(&r), want, "encode() writes the same");
    }

    /// Direct families and the crate's come out together in name order, as one
    /// registry's gather() would list them.
    #[test]
    fn direct_families_are_merged_in_name_order() {
        let r = Registry::new();
        for name in ["a_total", "c_total", "e_total"] {
            let c = prometheus::IntCounter::new(name, "crate's").unwrap();
            c.inc();
            r.register(Box::new(c)).unwrap();
        }
        for name in ["f_total", "b_total", "d_total"] {
            let c = Arc::new(crate::exposition::family::CounterVec::new(
                name,
                "ours",
                &["x"],
            ));
            c.with_label_values(&["1"]).inc();
            r.register_family(c);
        }
        let names: Vec<&str> = encode(&r)
            .leak()
            .lines()
            .filter(|l| l.starts_with("# TYPE"))
            .map(|l| l.split(' ').nth(2).unwrap())
            .collect();
        assert_eq!(
            names,
            ["a_total", "b_total", "c_total", "d_total", "e_total", "f_total"]
        );
    }

    /// A body is the exposition [`encode`] and its siblings write; once it has been
    /// dropped (sent), the next scrape's body is written into the same buffer, of
    /// whichever format; of two bodies out at once, the larger buffer is kept.
    #[test]
    fn a_body_reuses_the_last_ones_buffer() {
        let r = Registry::new();
        let c = Arc::new(crate::exposition::family::CounterVec::new(
            "c_total",
            "n",
            &["t"],
        ));
        for i in 0..2_000 {
            c.with_label_values(&[&format!("target-{i}")]).inc();
        }
        r.register_family(Arc::clone(&c) as _);
        let text = body(&r, Format::Text);
        assert_eq!(&text[..], encode(&r).as_bytes());
        let at = text.as_ptr();
        drop(text);
        let om = body(&r, Format::OpenMetrics);
        assert_eq!(&om[..], encode_openmetrics(&r).as_bytes());
        assert!(om.ends_with(b"# EOF\n"));
        assert_eq!(
            om.as_ptr(),
            at,
            "the buffer of the dropped body is written again"
        );
        // A second scrape while the first is out: a buffer of its own.
        let pb = body(&r, Format::Protobuf);
        assert_eq!(&pb[..], &encode_protobuf(&r)[..]);
        assert_ne!(pb.as_ptr(), at);
        assert_eq!(
            lock(&r.spare).capacity(),
            0,
            "nothing kept while both are out"
        );
        let (pb_at, longest) = (pb.as_ptr(), om.len().max(pb.len()));
        drop(pb);
        assert!(lock(&r.spare).capacity() > 0, "the first back is kept");
        drop(om);
        {
            let spare = lock(&r.spare);
            assert!(spare.as_ptr() == at || spare.as_ptr() == pb_at);
            assert!(spare.capacity() >= longest);
        }
        // Fewer series (a reload that removed targets): the next, much smaller, body's
        // buffer replaces the large one, and a large buffer is not kept for it.
        for i in 0..1_990 {
            c.remove_label_values(&[&format!("target-{i}")]);
        }
        let big = lock(&r.spare).capacity();
        let small = body(&r, Format::Text);
        let need = room_for(small.len());
        drop(small);
        let kept = lock(&r.spare).capacity();
        assert!(
            kept <= 2 * need && kept < big,
            "kept {kept} of {big}, need {need}"
        );
    }

    #[test]
    fn negotiation_as_client_golang() {
        use Format::*;
        let pb = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited";
        assert_eq!(Format::negotiate(None), Text);
        assert_eq!(Format::negotiate(Some("")), Text);
        assert_eq!(Format::negotiate(Some(pb)), Protobuf);
        // Prometheus 2.42 with --enable-feature=native-histograms.
        let prom = format!("{pb};q=0.5,application/openmetrics-text;version=1.0.0;q=0.4,application/openmetrics-text;version=0.0.1;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1");
        assert_eq!(Format::negotiate(Some(&prom)), Protobuf);
        assert_eq!(
            Format::negotiate(Some("text/plain;version=0.0.4;q=0.9,application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5")),
            Text
        );
        // Protobuf without the message or the delimited encoding is not ours to serve.
        assert_eq!(
            Format::negotiate(Some("application/vnd.google.protobuf")),
            Text
        );
        assert_eq!(
            Format::negotiate(Some("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text")),
            Text
        );
        assert_eq!(Format::negotiate(Some(&format!("{pb};q=0"))), Text);
        // Prometheus 2.42 without the feature flag.
        let prom = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prom)), OpenMetrics);
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text; version=2.0.0")),
            Text
        );
    }

    #[test]
    #[should_panic(expected = "registered twice")]
    fn a_name_registered_both_ways_is_refused() {
        let r = Registry::new();
        let c = prometheus::IntCounter::new("x_total", "crate's").unwrap();
        r.register(Box::new(c)).unwrap();
        r.register_family(Arc::new(crate::exposition::family::CounterVec::new(
            "x_total",
            "ours",
            &["y"],
        )));
    }
}
