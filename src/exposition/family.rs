//! Families written straight into the text exposition from their own counters, without
//! `prometheus::Registry::gather()`: every family with a series per target (the probe
//! latency histograms, the stall counters, the probe counters and gauges), which are
//! all but a few sample lines of a scrape (with 64 targets on tmpfs, 13,056 of 13,084;
//! the sampler's families add a few lines per disk).
//! `gather()` builds a struct per metric and per bucket, clones every label pair and
//! sorts each family's metrics on every scrape; here a series' labels are rendered once,
//! when it is created, kept in the order the exposition wants, and a scrape reads each
//! series' numbers (atomics, or a histogram's lock held for a copy). The family's map
//! of series is read-locked while the family is written: creating a series (at start,
//! a reload, a new errno) waits that long, as it did for the crate's `collect`. The
//! text is the same as the crate's encoder would write for a `HistogramVec`,
//! `IntCounterVec`, `IntGaugeVec` or `GaugeVec` with the same series
//! (`tests::same_text_as_the_crate_families` and `tests::scalars_as_the_crate_writes_them`
//! hold it to that, the protobuf too).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::base::sync::lock;
use crate::exposition::native::{Native, ZERO_THRESHOLD};
use crate::exposition::protobuf as pb;

/// Which text format: the Prometheus text format 0.0.4, or OpenMetrics 1.0 (counter
/// families named without `_total`, `"` escaped in help, exemplars after ` # ` on
/// bucket lines; the caller ends it with `# EOF`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Prometheus,
    OpenMetrics,
}

/// A family that writes its own lines: `# HELP`, `# TYPE` and one line per sample.
pub trait Family: Send + Sync {
    fn name(&self) -> &str;
    /// Appends the family's text; nothing when it has no series (as `gather()` drops
    /// an empty family).
    fn encode(&self, out: &mut String, d: Dialect);
    /// Appends the family as one length-delimited protobuf `MetricFamily`; nothing when
    /// it has no series. Histograms carry native buckets beside the classic ones.
    fn encode_protobuf(&self, out: &mut Vec<u8>);
}

/// Series by their label values in name order, joined by NUL (which sorts below every
/// other character, so the map's order is that of the value tuples): the labels as
/// the text writes them, as the protobuf writes them (`LabelPair`s in field 1 of a
/// `Metric`), and the value.
type Series<T> = BTreeMap<String, (String, Vec<u8>, Arc<T>)>;

/// A labelled family's series, keyed by their label values in label-name order: the
/// order the exposition lists them in.
struct SeriesMap<T> {
    name: String,
    help: String,
    /// Label names as the caller passes values, and the permutation into name order.
    labels: Vec<&'static str>,
    order: Vec<usize>,
    series: RwLock<Series<T>>,
}

impl<T: Default> SeriesMap<T> {
    fn new(name: &str, help: &str, labels: &[&'static str]) -> SeriesMap<T> {
        let mut order: Vec<usize> = (0..labels.len()).collect();
        order.sort_by_key(|&i| labels[i]);
        SeriesMap {
            name: name.to_owned(),
            help: help.to_owned(),
            labels: labels.to_vec(),
            order,
            series: RwLock::default(),
        }
    }

    /// Writes the key of `values` into `key`.
    fn key_into(&self, values: &[&str], key: &mut String) {
        assert_eq!(
            values.len(),
            self.labels.len(),
            "{}: label count",
            self.name
        );
        key.clear();
        for (n, &i) in self.order.iter().enumerate() {
            if n > 0 {
                key.push('\0');
            }
            key.push_str(values[i]);
        }
    }

    /// The series of `values` (in the order the labels were declared), created at zero.
    /// Looked up without allocating: the lanes call this for every timed call.
    fn get(&self, values: &[&str]) -> Arc<T> {
        thread_local! {
            static KEY: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
        }
        KEY.with_borrow_mut(|key| {
            self.key_into(values, key);
            if let Some((_, _, s)) = self.read().get(key.as_str()) {
                return Arc::clone(s);
            }
            let mut w = self.series.write().unwrap_or_else(|e| e.into_inner());
            let (labels, pb_labels) = self.render(values);
            let entry = w.entry(key.clone());
            Arc::clone(
                &entry
                    .or_insert_with(|| (labels, pb_labels, Arc::default()))
                    .2,
            )
        })
    }

    fn remove(&self, values: &[&str]) -> bool {
        let mut key = String::new();
        self.key_into(values, &mut key);
        let mut w = self.series.write().unwrap_or_else(|e| e.into_inner());
        w.remove(&key).is_some()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Series<T>> {
        self.series.read().unwrap_or_else(|e| e.into_inner())
    }

    /// `{a="x",b="y"` (without the closing brace), as [`sample`] takes a metric's
    /// labels, and the same pairs as protobuf `LabelPair`s of a `Metric`.
    fn render(&self, values: &[&str]) -> (String, Vec<u8>) {
        let pairs: Vec<(&str, &str)> = self
            .order
            .iter()
            .map(|&i| (self.labels[i], values[i]))
            .collect();
        let mut s = String::new();
        labels_into(&mut s, &pairs);
        let mut b = Vec::new();
        for (k, v) in pairs {
            pb::label_pair(&mut b, 1, k, v);
        }
        (s, b)
    }

    fn header(&self, out: &mut String, kind: &str, d: Dialect) {
        header(out, &self.name, &self.help, kind, d);
    }
}

/// A counter of whole events.
#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that is set (the `Gauge` and `IntGauge` of the crate: whole values are
/// written as integers either way).
#[derive(Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    pub fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }

    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// What a [`ScalarVec`] holds per series: a [`Counter`] or a [`Gauge`].
pub trait Scalar: Default + Send + Sync {
    /// The `# TYPE` of the text format.
    const TYPE_NAME: &'static str;
    /// The protobuf `MetricType`.
    const PB_TYPE: u64;
    fn value(&self) -> f64;
}

impl Scalar for Counter {
    const TYPE_NAME: &'static str = "counter";
    const PB_TYPE: u64 = pb::COUNTER;

    fn value(&self) -> f64 {
        self.get() as f64
    }
}

impl Scalar for Gauge {
    const TYPE_NAME: &'static str = "gauge";
    const PB_TYPE: u64 = pb::GAUGE;

    fn value(&self) -> f64 {
        self.get()
    }
}

/// A family of one value per series (the `IntCounterVec`, `IntGaugeVec` and `GaugeVec`
/// of the crate).
pub struct ScalarVec<T>(SeriesMap<T>);

/// A family of [`Counter`]s.
pub type CounterVec = ScalarVec<Counter>;
/// A family of [`Gauge`]s.
pub type GaugeVec = ScalarVec<Gauge>;

impl<T: Scalar> ScalarVec<T> {
    pub fn new(name: &str, help: &str, labels: &[&'static str]) -> ScalarVec<T> {
        ScalarVec(SeriesMap::new(name, help, labels))
    }

    /// The series of `values`, in the order the labels were given; created at 0.
    pub fn with_label_values(&self, values: &[&str]) -> Arc<T> {
        self.0.get(values)
    }

    /// Removes a series; whether there was one.
    pub fn remove_label_values(&self, values: &[&str]) -> bool {
        self.0.remove(values)
    }
}

impl<T: Scalar> Family for ScalarVec<T> {
    fn name(&self) -> &str {
        &self.0.name
    }

    fn encode(&self, out: &mut String, d: Dialect) {
        let series = self.0.read();
        if series.is_empty() {
            return;
        }
        self.0.header(out, T::TYPE_NAME, d);
        for (labels, _, v) in series.values() {
            sample(out, &self.0.name, "", labels, None, v.value(), 0);
        }
    }

    fn encode_protobuf(&self, out: &mut Vec<u8>) {
        let series = self.0.read();
        if series.is_empty() {
            return;
        }
        pb::family(out, &self.0.name, &self.0.help, T::PB_TYPE, |f| {
            for (_, labels, v) in series.values() {
                pb::scalar_metric(f, labels, T::PB_TYPE, v.value());
            }
        });
    }
}

/// A latency histogram over fixed bucket bounds, with native buckets beside them
/// (`native.rs`). Its counts, count, sum, native buckets and exemplars change together
/// under one lock (held for a few stores by the one lane that observes it, and for a
/// copy by a scrape), so a scrape never sees a count without its bucket.
#[derive(Default)]
pub struct Histogram(Mutex<Counts>);

#[derive(Default, Clone)]
struct Counts {
    /// Per bucket, not cumulative; one more than the bounds: above the last bound.
    buckets: Vec<u64>,
    count: u64,
    sum: f64,
    native: Native,
    /// The latest exemplar per classic bucket (empty until the first), and the latest
    /// of the series for the native histogram.
    exemplars: Vec<Option<Exemplar>>,
    latest: Option<Exemplar>,
}

/// An observation's exemplar: one label (the stall event's id), the value observed and
/// when (Unix seconds).
#[derive(Clone, Debug, PartialEq)]
pub struct Exemplar {
    pub label: (&'static str, Arc<str>),
    pub value: f64,
    pub unix: f64,
}

impl Histogram {
    /// Counts `v` in the first bucket whose bound is at least `v` (`le`: less or equal)
    /// and in its native bucket; keeps `exemplar` as the latest of that bucket.
    fn observe(&self, bounds: &[f64], v: f64, exemplar: Option<Exemplar>) {
        let i = bounds.iter().position(|b| v <= *b).unwrap_or(bounds.len());
        let mut c = lock(&self.0);
        if c.buckets.is_empty() {
            c.buckets = vec![0; bounds.len() + 1];
        }
        c.buckets[i] += 1;
        c.count += 1;
        c.sum += v;
        c.native.observe(v);
        if let Some(e) = exemplar {
            if c.exemplars.is_empty() {
                c.exemplars = vec![None; bounds.len() + 1];
            }
            c.exemplars[i] = Some(e.clone());
            c.latest = Some(e);
        }
    }

    pub fn count(&self) -> u64 {
        lock(&self.0).count
    }
}

/// A family of [`Histogram`]s (the `HistogramVec` of the crate).
pub struct HistogramVec {
    series: SeriesMap<Histogram>,
    bounds: Arc<[f64]>,
    /// The bounds as the `le` label writes them, formatted once.
    le: Vec<String>,
}

/// A handle on one series of a [`HistogramVec`], to observe into.
#[derive(Clone)]
pub struct HistogramSeries {
    h: Arc<Histogram>,
    bounds: Arc<[f64]>,
}

impl HistogramSeries {
    pub fn observe(&self, v: f64) {
        self.h.observe(&self.bounds, v, None);
    }

    /// Counts `v`, with an exemplar.
    pub fn observe_with_exemplar(&self, v: f64, exemplar: Exemplar) {
        self.h.observe(&self.bounds, v, Some(exemplar));
    }

    pub fn count(&self) -> u64 {
        self.h.count()
    }
}

impl HistogramVec {
    /// `bounds` ascending and finite: the `+Inf` bucket is always written.
    pub fn new(name: &str, help: &str, labels: &[&'static str], bounds: &[f64]) -> HistogramVec {
        assert!(
            bounds.windows(2).all(|w| w[0] < w[1]) && bounds.iter().all(|b| b.is_finite()),
            "{name}: bounds must ascend and be finite"
        );
        HistogramVec {
            series: SeriesMap::new(name, help, labels),
            bounds: bounds.into(),
            le: bounds
                .iter()
                .map(|b| escape(&b.to_string(), true).into_owned())
                .collect(),
        }
    }

    /// The series of `values`, in the order the labels were given; created empty.
    pub fn with_label_values(&self, values: &[&str]) -> HistogramSeries {
        HistogramSeries {
            h: self.series.get(values),
            bounds: Arc::clone(&self.bounds),
        }
    }

    /// Counts `v` in the series of `values`.
    pub fn observe(&self, values: &[&str], v: f64) {
        self.series.get(values).observe(&self.bounds, v, None);
    }

    /// Counts `v` in the series of `values`, with an exemplar.
    pub fn observe_with_exemplar(&self, values: &[&str], v: f64, exemplar: Exemplar) {
        self.series
            .get(values)
            .observe(&self.bounds, v, Some(exemplar));
    }

    /// Removes a series; whether there was one.
    pub fn remove_label_values(&self, values: &[&str]) -> bool {
        self.series.remove(values)
    }
}

impl Family for HistogramVec {
    fn name(&self) -> &str {
        &self.series.name
    }

    fn encode(&self, out: &mut String, d: Dialect) {
        let series = self.series.read();
        if series.is_empty() {
            return;
        }
        let name = self.series.name.as_str();
        self.series.header(out, "histogram", d);
        let mut c = Counts::default();
        for (labels, _, h) in series.values() {
            {
                // The classic counts only (and the exemplars OpenMetrics writes): the
                // native buckets are the protobuf's.
                let g = lock(&h.0);
                c.buckets.clone_from(&g.buckets);
                c.count = g.count;
                c.sum = g.sum;
                if d == Dialect::OpenMetrics {
                    c.exemplars.clone_from(&g.exemplars);
                }
            }
            let mut cumulative = 0;
            for (i, le) in self.le.iter().enumerate() {
                cumulative += c.buckets.get(i).copied().unwrap_or(0);
                let le = Some(("le", le.as_str()));
                sample(out, name, "_bucket", labels, le, cumulative as f64, 0);
                if d == Dialect::OpenMetrics {
                    exemplar_text(out, c.exemplars.get(i));
                }
            }
            let inf = Some(("le", "+Inf"));
            sample(out, name, "_bucket", labels, inf, c.count as f64, 0);
            if d == Dialect::OpenMetrics {
                exemplar_text(out, c.exemplars.get(self.le.len()));
            }
            sample(out, name, "_sum", labels, None, c.sum, 0);
            sample(out, name, "_count", labels, None, c.count as f64, 0);
        }
    }

    /// Each series as a `Histogram` message with the classic buckets (cumulative, `+Inf`
    /// left out as the format allows) and the native ones (schema, zero bucket, spans
    /// and deltas), and the exemplars: the latest per classic bucket, and the series'
    /// latest in the native `exemplars`.
    fn encode_protobuf(&self, out: &mut Vec<u8>) {
        let series = self.series.read();
        if series.is_empty() {
            return;
        }
        let mut c = Counts::default();
        let (mut spans, mut deltas) = (Vec::new(), Vec::new());
        let mut packed = Vec::new();
        let help = &self.series.help;
        pb::family(out, &self.series.name, help, pb::HISTOGRAM, |f| {
            for (_, labels, h) in series.values() {
                c.clone_from(&lock(&h.0));
                c.native.spans_and_deltas(&mut spans, &mut deltas);
                pb::message(f, 4, |m| {
                    m.extend_from_slice(labels);
                    // Histogram: field 7 of Metric.
                    pb::message(m, 7, |hm| {
                        pb::uint(hm, 1, c.count);
                        pb::double(hm, 2, c.sum);
                        let mut cumulative = 0;
                        for (i, &ub) in self.bounds.iter().enumerate() {
                            cumulative += c.buckets.get(i).copied().unwrap_or(0);
                            pb::message(hm, 3, |b| {
                                pb::uint(b, 1, cumulative);
                                pb::double(b, 2, ub);
                                if let Some(Some(e)) = c.exemplars.get(i) {
                                    exemplar(b, 3, e);
                                }
                            });
                        }
                        if let Some(Some(e)) = c.exemplars.get(self.bounds.len()) {
                            // Above the last bound: the +Inf bucket, written only to
                            // carry its exemplar.
                            pb::message(hm, 3, |b| {
                                pb::uint(b, 1, c.count);
                                pb::double(b, 2, f64::INFINITY);
                                exemplar(b, 3, e);
                            });
                        }
                        pb::sint(hm, 5, i64::from(c.native.schema));
                        pb::double(hm, 6, ZERO_THRESHOLD);
                        pb::uint(hm, 7, c.native.zero_count);
                        if spans.is_empty() {
                            // No bucket yet: one empty span marks the histogram as
                            // native to scrapers that look for spans (client_golang's
                            // convention).
                            pb::message(hm, 12, |s| {
                                pb::sint(s, 1, 0);
                                pb::uint(s, 2, 0);
                            });
                        }
                        for &(offset, len) in &spans {
                            pb::message(hm, 12, |s| {
                                pb::sint(s, 1, i64::from(offset));
                                pb::uint(s, 2, u64::from(len));
                            });
                        }
                        if !deltas.is_empty() {
                            packed.clear();
                            for &d in &deltas {
                                pb::varint(&mut packed, pb::zigzag(d));
                            }
                            pb::bytes(hm, 13, &packed);
                        }
                        if let Some(e) = &c.latest {
                            exemplar(hm, 16, e);
                        }
                    });
                });
            }
        });
    }
}

/// An `Exemplar` message in `field`: its label, value and timestamp.
fn exemplar(out: &mut Vec<u8>, field: u32, e: &Exemplar) {
    pb::message(out, field, |x| {
        pb::label_pair(x, 1, e.label.0, &e.label.1);
        pb::double(x, 2, e.value);
        pb::timestamp(x, 3, e.unix);
    });
}

/// `# HELP` (when there is help) and `# TYPE` lines of a family. In OpenMetrics a
/// counter family is named without its samples' `_total` (one whose name lacks it is
/// declared `unknown`: its samples keep their name), and help escapes `"` too.
pub(crate) fn header(out: &mut String, name: &str, help: &str, kind: &str, d: Dialect) {
    let (name, kind) = match (d, kind) {
        (Dialect::OpenMetrics, "counter") => match name.strip_suffix("_total") {
            Some(base) => (base, kind),
            None => (name, "unknown"),
        },
        _ => (name, kind),
    };
    let om = d == Dialect::OpenMetrics;
    if !help.is_empty() {
        for part in ["# HELP ", name, " ", &escape(help, om), "\n"] {
            out.push_str(part);
        }
    }
    for part in ["# TYPE ", name, " ", kind, "\n"] {
        out.push_str(part);
    }
}

/// An OpenMetrics exemplar appended to the bucket line just written:
/// ` # {stall_id="…"} VALUE TIMESTAMP`.
fn exemplar_text(out: &mut String, e: Option<&Option<Exemplar>>) {
    let Some(Some(e)) = e else {
        return;
    };
    out.pop();
    out.push_str(" # {");
    out.push_str(e.label.0);
    out.push_str("=\"");
    out.push_str(&escape(&e.label.1, true));
    let _ = writeln!(out, "\"}} {} {:.3}", e.value, e.unix);
}

/// Appends `{a="x",b="y"` (without the closing brace) for `pairs`, which must be in
/// label-name order: a metric's labels as [`sample`] takes them.
pub(crate) fn labels_into(out: &mut String, pairs: &[(&str, &str)]) {
    for (n, (k, v)) in pairs.iter().enumerate() {
        out.push(if n == 0 { '{' } else { ',' });
        out.push_str(k);
        out.push_str("=\"");
        out.push_str(&escape(v, true));
        out.push('"');
    }
}

/// One line: name, suffix, the metric's labels (`{a="1",b="2"` without the brace that
/// closes them) with `extra` appended, the value and the timestamp if any.
pub(crate) fn sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &str,
    extra: Option<(&str, &str)>,
    v: f64,
    ts: i64,
) {
    out.push_str(name);
    out.push_str(suffix);
    if let Some((k, x)) = extra {
        out.push_str(if labels.is_empty() { "{" } else { labels });
        if !labels.is_empty() {
            out.push(',');
        }
        for part in [k, "=\"", x, "\"}"] {
            out.push_str(part);
        }
    } else if !labels.is_empty() {
        out.push_str(labels);
        out.push('}');
    }
    out.push(' ');
    // Integral values as integers: the same digits as f64's Display (which never uses
    // an exponent), without the float formatting. -0 keeps its sign through Display.
    let i = v as i64;
    if i as f64 == v && i.unsigned_abs() < 1 << 53 && !(i == 0 && v.is_sign_negative()) {
        push_int(out, i);
    } else {
        let _ = write!(out, "{v}");
    }
    if ts != 0 {
        out.push(' ');
        push_int(out, ts);
    }
    out.push('\n');
}

/// Decimal digits of `i`, without the formatting machinery.
fn push_int(out: &mut String, i: i64) {
    let mut buf = [0u8; 20];
    let mut n = i.unsigned_abs();
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if i < 0 {
        out.push('-');
    }
    // Only ASCII digits were written.
    out.push_str(std::str::from_utf8(&buf[at..]).unwrap_or_default());
}

/// Escapes as the text format wants: backslash and newline, and in label values the
/// double quote.
pub(crate) fn escape(v: &str, quote: bool) -> Cow<'_, str> {
    let special = |c: char| c == '\\' || c == '\n' || (quote && c == '"');
    if !v.contains(special) {
        return Cow::Borrowed(v);
    }
    let mut o = String::with_capacity(v.len() + 8);
    for c in v.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '"' if quote => o.push_str("\\\""),
            c => o.push(c),
        }
    }
    Cow::Owned(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{HistogramOpts, IntCounterVec, Opts, Registry, TextEncoder};

    /// The same series in the crate's families and in ours give the same text: names,
    /// help, label order and escaping, series order, bucket bounds, values.
    #[test]
    fn same_text_as_the_crate_families() {
        let bounds = crate::probe::BUCKETS;
        let r = Registry::new();
        let theirs = prometheus::HistogramVec::new(
            HistogramOpts::new("h_seconds", "latency \\ of\nit").buckets(bounds.to_vec()),
            &["target", "mode", "op"],
        )
        .unwrap();
        let ours = HistogramVec::new(
            "h_seconds",
            "latency \\ of\nit",
            &["target", "mode", "op"],
            &bounds,
        );
        let counter_theirs =
            IntCounterVec::new(Opts::new("c_total", "count"), &["target", "cause"]).unwrap();
        let counter_ours = CounterVec::new("c_total", "count", &["target", "cause"]);
        let observations = [
            (["b", "create", "fsync"], 0.000_03),
            (["b", "create", "fsync"], 0.000_025),
            (["a", "overwrite", "write"], 2.0),
            (["a", "overwrite", "write"], 400.0),
            (["a\"q\\\n", "create", "open"], 0.1),
            (["a", "create", "write"], 1e-9),
            // Values that are prefixes of others, in one label and across labels.
            (["t1", "create", "open"], 0.5),
            (["t10", "create", "open"], 0.5),
            (["t1", "create", "open0"], 0.5),
            (["t", "create0", "open"], 0.5),
        ];
        for (labels, v) in observations {
            theirs.with_label_values(&labels).observe(v);
            ours.observe(&labels, v);
            counter_theirs
                .with_label_values(&[labels[0], labels[2]])
                .inc();
            counter_ours
                .with_label_values(&[labels[0], labels[2]])
                .inc();
        }
        theirs.with_label_values(&["empty", "append", "fdatasync"]);
        ours.with_label_values(&["empty", "append", "fdatasync"]);
        counter_theirs.with_label_values(&["z", "other"]);
        counter_ours.with_label_values(&["z", "other"]);
        r.register(Box::new(theirs)).unwrap();
        r.register(Box::new(counter_theirs)).unwrap();
        let want = TextEncoder::new().encode_to_string(&r.gather()).unwrap();
        let mut got = String::new();
        counter_ours.encode(&mut got, Dialect::Prometheus);
        ours.encode(&mut got, Dialect::Prometheus);
        assert_eq!(got, want);
        assert!(
            want.contains(
                "h_seconds_bucket{mode=\"create\",op=\"fsync\",target=\"b\",le=\"0.000025\"} 1\n"
            ),
            "{want}"
        );
    }

    /// Our gauges and counters write what the crate's `GaugeVec`, `IntGaugeVec` and
    /// `IntCounterVec` write for the same series, in text and, byte for byte, in
    /// protobuf: whole values as integers, fractional, negative, huge and not-a-number
    /// ones, label values that need escaping, series created and never set.
    #[test]
    fn scalars_as_the_crate_writes_them() {
        use prometheus::Encoder as _;
        let r = Registry::new();
        let g_theirs = prometheus::GaugeVec::new(
            Opts::new("a_seconds", "when \\ it\nwas"),
            &["target", "mode"],
        )
        .unwrap();
        let i_theirs =
            prometheus::IntGaugeVec::new(Opts::new("b_up", "flag"), &["target"]).unwrap();
        let c_theirs =
            IntCounterVec::new(Opts::new("c_total", "n"), &["target", "reason"]).unwrap();
        let g_ours = GaugeVec::new("a_seconds", "when \\ it\nwas", &["target", "mode"]);
        let i_ours = GaugeVec::new("b_up", "flag", &["target"]);
        let c_ours = CounterVec::new("c_total", "n", &["target", "reason"]);
        for (t, m, v) in [
            ("x", "create", 1_764_625_000.123_456),
            ("x\"q\\\n", "overwrite", -0.5),
            ("y", "create", 3.5e17),
            ("y", "nan", f64::NAN),
            ("z", "zero", 0.0),
        ] {
            g_theirs.with_label_values(&[t, m]).set(v);
            g_ours.with_label_values(&[t, m]).set(v);
        }
        g_theirs.with_label_values(&["z", "unset"]);
        g_ours.with_label_values(&["z", "unset"]);
        for (t, v) in [("t1", 1), ("t10", 0), ("t2", -3)] {
            i_theirs.with_label_values(&[t]).set(v);
            i_ours.with_label_values(&[t]).set(v as f64);
        }
        for (t, reason, n) in [
            ("t1", "in_flight", 3),
            ("t1", "not_mounted", 0),
            ("t0", "x", 1),
        ] {
            let (theirs, ours) = (
                c_theirs.with_label_values(&[t, reason]),
                c_ours.with_label_values(&[t, reason]),
            );
            for _ in 0..n {
                theirs.inc();
                ours.inc();
            }
        }
        r.register(Box::new(g_theirs)).unwrap();
        r.register(Box::new(i_theirs)).unwrap();
        r.register(Box::new(c_theirs)).unwrap();
        let ours: [&dyn Family; 3] = [&g_ours, &i_ours, &c_ours];
        let want = TextEncoder::new().encode_to_string(&r.gather()).unwrap();
        let mut got = String::new();
        for f in ours {
            f.encode(&mut got, Dialect::Prometheus);
        }
        assert_eq!(got, want);
        assert!(want.contains("b_up{target=\"t2\"} -3\n"), "{want}");
        let mut want = Vec::new();
        prometheus::ProtobufEncoder::new()
            .encode(&r.gather(), &mut want)
            .unwrap();
        let mut got = Vec::new();
        for f in ours {
            f.encode_protobuf(&mut got);
        }
        assert_eq!(got, want);
    }

    /// An exemplar shows in OpenMetrics on its bucket's line only; the text format
    /// is the same with or without it; OpenMetrics names a counter family without
    /// `_total`.
    #[test]
    fn exemplars_in_openmetrics_only() {
        let h = HistogramVec::new("h_seconds", "h \"q\"", &["target"], &[0.1, 1.0]);
        let same = HistogramVec::new("h_seconds", "h \"q\"", &["target"], &[0.1, 1.0]);
        let e = Exemplar {
            label: ("stall_id", "019-ab-7".into()),
            value: 0.5,
            unix: 1_764_625_000.25,
        };
        for v in [0.05, 0.5, 0.7] {
            same.observe(&["a"], v);
            if v == 0.5 {
                h.observe_with_exemplar(&["a"], v, e.clone());
            } else {
                h.observe(&["a"], v);
            }
        }
        let (mut with, mut without) = (String::new(), String::new());
        h.encode(&mut with, Dialect::Prometheus);
        same.encode(&mut without, Dialect::Prometheus);
        assert_eq!(with, without);
        let mut om = String::new();
        h.encode(&mut om, Dialect::OpenMetrics);
        assert!(om.starts_with("# HELP h_seconds h \\\"q\\\"\n"), "{om}");
        assert!(
            om.contains(
                "h_seconds_bucket{target=\"a\",le=\"1\"} 3 # {stall_id=\"019-ab-7\"} 0.5 1764625000.250\n"
            ),
            "{om}"
        );
        assert_eq!(om.matches(" # {").count(), 1, "{om}");
        let c = CounterVec::new("c_total", "c", &["x"]);
        c.with_label_values(&["1"]).inc();
        let mut om = String::new();
        c.encode(&mut om, Dialect::OpenMetrics);
        assert_eq!(om, "# HELP c c\n# TYPE c counter\nc_total{x=\"1\"} 1\n");
    }

    #[test]
    fn removed_and_empty_families_write_nothing() {
        let h = HistogramVec::new("h", "h", &["target"], &[1.0]);
        let mut out = String::new();
        h.encode(&mut out, Dialect::Prometheus);
        assert_eq!(out, "");
        h.observe(&["a"], 0.5);
        assert!(h.remove_label_values(&["a"]));
        assert!(!h.remove_label_values(&["a"]));
        h.encode(&mut out, Dialect::Prometheus);
        assert_eq!(out, "");
        let c = CounterVec::new("c_total", "c", &["target"]);
        c.with_label_values(&["a"]).inc();
        assert!(c.remove_label_values(&["a"]));
        c.encode(&mut out, Dialect::Prometheus);
        assert_eq!(out, "");
    }

    /// A scrape while lanes observe: every histogram it writes is whole (the buckets
    /// add up to the count, cumulative counts never fall).
    #[test]
    fn a_scrape_beside_observers_sees_whole_histograms() {
        let h = Arc::new(HistogramVec::new(
            "h",
            "h",
            &["target"],
            &[0.001, 0.01, 0.1],
        ));
        let series: Vec<_> = (0..4)
            .map(|i| h.with_label_values(&[&i.to_string()]))
            .collect();
        let writers: Vec<_> = series
            .into_iter()
            .map(|s| {
                std::thread::spawn(move || {
                    for i in 0..20_000u32 {
                        s.observe(f64::from(i % 200) / 1000.0);
                    }
                })
            })
            .collect();
        for _ in 0..200 {
            let mut out = String::new();
            h.encode(&mut out, Dialect::Prometheus);
            let mut last = 0u64;
            for line in out.lines().filter(|l| !l.starts_with('#')) {
                let v: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
                if line.contains("_bucket") {
                    assert!(v as u64 >= last, "cumulative count fell: {line}");
                    last = v as u64;
                } else if line.contains("_count") {
                    assert_eq!(v as u64, last, "count is the +Inf bucket: {line}");
                    last = 0;
                }
            }
        }
        for w in writers {
            w.join().unwrap();
        }
    }
}
