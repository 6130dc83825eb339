//! The three exposition formats of `/metrics`, chosen by the `Accept` header: text
//! 0.0.4 (classic buckets, the default), OpenMetrics 1.0 (classic buckets with the
//! stall exemplars) and protobuf (classic and native buckets). The protobuf is decoded
//! here by hand, independently of the agent's encoder; a real Prometheus 2.42 with
//! `--enable-feature=native-histograms,exemplar-storage` ingests the native histograms,
//! and one without the flag ingests the OpenMetrics text.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::agent::Agent;
use crate::support::cmd::check_metrics;
use crate::support::loopfs::LoopFs;
use crate::support::machine;
use crate::support::metrics::Metrics;
use crate::support::prom::Prometheus;
use crate::support::root::require_root;
use crate::support::wait::wait_until;

const PROTOBUF: &str =
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited";
const OPENMETRICS: &str = "application/openmetrics-text;version=1.0.0";
const DURATION: &str = "stallwatch_probe_duration_seconds";

/// A protobuf field's value, as the wire format has it.
#[derive(Debug, Clone)]
enum Wire<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
}

fn read_varint(b: &[u8], at: &mut usize) -> u64 {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = b[*at];
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return v;
        }
    }
    panic!("varint longer than 10 bytes");
}

/// The fields of one message, in order.
fn fields(b: &[u8]) -> Vec<(u32, Wire<'_>)> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < b.len() {
        let key = read_varint(b, &mut at);
        let (field, wire) = ((key >> 3) as u32, key & 7);
        let v = match wire {
            0 => Wire::Varint(read_varint(b, &mut at)),
            1 => {
                let v = u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
                at += 8;
                Wire::Fixed64(v)
            }
            2 => {
                let len = read_varint(b, &mut at) as usize;
                let v = &b[at..at + len];
                at += len;
                Wire::Bytes(v)
            }
            w => panic!("wire type {w} at {at}"),
        };
        out.push((field, v));
    }
    out
}

fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// One decoded `Exemplar`: labels, value, timestamp (Unix seconds).
#[derive(Debug, Clone, Default)]
struct Ex {
    labels: BTreeMap<String, String>,
    value: f64,
    unix: f64,
}

/// One decoded `Histogram` metric of a family.
#[derive(Debug, Clone, Default)]
struct Hist {
    labels: BTreeMap<String, String>,
    count: u64,
    sum: f64,
    /// (upper bound, cumulative count, exemplar)
    buckets: Vec<(f64, u64, Option<Ex>)>,
    schema: Option<i64>,
    zero_threshold: f64,
    zero_count: u64,
    spans: Vec<(i64, u64)>,
    deltas: Vec<i64>,
    exemplars: Vec<Ex>,
}

impl Hist {
    /// The native buckets as (index, count), from spans and deltas.
    fn native(&self) -> Vec<(i64, i64)> {
        let mut out = Vec::new();
        let (mut index, mut count, mut d) = (0i64, 0i64, self.deltas.iter());
        for (n, &(offset, len)) in self.spans.iter().enumerate() {
            index += offset;
            if n > 0 {
                // After the previous span's last bucket.
            }
            for _ in 0..len {
                count += d.next().expect("a delta per bucket");
                out.push((index, count));
                index += 1;
            }
        }
        assert!(d.next().is_none(), "more deltas than span lengths");
        out
    }
}

fn string(w: &Wire) -> String {
    match w {
        Wire::Bytes(b) => String::from_utf8(b.to_vec()).unwrap(),
        other => panic!("not a string: {other:?}"),
    }
}

fn double(w: &Wire) -> f64 {
    match w {
        Wire::Fixed64(v) => f64::from_bits(*v),
        other => panic!("not a double: {other:?}"),
    }
}

fn uint(w: &Wire) -> u64 {
    match w {
        Wire::Varint(v) => *v,
        other => panic!("not a varint: {other:?}"),
    }
}

fn bytes<'a>(w: &Wire<'a>) -> &'a [u8] {
    match w {
        Wire::Bytes(b) => b,
        other => panic!("not a message: {other:?}"),
    }
}

fn label_pair(b: &[u8]) -> (String, String) {
    let f = fields(b);
    let get = |n| f.iter().find(|(k, _)| *k == n).map(|(_, v)| string(v));
    (get(1).unwrap_or_default(), get(2).unwrap_or_default())
}

fn exemplar(b: &[u8]) -> Ex {
    let mut e = Ex::default();
    for (k, v) in fields(b) {
        match k {
            1 => {
                let (n, v) = label_pair(bytes(&v));
                e.labels.insert(n, v);
            }
            2 => e.value = double(&v),
            3 => {
                let t = fields(bytes(&v));
                for (k, v) in t {
                    match k {
                        1 => e.unix += uint(&v) as i64 as f64,
                        2 => e.unix += uint(&v) as f64 / 1e9,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    e
}

/// The families of a protobuf scrape: name → (type, histograms; scalar metric count).
fn decode(body: &[u8]) -> BTreeMap<String, (u64, Vec<Hist>, usize)> {
    let mut at = 0;
    let mut out = BTreeMap::new();
    while at < body.len() {
        let len = read_varint(body, &mut at) as usize;
        let mf = &body[at..at + len];
        at += len;
        let (mut name, mut kind, mut hists, mut metrics) = (String::new(), 0, Vec::new(), 0);
        for (k, v) in fields(mf) {
            match k {
                1 => name = string(&v),
                3 => kind = uint(&v),
                4 => {
                    metrics += 1;
                    let mut h = Hist::default();
                    let mut is_hist = false;
                    for (k, v) in fields(bytes(&v)) {
                        match k {
                            1 => {
                                let (n, val) = label_pair(bytes(&v));
                                h.labels.insert(n, val);
                            }
                            7 => {
                                is_hist = true;
                                for (k, v) in fields(bytes(&v)) {
                                    match k {
                                        1 => h.count = uint(&v),
                                        2 => h.sum = double(&v),
                                        3 => {
                                            let (mut ub, mut c, mut ex) = (0.0, 0, None);
                                            for (k, v) in fields(bytes(&v)) {
                                                match k {
                                                    1 => c = uint(&v),
                                                    2 => ub = double(&v),
                                                    3 => ex = Some(exemplar(bytes(&v))),
                                                    _ => {}
                                                }
                                            }
                                            h.buckets.push((ub, c, ex));
                                        }
                                        5 => h.schema = Some(unzigzag(uint(&v))),
                                        6 => h.zero_threshold = double(&v),
                                        7 => h.zero_count = uint(&v),
                                        12 => {
                                            let s = fields(bytes(&v));
                                            let get = |n| {
                                                s.iter()
                                                    .find(|(k, _)| *k == n)
                                                    .map_or(0, |(_, v)| uint(v))
                                            };
                                            h.spans.push((unzigzag(get(1)), get(2)));
                                        }
                                        13 => match v {
                                            Wire::Bytes(packed) => {
                                                let mut p = 0;
                                                while p < packed.len() {
                                                    h.deltas.push(unzigzag(read_varint(
                                                        packed, &mut p,
                                                    )));
                                                }
                                            }
                                            Wire::Varint(d) => h.deltas.push(unzigzag(d)),
                                            Wire::Fixed64(_) => panic!("delta as fixed64"),
                                        },
                                        16 => h.exemplars.push(exemplar(bytes(&v))),
                                        _ => {}
                                    }
                                }
                            }
                            _ => {}
                        }
                    }
                    if is_hist {
                        hists.push(h);
                    }
                }
                _ => {}
            }
        }
        out.insert(name, (kind, hists, metrics));
    }
    assert_eq!(at, body.len(), "trailing bytes");
    out
}

fn scrape_as(agent: &Agent, accept: &str) -> (String, Vec<u8>) {
    let r = agent
        .get_raw("/metrics", &[("Accept", accept)])
        .unwrap_or_else(|e| panic!("GET /metrics: {e}"));
    assert_eq!(r.status, 200);
    (r.header("content-type").unwrap_or("").to_string(), r.body)
}

/// Checks a decoded probe histogram: schema 3, the zero threshold below a nanosecond,
/// native counts adding up to the classic `_count`, and every classic cumulative count
/// between the native buckets wholly below its bound and those starting below it.
fn check_native(h: &Hist) {
    assert_eq!(h.schema, Some(3), "{h:?}");
    assert!(
        h.zero_threshold > 0.0 && h.zero_threshold < 1e-9,
        "zero threshold {}",
        h.zero_threshold
    );
    let native = h.native();
    // Gaps of one or two empty buckets may sit inside a span, as zeros.
    assert!(native.iter().all(|&(_, c)| c >= 0), "{native:?}");
    let total: i64 = native.iter().map(|b| b.1).sum::<i64>() + h.zero_count as i64;
    assert_eq!(
        total as u64, h.count,
        "native buckets add up to _count: {h:?}"
    );
    assert!(native.len() <= 160);
    assert_eq!(h.buckets.len(), 23, "the classic buckets too");
    for &(le, cumulative, _) in &h.buckets {
        let ub = |i: i64| (i as f64 / 8.0).exp2();
        let below: i64 = native.iter().filter(|b| ub(b.0) <= le).map(|b| b.1).sum();
        let starting: i64 = native
            .iter()
            .filter(|b| ub(b.0 - 1) < le)
            .map(|b| b.1)
            .sum();
        let zero = h.zero_count as i64;
        assert!(
            below + zero <= cumulative as i64 && cumulative as i64 <= starting + zero,
            "le={le}: classic {cumulative} outside native [{below}, {starting}]"
        );
    }
}

fn tmp_agent(dir: &std::path::Path, interval: &str) -> Agent {
    Agent::start(&format!(
        "targets:\n  - path: {}\n    name: tmp\n    require_mountpoint: false\n    interval: {interval}\n",
        dir.display()
    ))
}

/// Protobuf when asked for it, with every probe histogram native and classic; text by
/// default and for `text/plain`, byte for byte the classic buckets it always was;
/// OpenMetrics for `application/openmetrics-text`, ending in `# EOF`.
#[test]
fn each_format_when_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let agent = tmp_agent(dir.path(), "100ms");
    assert!(wait_until(
        Duration::from_secs(10),
        Duration::from_millis(100),
        || agent
            .scrape()
            .sum(&format!("{DURATION}_count"), &[("target", "tmp")])
            >= 40.0
    ));

    let (ct, body) = scrape_as(&agent, PROTOBUF);
    assert!(ct.starts_with("application/vnd.google.protobuf"), "{ct}");
    assert!(
        ct.contains("proto=io.prometheus.client.MetricFamily") && ct.contains("encoding=delimited")
    );
    let families = decode(&body);
    let (kind, hists, _) = &families[DURATION];
    assert_eq!(*kind, 4, "histogram");
    // Default modes create and overwrite: 5 ops, each its own series.
    assert_eq!(hists.len(), 5, "{hists:?}");
    for h in hists {
        check_native(h);
        assert!(h.count > 0, "{h:?}");
    }
    // The same families in both formats.
    let (_, text, _) = agent.get("/metrics");
    let mut text_names: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .collect();
    text_names.sort();
    let pb_names: Vec<String> = families.keys().cloned().collect();
    assert_eq!(pb_names, text_names, "the same families");
    assert_eq!(families["stallwatch_stalls_total"].0, 0, "a counter");
    assert_eq!(
        families["stallwatch_probe_inflight_seconds"].0, 1,
        "a gauge"
    );

    // Text: default, */* and text/plain, the classic buckets only.
    for accept in ["*/*", "text/plain;version=0.0.4", "application/json"] {
        let (ct, body) = scrape_as(&agent, accept);
        assert_eq!(
            ct, "text/plain; version=0.0.4; charset=utf-8",
            "for {accept}"
        );
        let t = String::from_utf8(body).unwrap();
        let m = Metrics::parse(&t).unwrap();
        assert_eq!(m.type_of(DURATION), Some("histogram"));
        let buckets = m.count(
            &format!("{DURATION}_bucket"),
            &[("target", "tmp"), ("mode", "create"), ("op", "create")],
        );
        assert_eq!(buckets, 24, "23 bounds and +Inf");
        assert!(!t.contains("# EOF") && !t.contains(" # {"));
        check_metrics(&t);
    }

    // OpenMetrics: its own content type, counters declared without _total, # EOF.
    let (ct, body) = scrape_as(&agent, OPENMETRICS);
    assert_eq!(
        ct,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let om = String::from_utf8(body).unwrap();
    assert!(
        om.ends_with("\n# EOF\n"),
        "{}",
        &om[om.len().saturating_sub(200)..]
    );
    assert!(om.contains("# TYPE stallwatch_stalls counter\n"), "{om}");
    assert!(om.contains("\nstallwatch_stalls_total{"), "{om}");
    assert!(!om.contains("# TYPE stallwatch_stalls_total"));
    for line in om.lines().filter(|l| l.starts_with("# TYPE ")) {
        let parts: Vec<&str> = line.split(' ').collect();
        assert!(
            parts[3] != "counter" || !parts[2].ends_with("_total"),
            "{line}"
        );
    }
    nom_openmetrics::parser::openmetrics(&om).unwrap_or_else(|e| panic!("not OpenMetrics: {e:?}"));
}

/// How many series a Prometheus keeps of one default target.
fn series_of(p: &Prometheus, target: &str) -> f64 {
    p.scalar(&format!(
        "count({{__name__=~\"stallwatch_.*\", target=\"{target}\"}})"
    ))
}

/// A real Prometheus 2.42 with native histograms on ingests the probe histograms as
/// native (one series each, the classic buckets dropped); one without the flag
/// ingests the OpenMetrics text with the classic buckets. Prints the series of one
/// default target in each mode (docs/metrics.md, "Series budget").
#[test]
fn a_real_prometheus_ingests_native_histograms() {
    let dir = tempfile::tempdir().unwrap();
    let agent = tmp_agent(dir.path(), "200ms");
    assert!(agent.wait_up("tmp"));
    let pdir = tempfile::tempdir().unwrap();
    for sub in ["native", "classic"] {
        std::fs::create_dir(pdir.path().join(sub)).unwrap();
    }
    let native = Prometheus::builder(&pdir.path().join("native"), "stallwatch")
        .targets(&[agent.addr().to_string()])
        .flag("--enable-feature=native-histograms,exemplar-storage")
        .start();
    let classic = Prometheus::builder(&pdir.path().join("classic"), "stallwatch")
        .targets(&[agent.addr().to_string()])
        .start();
    let q = format!("histogram_count(rate({DURATION}{{target=\"tmp\",op=\"create\"}}[1m]))");
    let ingested = wait_until(Duration::from_secs(40), Duration::from_millis(500), || {
        native.scalar(&q) > 0.0 && classic.scalar("up") == 1.0
    });
    assert!(ingested, "{q}: {:?}\n{}", native.query(&q), native.log());
    let raw = native
        .query(&format!("{DURATION}{{target=\"tmp\"}}"))
        .unwrap();
    assert_eq!(raw.len(), 5, "{raw:?}");
    for s in &raw {
        assert!(s["histogram"].is_array(), "a native sample: {s}");
        assert!(s.get("value").is_none(), "{s}");
    }
    // The classic buckets are not ingested beside the native histogram by 2.42.
    assert_eq!(
        native.scalar(&format!("count({DURATION}_bucket{{target=\"tmp\"}})")),
        0.0
    );
    assert_eq!(
        classic.scalar(&format!("count({DURATION}_bucket{{target=\"tmp\"}})")),
        5.0 * 24.0
    );
    // Both scrapes healthy: protobuf in one, OpenMetrics in the other.
    for p in [&native, &classic] {
        let (_, body) = p.get("/api/v1/targets", &[]).unwrap();
        let v: Value = serde_json::from_str(&body).unwrap();
        let t = &v["data"]["activeTargets"][0];
        assert_eq!(t["health"], "up", "{t}");
        assert_eq!(t["lastError"], "", "{t}");
    }
    // The series of one default target, each way.
    std::thread::sleep(Duration::from_secs(2));
    let (n, c) = (series_of(&native, "tmp"), series_of(&classic, "tmp"));
    println!("series of one default target: classic (text/OpenMetrics) {c}, native (protobuf) {n}");
    // Per histogram series: 24 buckets, _sum and _count become one native series.
    assert_eq!(c - n, 5.0 * 25.0, "classic {c}, native {n}");
}

/// A freeze makes a stall; the observation of the call that became it carries an
/// exemplar with the event's `stall_id`, in OpenMetrics and in protobuf, and that id
/// resolves at `/api/stalls/{id}`.
#[test]
fn a_stall_exemplar_leads_to_the_stall() {
    if !require_root("a_stall_exemplar_leads_to_the_stall") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("xfs", 320);
    let agent = Agent::start(&format!(
        "stall_threshold: 1s\ntargets:\n  - path: {}\n    name: frozen\n    interval: 200ms\n    modes: [create]\n",
        fs.path().display()
    ));
    assert!(agent.wait_up("frozen"));
    // One Prometheus scraping OpenMetrics, one protobuf with native histograms: both
    // keep exemplars.
    let pdir = tempfile::tempdir().unwrap();
    let proms: Vec<Prometheus> = [
        ("openmetrics", "--enable-feature=exemplar-storage"),
        (
            "native",
            "--enable-feature=native-histograms,exemplar-storage",
        ),
    ]
    .iter()
    .map(|(sub, flag)| {
        let d = pdir.path().join(sub);
        std::fs::create_dir(&d).unwrap();
        Prometheus::builder(&d, "stallwatch")
            .targets(&[agent.addr().to_string()])
            .flag(flag)
            .start()
    })
    .collect();
    fs.freeze();
    let frozen_at = Instant::now();
    std::thread::sleep(Duration::from_millis(2500));
    fs.thaw();
    let frozen_for = frozen_at.elapsed().as_secs_f64();
    assert!(wait_until(
        Duration::from_secs(10),
        Duration::from_millis(100),
        || {
            let (_, body, _) = agent.get("/api/stalls");
            let v: Vec<Value> = serde_json::from_str(&body).unwrap();
            v.iter().any(|e| e["ongoing"] == false)
        }
    ));

    // OpenMetrics: one bucket line with the exemplar.
    let (_, body) = scrape_as(&agent, OPENMETRICS);
    let om = String::from_utf8(body).unwrap();
    let lines: Vec<&str> = om.lines().filter(|l| l.contains(" # {")).collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = lines[0];
    assert!(line.starts_with(&format!("{DURATION}_bucket{{")), "{line}");
    let (_, ex) = line.split_once(" # {stall_id=\"").unwrap();
    let (id, rest) = ex.split_once("\"} ").unwrap();
    let parts: Vec<f64> = rest.split(' ').map(|x| x.parse().unwrap()).collect();
    assert!(
        (parts[0] - frozen_for).abs() < 1.0,
        "{line}: value for a {frozen_for:.2} s freeze"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!((now - parts[1]).abs() < 30.0, "{line}: timestamp");
    // The bucket's bound is at least the value.
    let le: f64 = line
        .split("le=\"")
        .nth(1)
        .and_then(|x| x.split('"').next())
        .map(|x| {
            if x == "+Inf" {
                f64::INFINITY
            } else {
                x.parse().unwrap()
            }
        })
        .unwrap();
    assert!(le >= parts[0], "{line}");

    let (status, body, _) = agent.get(&format!("/api/stalls/{id}"));
    assert_eq!(status, 200, "{body}");
    let ev: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(ev["id"], id, "{ev}");
    assert_eq!(ev["target"], "frozen");

    // Protobuf: the same exemplar in its classic bucket and as the native exemplar.
    let (_, body) = scrape_as(&agent, PROTOBUF);
    let families = decode(&body);
    let with: Vec<&Hist> = families[DURATION]
        .1
        .iter()
        .filter(|h| !h.exemplars.is_empty())
        .collect();
    assert_eq!(with.len(), 1, "{with:?}");
    let h = with[0];
    check_native(h);
    assert_eq!(h.exemplars[0].labels["stall_id"], id);
    assert_eq!(h.exemplars[0].value, parts[0]);
    let classic: Vec<&Ex> = h.buckets.iter().filter_map(|b| b.2.as_ref()).collect();
    assert_eq!(classic.len(), 1);
    assert_eq!(classic[0].labels["stall_id"], id);

    // And both Prometheus servers keep it: on the `_bucket` series from OpenMetrics,
    // on the native series from protobuf.
    for prom in &proms {
        let mut last = String::new();
        let found = wait_until(Duration::from_secs(15), Duration::from_millis(500), || {
            let (_, body) = prom
                .get(
                    "/api/v1/query_exemplars",
                    &[
                        ("query", &format!("{{__name__=~\"{DURATION}.*\"}}")),
                        ("start", &format!("{}", now - 600.0)),
                        ("end", &format!("{}", now + 600.0)),
                    ],
                )
                .unwrap_or_default();
            let ok = body.contains(&format!("\"stall_id\":\"{id}\""));
            last = body;
            ok
        });
        assert!(found, "no exemplar in Prometheus: {last}\n{}", prom.log());
    }
}
