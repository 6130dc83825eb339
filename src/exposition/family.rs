//! Families written straight into the text exposition from their own counters, without
//! `prometheus::Registry::gather()`: the probe latency histograms and the stall counters,
//! which are nine in ten lines of a scrape (with 64 targets, 10,500 of 12,800).
//! `gather()` builds a struct per metric and per bucket, clones every label pair and
//! sorts each family's metrics on every scrape; here a series' labels are rendered once,
//! when it is created, kept in the order the exposition wants, and a scrape copies its
//! numbers out under a lock held for a few loads. The text is the same as the crate's
//! encoder would write for a `HistogramVec` or `IntCounterVec` with the same series
//! (`tests::same_text_as_the_crate_families` holds it to that).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::base::sync::lock;

/// A family that writes its own lines: `# HELP`, `# TYPE` and one line per sample.
pub trait Family: Send + Sync {
    fn name(&self) -> &str;
    /// Appends the family's text; nothing when it has no series (as `gather()` drops
    /// an empty family).
    fn encode(&self, out: &mut String);
}

/// Series by their label values in name order, joined by NUL (which sorts below every
/// other character, so the map's order is that of the value tuples): the labels as
/// written, and the value.
type Series<T> = BTreeMap<String, (String, Arc<T>)>;

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
            if let Some((_, s)) = self.read().get(key.as_str()) {
                return Arc::clone(s);
            }
            let mut w = self.series.write().unwrap_or_else(|e| e.into_inner());
            let labels = self.render(values);
            let entry = w.entry(key.clone());
            Arc::clone(&entry.or_insert_with(|| (labels, Arc::default())).1)
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

    /// `{a="x",b="y"` (without the closing brace), as [`sample`] takes a metric's labels.
    fn render(&self, values: &[&str]) -> String {
        let pairs: Vec<(&str, &str)> = self
            .order
            .iter()
            .map(|&i| (self.labels[i], values[i]))
            .collect();
        let mut s = String::new();
        labels_into(&mut s, &pairs);
        s
    }

    fn header(&self, out: &mut String, kind: &str) {
        header(out, &self.name, &self.help, kind);
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

/// A family of [`Counter`]s (the `IntCounterVec` of the crate).
pub struct CounterVec(SeriesMap<Counter>);

impl CounterVec {
    pub fn new(name: &str, help: &str, labels: &[&'static str]) -> CounterVec {
        CounterVec(SeriesMap::new(name, help, labels))
    }

    /// The counter of `values`, in the order the labels were given; created at 0.
    pub fn with_label_values(&self, values: &[&str]) -> Arc<Counter> {
        self.0.get(values)
    }

    /// Removes a series; whether there was one.
    pub fn remove_label_values(&self, values: &[&str]) -> bool {
        self.0.remove(values)
    }
}

impl Family for CounterVec {
    fn name(&self) -> &str {
        &self.0.name
    }

    fn encode(&self, out: &mut String) {
        let series = self.0.read();
        if series.is_empty() {
            return;
        }
        self.0.header(out, "counter");
        for (labels, c) in series.values() {
            sample(out, &self.0.name, "", labels, None, c.get() as f64, 0);
        }
    }
}

/// A latency histogram over fixed bucket bounds. Its counts, count and sum change
/// together under one lock (held for a few stores by the one lane that observes it,
/// and for a copy by a scrape), so a scrape never sees a count without its bucket.
#[derive(Default)]
pub struct Histogram(Mutex<Counts>);

#[derive(Default, Clone)]
struct Counts {
    /// Per bucket, not cumulative; one more than the bounds: above the last bound.
    buckets: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Histogram {
    /// Counts `v` in the first bucket whose bound is at least `v` (`le`: less or equal).
    fn observe(&self, bounds: &[f64], v: f64) {
        let i = bounds.iter().position(|b| v <= *b).unwrap_or(bounds.len());
        let mut c = lock(&self.0);
        if c.buckets.is_empty() {
            c.buckets = vec![0; bounds.len() + 1];
        }
        c.buckets[i] += 1;
        c.count += 1;
        c.sum += v;
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
        self.h.observe(&self.bounds, v);
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
        self.series.get(values).observe(&self.bounds, v);
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

    fn encode(&self, out: &mut String) {
        let series = self.series.read();
        if series.is_empty() {
            return;
        }
        let name = self.series.name.as_str();
        self.series.header(out, "histogram");
        let mut c = Counts::default();
        for (labels, h) in series.values() {
            c.clone_from(&lock(&h.0));
            let mut cumulative = 0;
            for (i, le) in self.le.iter().enumerate() {
                cumulative += c.buckets.get(i).copied().unwrap_or(0);
                let le = Some(("le", le.as_str()));
                sample(out, name, "_bucket", labels, le, cumulative as f64, 0);
            }
            let inf = Some(("le", "+Inf"));
            sample(out, name, "_bucket", labels, inf, c.count as f64, 0);
            sample(out, name, "_sum", labels, None, c.sum, 0);
            sample(out, name, "_count", labels, None, c.count as f64, 0);
        }
    }
}

/// `# HELP` (when there is help) and `# TYPE` lines of a family.
pub(crate) fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    if !help.is_empty() {
        for part in ["# HELP ", name, " ", &escape(help, false), "\n"] {
            out.push_str(part);
        }
    }
    for part in ["# TYPE ", name, " ", kind, "\n"] {
        out.push_str(part);
    }
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
        counter_ours.encode(&mut got);
        ours.encode(&mut got);
        assert_eq!(got, want);
        assert!(
            want.contains(
                "h_seconds_bucket{mode=\"create\",op=\"fsync\",target=\"b\",le=\"0.000025\"} 1\n"
            ),
            "{want}"
        );
    }

    #[test]
    fn removed_and_empty_families_write_nothing() {
        let h = HistogramVec::new("h", "h", &["target"], &[1.0]);
        let mut out = String::new();
        h.encode(&mut out);
        assert_eq!(out, "");
        h.observe(&["a"], 0.5);
        assert!(h.remove_label_values(&["a"]));
        assert!(!h.remove_label_values(&["a"]));
        h.encode(&mut out);
        assert_eq!(out, "");
        let c = CounterVec::new("c_total", "c", &["target"]);
        c.with_label_values(&["a"]).inc();
        assert!(c.remove_label_values(&["a"]));
        c.encode(&mut out);
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
            h.encode(&mut out);
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
