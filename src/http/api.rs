//! `/api/history`: the live page's data (the last range of every target's latencies, the
//! kernel's seconds, the stall events the page does not have yet), written as columns.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::json::JsonOut;
use super::state::{App, StallsJson};
use crate::base::sync::lock;
use crate::history;
use crate::probe::State as TargetState;
use crate::stall::event::StallEvent;

/// Unix seconds at which `e` ended (or its age so far, while ongoing).
fn event_end(e: &StallEvent) -> f64 {
    e.started_at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
        + e.duration_seconds
}

/// `GET /api/history` parameters.
#[derive(Debug, serde::Deserialize)]
pub(super) struct HistoryQuery {
    /// Unix seconds: only points at or after it (rounded down to a step), and the stall
    /// events that started or ended since. Without it, the whole range.
    since: Option<f64>,
    /// Seconds back from now, 1-3600; 300 by default.
    range: Option<u32>,
    /// Seconds per point, 1-60; by default 1 up to a 5-minute range, else range/360.
    step: Option<u32>,
    /// The `stalls_version` of an earlier answer: the events are left out when the log
    /// has not changed since (and none is ongoing).
    stalls_version: Option<u64>,
    /// Only this target (by name) in `targets`.
    target: Option<String>,
    /// `overview`: per target and op a coarse strip of the worst latency against the
    /// threshold instead of the series ([`View`]).
    #[serde(default)]
    view: View,
}

/// What `/api/history` answers per target.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum View {
    /// Every op's series: count, max, median and min per second or step.
    #[default]
    Full,
    /// The live page's overview: per op, the slowest call of each of about
    /// [`STRIPS`] steps against the target's threshold ([`worst_level`]).
    Overview,
}

/// Steps of an overview strip over a range: its step is `range / STRIPS` rounded up (to
/// a multiple of 10 s above 10 s, so an hour is 120 steps of 30 s read from the coarse
/// ring).
pub const STRIPS: u32 = 120;

/// The overview's step for `range`.
fn strip_step(range: u32) -> u32 {
    let s = range.div_ceil(STRIPS).max(1);
    if s > history::COARSE_STEP {
        s.next_multiple_of(history::COARSE_STEP)
    } else {
        s
    }
}

/// The overview's level of a step's slowest call against the stall threshold: tenths of
/// a decade, `floor(10 * log10(max / threshold))`, from -60 to 60. 0 and above: the
/// call took the threshold or longer; -10: a tenth of it; -30: a thousandth.
pub fn worst_level(max: f32, threshold: f64) -> i64 {
    if max.is_nan() || max <= 0.0 || threshold <= 0.0 {
        return -60;
    }
    let l = (10.0 * libm::log10(max as f64 / threshold)).floor();
    l.clamp(-60.0, 60.0) as i64
}

/// Answers `/api/history` from the in-memory history; the handler only copies points
/// out under the series' locks. The points are columns (docs/http-api.md, "`/api/history`").
pub fn history_json(
    app: &App,
    since: Option<f64>,
    range: Option<u32>,
    step: Option<u32>,
    stalls_version: Option<u64>,
) -> String {
    let q = HistoryQuery {
        since,
        range,
        step,
        stalls_version,
        target: None,
        view: View::Full,
    };
    String::from_utf8(history_body(app, &q)).expect("the answer is UTF-8")
}

/// `/api/history?view=overview`: the live page's overview (docs/http-api.md).
pub fn overview_json(
    app: &App,
    since: Option<f64>,
    range: Option<u32>,
    stalls_version: Option<u64>,
) -> String {
    let q = HistoryQuery {
        since,
        range,
        step: None,
        stalls_version,
        target: None,
        view: View::Overview,
    };
    String::from_utf8(history_body(app, &q)).expect("the answer is UTF-8")
}

fn history_body(app: &App, q: &HistoryQuery) -> Vec<u8> {
    let HistoryQuery {
        since,
        range,
        step,
        stalls_version,
        ..
    } = *q;
    let now = SystemTime::now();
    let now_s = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let range = range
        .unwrap_or(300)
        .clamp(1, history::RETAIN.as_secs() as u32);
    let step = step
        .unwrap_or(if range <= 300 { 1 } else { range.div_ceil(360) })
        .clamp(1, 60);
    let oldest = now_s as u32 - range;
    let from = since
        .filter(|s| s.is_finite())
        .map_or(oldest, |s| (s.max(0.0) as u32).max(oldest));
    let from = from - from % step;
    let strip = strip_step(range);
    // The overview's strips: whole steps from the one `from` falls in, one per step up
    // to now (null where no call returned).
    let strip_from = from - from % strip;
    let strips = (now_s as u32).saturating_sub(strip_from) / strip + 1;
    // The lanes hold their latest calls (`probe/pending.rs`): recorded before they are read.
    app.targets.fold_pending();
    let current = app.targets.current();
    // Events that were ongoing, started or ended in the window, unless the page has
    // them already: the page merges them by `id`. Without a stalls_version, the
    // serialized events serve while the log has not changed.
    let mut cache = lock(&app.stalls_json);
    let known = stalls_version.or(cache.as_ref().map(|c| c.version));
    let (version, events) = app.stalls.events_if_changed(known);
    let events = match events {
        None if stalls_version.is_some() => None,
        None => Some(None),
        Some(ev) if ev.iter().any(|e| e.ongoing) => Some(Some(ev)),
        Some(ev) => {
            if cache.as_ref().is_none_or(|c| c.version != version) {
                let mut c = StallsJson {
                    version,
                    json: Vec::with_capacity(ev.len() * 640),
                    events: Vec::with_capacity(ev.len()),
                };
                for e in &ev {
                    let start = c.json.len();
                    serde_json::to_writer(&mut c.json, e).expect("serializable");
                    c.events.push((event_end(e), start..c.json.len()));
                }
                *cache = Some(c);
            }
            Some(None)
        }
    };
    let events: Option<Option<Vec<_>>> = events.map(|ev| {
        ev.map(|ev| {
            ev.into_iter()
                .filter(|e| e.ongoing || event_end(e) >= from as f64)
                .collect()
        })
    });
    // Sized once: a first load of an hour is about 25 bytes a point, an event 600.
    let points = if since.is_some() { 8 } else { range / step + 2 } as usize;
    let series: usize = current.iter().map(|t| t.ops.len()).sum();
    let n_events = match &events {
        Some(Some(e)) => e.len() * 640,
        Some(None) => cache.as_ref().map_or(0, |c| c.json.len()),
        None => 0,
    };
    let mut o = JsonOut(Vec::with_capacity(
        4096 + series * points * 28 + points * 80 + n_events,
    ));
    let _ = write!(
        o,
        "{{\"now\":{now_s:.3},\"range\":{range},\"step\":{step},\"from\":{from},"
    );
    if q.view == View::Overview {
        let _ = write!(
            o,
            "\"view\":\"overview\",\"strip_step\":{strip},\"strip_from\":{strip_from},"
        );
    }
    o.raw("\"targets\":[");
    let mut first_target = true;
    for t in current.iter() {
        if q.target.as_ref().is_some_and(|n| *n != t.target.name) {
            continue;
        }
        let st = t.status();
        let detail = match &st.state {
            TargetState::Failing(e) | TargetState::MountChanged(e) => e.as_str(),
            _ => "",
        };
        if !std::mem::take(&mut first_target) {
            o.raw(",");
        }
        o.raw("{\"name\":");
        o.str(&t.target.name);
        o.raw(",\"path\":");
        o.str(&t.target.path.display().to_string());
        o.raw(",\"state\":");
        o.str(st.state.label());
        o.raw(",\"detail\":");
        o.str(detail);
        let _ = write!(
            o,
            ",\"interval_seconds\":{},\"stall_threshold_seconds\":{},\"in_flight\":[",
            t.target.interval.as_secs_f64(),
            t.target.stall_threshold.as_secs_f64()
        );
        for (j, c) in t.in_flight().iter().enumerate() {
            let _ = write!(
                o,
                "{}{{\"mode\":\"{}\",\"op\":\"{}\",\"age_seconds\":{:.3}}}",
                if j > 0 { "," } else { "" },
                c.mode.as_str(),
                c.op.as_str(),
                c.age.as_secs_f64()
            );
        }
        if q.view == View::Overview {
            o.raw("],\"ops\":[");
            let threshold = t.target.stall_threshold.as_secs_f64();
            if let Some(h) = app.history.target(t.index) {
                let mut levels = vec![None; strips as usize];
                for (j, s) in h.series.iter().enumerate() {
                    levels.fill(None);
                    for p in s.stepped(strip_from, strip) {
                        if let Some(l) =
                            p.t.checked_sub(strip_from)
                                .and_then(|d| levels.get_mut((d / strip) as usize))
                        {
                            *l = Some(worst_level(p.max, threshold));
                        }
                    }
                    let _ = write!(
                        o,
                        "{}{{\"mode\":\"{}\",\"op\":\"{}\",\"worst\":[",
                        if j > 0 { "," } else { "" },
                        s.mode.as_str(),
                        s.op.as_str()
                    );
                    for (k, l) in levels.iter().enumerate() {
                        if k > 0 {
                            o.0.push(b',');
                        }
                        match l {
                            Some(l) => o.int(*l),
                            None => o.raw("null"),
                        }
                    }
                    o.raw("]}");
                }
            }
            o.raw("]}");
            continue;
        }
        o.raw("],\"series\":[");
        if let Some(h) = app.history.target(t.index) {
            for (j, s) in h.series.iter().enumerate() {
                let p = s.stepped(from, step);
                let _ = write!(
                    o,
                    "{}{{\"mode\":\"{}\",\"op\":\"{}\",",
                    if j > 0 { "," } else { "" },
                    s.mode.as_str(),
                    s.op.as_str()
                );
                o.times(from, p.iter().map(|p| p.t));
                o.column("count", &p, |o, p| o.int(p.count as i64));
                o.column("max_us", &p, |o, p| o.micros(p.max));
                // A point of one call is that call: min = median = max.
                let many: Vec<_> = p.iter().filter(|p| p.count > 1).collect();
                o.column("p50_us", &many, |o, p| o.micros(p.p50));
                o.column("min_us", &many, |o, p| o.micros(p.min));
                o.raw("}");
            }
        }
        o.raw("]}");
    }
    o.raw("],\"kernel\":{");
    let k = history::step_kernel(&app.history.kernel_since(from), step);
    o.times(from, k.iter().map(|p| p.t));
    o.column("dirty_bytes", &k, |o, p| o.int(p.dirty_bytes as i64));
    o.column("writeback_bytes", &k, |o, p| {
        o.int(p.writeback_bytes as i64)
    });
    o.column("dirty_background_threshold_bytes", &k, |o, p| {
        o.int(p.dirty_background_threshold_bytes as i64)
    });
    o.column("dirty_threshold_bytes", &k, |o, p| {
        o.int(p.dirty_threshold_bytes as i64)
    });
    o.column("io_pressure_some_ratio", &k, |o, p| o.ratio(p.io_some));
    o.column("io_pressure_full_ratio", &k, |o, p| o.ratio(p.io_full));
    o.raw("}");
    let _ = write!(o, ",\"stalls_version\":{version}");
    match events {
        Some(Some(events)) => {
            o.raw(",\"stalls\":");
            serde_json::to_writer(&mut o.0, &events).expect("serializable");
        }
        Some(None) => {
            let c = cache.as_ref().expect("cached just above");
            o.raw(",\"stalls\":[");
            let mut first = true;
            for (end, r) in &c.events {
                if *end >= from as f64 {
                    if !first {
                        o.0.push(b',');
                    }
                    first = false;
                    o.0.extend_from_slice(&c.json[r.clone()]);
                }
            }
            o.0.push(b']');
        }
        None => {}
    }
    o.raw("}");
    o.0
}

pub(super) async fn api_history(
    State(app): State<Arc<App>>,
    Query(q): Query<HistoryQuery>,
) -> Response {
    let body = history_body(&app, &q);
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::fixture::{full_hour, full_hour_of};

    fn gzip(body: &str) -> usize {
        use std::io::Write as _;
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        z.write_all(body.as_bytes()).unwrap();
        z.finish().unwrap().len()
    }

    #[test]
    fn worst_levels_are_tenths_of_a_decade_against_the_threshold() {
        assert_eq!(worst_level(1.0, 1.0), 0, "at the threshold");
        assert_eq!(worst_level(0.999, 1.0), -1, "just under it");
        assert_eq!(worst_level(0.1, 1.0), -10);
        assert_eq!(worst_level(0.0011, 1.0), -30);
        assert_eq!(worst_level(25.0, 5.0), 6, "5 times: 10 log10 5 = 6.99");
        assert_eq!(worst_level(1e9, 1.0), 60);
        assert_eq!(worst_level(0.0, 1.0), -60);
        assert_eq!(worst_level(f32::NAN, 1.0), -60);
        // As with the C library's log10, a latency every 1009th f32 against three thresholds.
        for threshold in [1.0, 5.0, 0.3] {
            for bits in (1..0x7f80_0000u32).step_by(1009) {
                let max = f32::from_bits(bits);
                let c = (10.0 * (max as f64 / threshold).log10()).floor();
                assert_eq!(worst_level(max, threshold), c.clamp(-60.0, 60.0) as i64);
            }
        }
        assert_eq!(strip_step(3600), 30);
        assert_eq!(strip_step(300), 3);
        assert_eq!(strip_step(60), 1);
    }

    /// The budget of issue 22: the overview of 64 targets with a full hour, as the page
    /// first loads it at the 1 h range (with the 256 stall events), at most 150 KB with
    /// gzip; the full answer is several times that. Prints both with `--nocapture`.
    #[test]
    fn the_overview_of_64_targets_for_an_hour_is_under_150_kb_gzipped() {
        let (app, _, calls) = full_hour_of(64, || 0);
        let body = overview_json(&app, None, Some(3600), None);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["view"], "overview");
        assert_eq!(v["strip_step"], 30);
        let strip_from = v["strip_from"].as_u64().unwrap();
        assert_eq!(strip_from % 30, 0);
        let targets = v["targets"].as_array().unwrap();
        assert_eq!(targets.len(), 64);
        for t in targets {
            assert!(t.get("series").is_none(), "no series in the overview");
            let ops = t["ops"].as_array().unwrap();
            assert_eq!(ops.len(), 5, "{}", t["name"]);
            for op in ops {
                let n = op["worst"].as_array().unwrap().len();
                assert!((120..=122).contains(&n), "{n} strips in an hour");
            }
        }
        // Each strip is the slowest call of its 30 s against the 1 s threshold.
        let worst = targets[0]["ops"][0]["worst"].as_array().unwrap();
        for (i, w) in worst.iter().enumerate() {
            let t0 = strip_from + 30 * i as u64;
            let max = calls
                .iter()
                .filter(|c| (t0..t0 + 30).contains(&c.0))
                .map(|c| c.1)
                .max();
            match max {
                // Within the history's 1/2048: a boundary case may differ by one level.
                Some(ns) => {
                    let want = worst_level(ns as f32 / 1e9, 1.0);
                    assert!((w.as_i64().unwrap() - want).abs() <= 1, "{i}: {w} {want}")
                }
                None => assert!(w.is_null() || i == worst.len() - 1, "{i}: {w}"),
            }
        }
        assert_eq!(v["stalls"].as_array().unwrap().len(), 256);
        assert!(v["kernel"]["t"].as_array().unwrap().len() >= 359);
        let zipped = gzip(&body);
        let full = history_json(&app, None, Some(3600), None, None);
        println!(
            "overview of 64 targets, 1 h: {} bytes, {zipped} gzip; the full answer: {} bytes, {} gzip",
            body.len(),
            full.len(),
            gzip(&full)
        );
        assert!(zipped <= 150_000, "{zipped} bytes gzipped");
        // A poll asks for what is new: a step or two per op.
        let since = v["now"].as_f64().unwrap() - 2.0;
        let version = v["stalls_version"].as_u64().unwrap();
        let poll: serde_json::Value =
            serde_json::from_str(&overview_json(&app, Some(since), Some(3600), Some(version)))
                .unwrap();
        let n = poll["targets"][5]["ops"][1]["worst"]
            .as_array()
            .unwrap()
            .len();
        assert!((1..=2).contains(&n), "{n}");
        assert!(poll.get("stalls").is_none());
        // One target's full series, for its detail.
        let q = HistoryQuery {
            since: None,
            range: Some(300),
            step: None,
            stalls_version: Some(version),
            target: Some("target42".into()),
            view: View::Full,
        };
        let one: serde_json::Value = serde_json::from_slice(&history_body(&app, &q)).unwrap();
        let names: Vec<_> = one["targets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| &t["name"])
            .collect();
        assert_eq!(names, ["target42"]);
        assert_eq!(one["targets"][0]["series"].as_array().unwrap().len(), 5);
    }

    /// Unix seconds of the points of `s`, a series or the kernel object, from its `t`
    /// deltas and the answer's `from`.
    fn times(v: &serde_json::Value, s: &serde_json::Value) -> Vec<u64> {
        let mut t = v["from"].as_u64().unwrap();
        s["t"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                t += d.as_u64().unwrap();
                t
            })
            .collect()
    }

    #[test]
    fn the_history_answer_has_every_target_op_and_second() {
        let (app, _, calls) = full_hour(|| 0);
        let v: serde_json::Value =
            serde_json::from_str(&history_json(&app, None, Some(300), None, None)).unwrap();
        assert_eq!(v["step"], 1);
        let from = v["from"].as_u64().unwrap();
        let targets = v["targets"].as_array().unwrap();
        assert_eq!(targets.len(), 8);
        for t in targets {
            let series = t["series"].as_array().unwrap();
            assert_eq!(series.len(), 5, "{}", t["name"]);
            for s in series {
                let ts = times(&v, s);
                let n = ts.len();
                assert!((299..=301).contains(&n), "{n} points in 5 min at 1 s");
                assert!(ts[0] >= from && ts.windows(2).all(|w| w[1] == w[0] + 1));
                assert_eq!(s["count"].as_array().unwrap().len(), n);
                assert_eq!(s["max_us"].as_array().unwrap().len(), n);
                // One call a second: the call is its min, median and max.
                assert!(s["count"].as_array().unwrap().iter().all(|c| c == 1));
                assert_eq!(s["p50_us"].as_array().unwrap().len(), 0);
                assert_eq!(s["min_us"].as_array().unwrap().len(), 0);
            }
        }
        // The points are the history's, in microseconds.
        let want = app.history.target(0).unwrap().series[0].since(from as u32);
        let s = &targets[0]["series"][0];
        assert_eq!(
            times(&v, s),
            want.iter().map(|p| p.t as u64).collect::<Vec<_>>()
        );
        for (got, p) in s["max_us"].as_array().unwrap().iter().zip(&want) {
            let us = got.as_f64().unwrap();
            // To 4 significant digits.
            assert!(
                (us / (p.max as f64 * 1e6) - 1.0).abs() <= 5e-4,
                "{us} µs for {} s",
                p.max
            );
        }
        // Every call of the range, each as measured to a thousandth.
        let calls: Vec<_> = calls.iter().filter(|c| c.0 >= from).collect();
        assert_eq!(times(&v, s), calls.iter().map(|c| c.0).collect::<Vec<_>>());
        for (got, (_, ns)) in s["max_us"].as_array().unwrap().iter().zip(&calls) {
            let us = got.as_f64().unwrap();
            let want = *ns as f64 / 1e3;
            assert!((us / want - 1.0).abs() <= 1e-3, "{us} µs for {want} µs");
        }
        let k = &v["kernel"];
        let kt = times(&v, k);
        assert!((299..=301).contains(&kt.len()), "{}", kt.len());
        assert_eq!(k["dirty_threshold_bytes"][10], 4u64 << 30);
        assert_eq!(k["dirty_background_threshold_bytes"][10], 2u64 << 30);
        assert!((k["io_pressure_some_ratio"][10].as_f64().unwrap() - 0.1).abs() < 1e-6);
        assert_eq!(v["stalls"].as_array().unwrap().len(), 256);
        // The second answer copies the events serialized for the first: the same JSON.
        let again: serde_json::Value =
            serde_json::from_str(&history_json(&app, None, Some(300), None, None)).unwrap();
        assert_eq!(
            again["stalls"],
            serde_json::to_value(app.stalls.events()).unwrap()
        );
        assert_eq!(again["stalls"], v["stalls"]);
        let hour: serde_json::Value =
            serde_json::from_str(&history_json(&app, None, Some(3600), None, None)).unwrap();
        assert_eq!(hour["step"], 10);
        let s = &hour["targets"][0]["series"][0];
        let ts = times(&hour, s);
        let n = ts.len();
        assert!((359..=361).contains(&n), "{n} points in 1 h at 10 s steps");
        assert!(ts.iter().all(|t| t % 10 == 0), "steps aligned to 10 s");
        // Ten calls a step: a median and a min for every point.
        let many = s["count"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| *c != 1)
            .count();
        assert_eq!(s["p50_us"].as_array().unwrap().len(), many);
        assert_eq!(s["min_us"].as_array().unwrap().len(), many);
        let want = app.history.target(0).unwrap().series[0]
            .stepped(hour["from"].as_u64().unwrap() as u32, 10);
        assert_eq!(ts, want.iter().map(|p| p.t as u64).collect::<Vec<_>>());
        let p50: Vec<f64> = want
            .iter()
            .filter(|p| p.count > 1)
            .map(|p| p.p50 as f64 * 1e6)
            .collect();
        for (got, w) in s["p50_us"].as_array().unwrap().iter().zip(&p50) {
            assert!(
                (got.as_f64().unwrap() / w - 1.0).abs() <= 5e-4,
                "{got} µs, want {w}"
            );
        }
        // A poll asks only for what is new, and gets no events it already has.
        let since = hour["now"].as_f64().unwrap() - 2.0;
        let version = hour["stalls_version"].as_u64().unwrap();
        let poll: serde_json::Value = serde_json::from_str(&history_json(
            &app,
            Some(since),
            Some(300),
            None,
            Some(version),
        ))
        .unwrap();
        let n = poll["targets"][0]["series"][0]["t"]
            .as_array()
            .unwrap()
            .len();
        assert!(n <= 3, "{n} points since 2 s ago");
        assert_eq!(poll["stalls_version"], version);
        assert!(poll.get("stalls").is_none(), "unchanged events sent again");
        // A stall log that changed since: its events again.
        let poll: serde_json::Value = serde_json::from_str(&history_json(
            &app,
            Some(since),
            Some(300),
            None,
            Some(version - 1),
        ))
        .unwrap();
        assert_eq!(poll["stalls"].as_array().unwrap().len(), 256);
    }
}
