//! The routes: `/metrics`, `/healthz`, `/` (the live page and its `/assets/`),
//! `/api/stalls`, `/api/history`. Every handler reads the latest cached state only;
//! nothing here waits on a probe. The server around them (TLS, auth, limits, accept
//! loop) is `web/`.

pub mod server;

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tower_http::compression::CompressionLayer;

use crate::base::sync::lock;
use crate::exposition::registry as metrics;
use crate::history::{self, History};
use crate::probe::{State as TargetState, Targets};
use crate::sampler::Latest;
use crate::stall::log::StallLog;

/// Events listed on the landing page; `/api/stalls` has them all.
const PAGE_EVENTS: usize = 50;

/// Re-reads the configuration: what changed, or why the file was refused. Blocking.
pub type ReloadFn = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// What the handlers read.
pub struct App {
    pub registry: crate::exposition::registry::Registry,
    pub stalls: Arc<StallLog>,
    pub targets: Arc<Targets>,
    /// The last hour of latencies and kernel samples, for the live page.
    pub history: Arc<History>,
    /// The sampler's latest kernel sample, for the landing page.
    pub latest: Arc<Latest>,
    pub telemetry_path: String,
    /// `--web.enable-lifecycle`: what `POST /-/reload` calls; None when off.
    pub reload: Option<ReloadFn>,
    /// The stall events as `/api/history` last serialized them.
    pub stalls_json: Mutex<Option<StallsJson>>,
}

/// The stall events serialized once per change of the log (while none is ongoing, as
/// an ongoing one changes as it lasts): a first load then copies bytes instead of
/// cloning and serializing up to 256 events with their context.
pub struct StallsJson {
    version: u64,
    json: Vec<u8>,
    /// Each event's end (Unix seconds) and its bytes in `json`, newest first.
    events: Vec<(f64, std::ops::Range<usize>)>,
}

/// Unix seconds at which `e` ended (or its age so far, while ongoing).
fn event_end(e: &crate::stall::event::StallEvent) -> f64 {
    e.started_at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
        + e.duration_seconds
}

/// The router over `state`. Only GET and HEAD are routed, and POST/PUT to `/-/reload`:
/// other methods get 405, unknown paths 404.
pub fn app(state: Arc<App>) -> Router {
    Router::new()
        .route(&state.telemetry_path.clone(), get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/", get(index))
        .route("/api/stalls", get(stalls))
        .route("/api/history", get(api_history))
        .route("/assets/{name}", get(asset))
        .route("/-/reload", post(reload).put(reload))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found\n") })
        // The fastest level: a scrape is ~100 KB of repetitive text, which it still
        // shrinks about tenfold, at half the CPU time of the default level.
        .layer(
            CompressionLayer::new()
                .gzip(true)
                .quality(tower_http::CompressionLevel::Fastest),
        )
        .with_state(state)
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics::encode(&app.registry),
    )
        .into_response()
}

/// `POST /-/reload`: as Prometheus, 403 unless `--web.enable-lifecycle`; the reload runs
/// off the runtime's thread.
async fn reload(State(app): State<Arc<App>>) -> Response {
    let Some(f) = app.reload.clone() else {
        return (StatusCode::FORBIDDEN, "Lifecycle API is not enabled.\n").into_response();
    };
    match tokio::task::spawn_blocking(move || f()).await {
        Ok(Ok(changes)) => (
            StatusCode::OK,
            format!("configuration reloaded: {changes}\n"),
        ),
        Ok(Err(e)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("failed to reload config: {e}\n"),
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reload did not complete: {e}\n"),
        ),
    }
    .into_response()
}

async fn stalls(State(app): State<Arc<App>>) -> Response {
    Json(app.stalls.events()).into_response()
}

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '&' => o.push_str("&amp;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

fn ago(t: SystemTime) -> String {
    match SystemTime::now().duration_since(t) {
        Ok(d) => format!("{:.0} s ago", d.as_secs_f64()),
        Err(_) => "just now".into(),
    }
}

async fn index(State(app): State<Arc<App>>) -> Html<String> {
    let mut h = String::with_capacity(8192);
    let path = esc(&app.telemetry_path);
    let _ = write!(
        h,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>stallwatch</title>\
         <link rel=\"stylesheet\" href=\"/assets/uPlot.min.css\">\
         <link rel=\"stylesheet\" href=\"/assets/page.css\"></head><body>\
         <header><h1>stallwatch {}</h1><nav><a href=\"{path}\">Metrics</a> · \
         <a href=\"/api/stalls\">Stalls (JSON)</a> · \
         <a href=\"/api/history\">History (JSON)</a> · <a href=\"/healthz\">Health</a></nav>\
         <div id=\"controls\" hidden><span>Range</span>\
         <label><input type=\"radio\" name=\"range\" value=\"300\" checked> 5 min</label>\
         <label><input type=\"radio\" name=\"range\" value=\"3600\"> 1 h</label>\
         <span id=\"updated\"></span></div></header>\
         <noscript><p class=\"note\">The charts need JavaScript; the tables below are \
         as of this page load (reload to refresh).</p></noscript>\
         <div id=\"blocked\" role=\"alert\"></div>\
         <h2>Targets</h2><table id=\"targets\"><tr><th>target</th><th>path</th><th>state</th>\
         <th>since</th><th>mount</th><th>in flight now</th><th>last success</th></tr>",
        env!("CARGO_PKG_VERSION")
    );
    for t in app.targets.current().iter() {
        let st = t.status();
        let class = if st.state.label() == "up" {
            "up"
        } else {
            "bad"
        };
        let mount = st
            .mount
            .as_ref()
            .map(|m| {
                format!(
                    "{} on {} ({}{})",
                    m.source,
                    m.mount_point.display(),
                    m.fstype,
                    if st.read_only { ", read-only" } else { "" }
                )
            })
            .unwrap_or_else(|| "-".into());
        let detail = match &st.state {
            TargetState::Failing(e) | TargetState::MountChanged(e) => {
                format!(": {e}")
            }
            _ => String::new(),
        };
        // Every lane's call in the kernel right now: "only fsync" and "everything"
        // read differently.
        let calls: Vec<String> = t
            .in_flight()
            .iter()
            .map(|c| format!("{} {} for {:.1} s", c.mode, c.op, c.age.as_secs_f64()))
            .collect();
        let inflight = if calls.is_empty() {
            "-".to_owned()
        } else {
            calls.join(", ")
        };
        let last = st.last_success.map(ago).unwrap_or_else(|| "never".into());
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td class=\"{class}\">{}{}</td><td>{}</td><td>{}</td>\
             <td class=\"inflight\" data-target=\"{}\">{}</td><td>{}</td></tr>",
            esc(&t.target.name),
            esc(&t.target.path.display().to_string()),
            st.state.label(),
            esc(&detail),
            ago(st.since),
            esc(&mount),
            esc(&t.target.name),
            esc(&inflight),
            last
        );
    }
    h.push_str(
        "</table><section id=\"latency\" hidden><h2>Latency per operation</h2>\
         <p class=\"key\"><span class=\"sw\" style=\"color:#d9730d\"></span>slowest call \
         <span class=\"sw\" style=\"color:#1f6fb2\"></span>median \
         <span class=\"sw dash\" style=\"color:#c62828\"></span>the target's stall threshold \
         <span class=\"sw band\"></span>a stall: click it for its context</p>\
         <p class=\"note\">One point per second: a call as measured when the probe runs \
         every second or slower; at faster intervals (and per step on the 1 h range) the \
         slowest and the median of the calls in it. Log scale. Hover a chart for values.</p>\
         <div id=\"charts\"></div></section>",
    );
    h.push_str("<h2>Kernel</h2>");
    if let Some(snap) = app.latest.get() {
        let c = &snap.vm.counters;
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let pct = if c.dirty_threshold_bytes > 0 {
            100.0 * c.dirty_bytes as f64 / c.dirty_threshold_bytes as f64
        } else {
            0.0
        };
        let _ = write!(
            h,
            "<p id=\"kernel-now\">dirty {:.1} MiB ({pct:.1}% of the {:.0} MiB throttling \
             threshold; background writeback from {:.0} MiB), under writeback {:.1} MiB",
            mib(c.dirty_bytes),
            mib(c.dirty_threshold_bytes),
            mib(c.dirty_background_threshold_bytes),
            mib(c.writeback_bytes),
        );
        let mut md: Vec<_> = snap.devices.md_action.iter().collect();
        md.sort_by(|a, b| a.0.cmp(b.0));
        for (dev, action) in md {
            let _ = write!(h, "; {} {}", esc(dev), action.as_str());
        }
        h.push_str("</p>");
    }
    h.push_str(
        "<section id=\"kernel\" hidden>\
         <div class=\"card-title\">Page cache, whole host: dirty and under writeback \
         against the background and throttling thresholds</div>\
         <div id=\"kernel-chart\" class=\"chart\"></div>\
         <div class=\"card-title\">I/O pressure (PSI), whole host: share of time some / \
         all tasks were stalled on I/O</div>\
         <div id=\"psi-chart\" class=\"chart\"></div></section><h2>Recent stalls</h2>\
         <div id=\"stalls\">",
    );
    let events = app.stalls.recent(PAGE_EVENTS);
    if events.is_empty() {
        h.push_str("<p>None since start.</p>");
    } else {
        h.push_str(
            "<table><tr><th>started</th><th>target</th><th>op</th><th>duration</th>\
             <th>cause</th><th>verdict</th>\
             <th>also blocked</th><th>dirty max</th><th>writeback max</th><th>md</th>\
             <th>error</th></tr>",
        );
        for e in &events {
            let md: Vec<String> =
                e.md.iter()
                    .map(|m| format!("{} {}", m.device, m.action_label()))
                    .collect();
            let also: Vec<String> = e
                .also_blocked
                .iter()
                .map(|b| format!("{} {} ({:.1} s)", b.mode, b.op, b.blocked_seconds))
                .collect();
            let also = if also.is_empty() {
                "none".to_owned()
            } else {
                also.join(", ")
            };
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{} {}</td><td>{:.3} s{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td>\
                 <td>{} MiB</td><td>{} MiB</td><td>{}</td><td>{}</td></tr>",
                humantime::format_rfc3339_millis(e.started_at),
                esc(&e.target),
                e.mode,
                e.op,
                e.duration_seconds,
                if e.ongoing { " (ongoing)" } else { "" },
                e.cause,
                esc(&e.verdict),
                esc(&also),
                e.vm.dirty_bytes_max >> 20,
                e.vm.writeback_bytes_max >> 20,
                esc(&md.join(", ")),
                esc(e.error.as_deref().unwrap_or("")),
            );
        }
        h.push_str("</table>");
    }
    h.push_str(
        "</div><dialog id=\"stall-dialog\"><form method=\"dialog\"><button>Close</button>\
         </form><div id=\"stall-detail\"></div></dialog>\
         <script src=\"/assets/uPlot.iife.min.js\"></script>\
         <script src=\"/assets/page.js\"></script></body></html>\n",
    );
    Html(h)
}

/// The files of the live page, embedded in the binary: nothing is fetched from
/// elsewhere, so the page works offline and behind the same TLS and auth as the rest.
/// uPlot 1.6.32 (MIT), vendored from the npm registry: `assets/vendor/uplot/README.md`.
const ASSETS: [(&str, &str, &str); 4] = [
    (
        "uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_str!("../../assets/vendor/uplot/uPlot.iife.min.js"),
    ),
    (
        "uPlot.min.css",
        "text/css; charset=utf-8",
        include_str!("../../assets/vendor/uplot/uPlot.min.css"),
    ),
    (
        "page.js",
        "text/javascript; charset=utf-8",
        include_str!("../../assets/page.js"),
    ),
    (
        "page.css",
        "text/css; charset=utf-8",
        include_str!("../../assets/page.css"),
    ),
];

/// A strong validator of an asset's bytes (FNV-1a), so a browser revalidates cheaply
/// and never keeps a page script from an older binary.
fn etag(body: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in body.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    format!("\"{h:016x}\"")
}

async fn asset(
    axum::extract::Path(name): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Response {
    let Some(&(_, ctype, body)) = ASSETS.iter().find(|a| a.0 == name) else {
        return (StatusCode::NOT_FOUND, "not found\n").into_response();
    };
    let tag = etag(body);
    let cached = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag));
    let common = [
        (header::ETAG, tag),
        (header::CACHE_CONTROL, "no-cache".to_owned()),
    ];
    if cached {
        return (StatusCode::NOT_MODIFIED, common).into_response();
    }
    (common, [(header::CONTENT_TYPE, ctype)], body).into_response()
}

/// `GET /api/history` parameters.
#[derive(Debug, serde::Deserialize)]
struct HistoryQuery {
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
}

/// The answer is written straight into one buffer: a first load of an hour is 14 400
/// points, and a `serde_json::Value` or a tuple per point costs more than the points.
struct JsonOut(Vec<u8>);

impl JsonOut {
    fn raw(&mut self, s: &str) {
        self.0.extend_from_slice(s.as_bytes());
    }

    fn int(&mut self, v: i64) {
        self.0
            .extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
    }

    /// A JSON string, escaped as serde_json does.
    fn str(&mut self, s: &str) {
        serde_json::to_writer(&mut self.0, s).expect("a string serializes");
    }

    /// Seconds as microseconds to 4 significant digits (to the nanosecond below 10 µs),
    /// without trailing zeros: `0.00001897` as `18.97`.
    fn micros(&mut self, seconds: f32) {
        if !seconds.is_finite() || seconds < 0.0 {
            self.raw("null");
            return;
        }
        // Rounded half up without a libm call (this runs 43 200 times for an hour).
        let ns = (seconds as f64 * 1e9 + 0.5) as u64;
        // The history keeps a latency to 1/2048 of itself (history.rs, `encode`): past 4
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
    fn ratio(&mut self, v: f32) {
        if v.is_finite() {
            let _ = write!(self, "{v}");
        } else {
            self.raw("null");
        }
    }

    /// `"key":[v,v,...]` from `f` over `items`.
    fn column<T>(&mut self, key: &str, items: &[T], mut f: impl FnMut(&mut JsonOut, &T)) {
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
    fn times(&mut self, from: u32, ts: impl Iterator<Item = u32>) {
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

/// Answers `/api/history` from the in-memory history; the handler only copies points
/// out under the series' locks. The points are columns (README, "/api/history").
pub fn history_json(
    app: &App,
    since: Option<f64>,
    range: Option<u32>,
    step: Option<u32>,
    stalls_version: Option<u64>,
) -> String {
    String::from_utf8(history_body(app, since, range, step, stalls_version))
        .expect("the answer is UTF-8")
}

fn history_body(
    app: &App,
    since: Option<f64>,
    range: Option<u32>,
    step: Option<u32>,
    stalls_version: Option<u64>,
) -> Vec<u8> {
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
    let current = app.targets.current();
    // Events that were ongoing, started or ended in the window, unless the page has
    // them already: the page merges them by (target, mode, op, started_at). Without
    // a stalls_version, the serialized events serve while the log has not changed.
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
        "{{\"now\":{now_s:.3},\"range\":{range},\"step\":{step},\"from\":{from},\"targets\":["
    );
    for (i, t) in current.iter().enumerate() {
        let st = t.status();
        let detail = match &st.state {
            TargetState::Failing(e) | TargetState::MountChanged(e) => e.as_str(),
            _ => "",
        };
        if i > 0 {
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

async fn api_history(State(app): State<Arc<App>>, Query(q): Query<HistoryQuery>) -> Response {
    let body = history_body(&app, q.since, q.range, q.step, q.stalls_version);
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
    use crate::base::labels::Op;
    use crate::base::labels::{Mode, SyncKind};
    use crate::config::Target;
    use crate::kernel::blockdev::TargetDevices;
    use crate::kernel::vm::{IoPressureTotals, VmCounters, VmSample};
    use crate::probe::{ProbeMetrics, TargetShared};
    use crate::stall::log::{FinishedCall, LaneKey};
    use std::time::{Duration, Instant};

    /// This thread's CPU time, so time waiting for a CPU held by other processes of a
    /// shared machine is not counted.
    fn thread_cpu_ns() -> u64 {
        let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).unwrap();
        t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
    }

    fn rss_bytes() -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * crate::kernel::vm::page_size()
    }

    /// 8 targets with the default modes (5 ops each) probed every second for a full
    /// hour, a kernel sample every second, and a full stall ring (256 events). With the
    /// RSS growth while filling, and the calls of target 0's first series (Unix second,
    /// nanoseconds).
    fn full_hour() -> (App, u64, Vec<(u64, u64)>) {
        let registry = crate::exposition::registry::Registry::new();
        let metrics = ProbeMetrics::new(&registry);
        let rss0 = rss_bytes();
        let history = Arc::new(History::new());
        let stalls = Arc::new(StallLog::new(256, &registry, Arc::default()));
        let mut shared = Vec::new();
        for i in 0..8 {
            let t = Target {
                name: format!("target{i}"),
                path: format!("/srv/disk{i}").into(),
                interval: Duration::from_secs(1),
                modes: vec![Mode::Create, Mode::Overwrite],
                size: 4096,
                sync: SyncKind::Fsync,
                require_mountpoint: true,
                stall_threshold: Duration::from_secs(1),
                rotate_size: 64 << 20,
            };
            let ts = TargetShared::new(i, t, i * 2, &metrics);
            history.add_target(i, &ts.target.name, &ts.ops, ts.target.interval);
            shared.push(Arc::new(ts));
        }
        let now = SystemTime::now();
        let t0 = Instant::now();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut calls = Vec::new();
        let hour = history::RETAIN.as_secs();
        for s in 0..hour {
            let at = now - Duration::from_secs(hour - s);
            for ts in &shared {
                for &(mode, op) in &ts.ops {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let ns = 5_000 + x % 2_000_000;
                    history.record(ts.index, mode, op, Duration::from_nanos(ns), at);
                    if ts.index == 0 && (mode, op) == ts.ops[0] {
                        calls.push((
                            at.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs(),
                            ns,
                        ));
                    }
                }
            }
            let sample = VmSample {
                at: t0 + Duration::from_secs(s),
                counters: VmCounters {
                    dirty_bytes: (x % (1 << 30)),
                    writeback_bytes: x % (1 << 24),
                    dirty_threshold_bytes: 4 << 30,
                    dirty_background_threshold_bytes: 2 << 30,
                    ..Default::default()
                },
                pressure: Some(IoPressureTotals {
                    some_seconds: s as f64 * 0.1,
                    full_seconds: s as f64 * 0.01,
                }),
                sysctls: None,
            };
            history.record_kernel(&sample, at);
        }
        let rss = rss_bytes().saturating_sub(rss0);
        for seq in 0..256u64 {
            let key = LaneKey {
                devices: &TargetDevices::default(),
                lane: (seq % 16) as usize,
                name: &shared[(seq % 8) as usize].target.name,
            };
            let call = FinishedCall {
                mode: Mode::Overwrite,
                op: Op::Fsync,
                seq,
                elapsed: Duration::from_millis(1500),
                failure: None,
                waits: None,
            };
            stalls.finished(key, call, &[]);
        }
        let app = App {
            registry,
            stalls,
            targets: Arc::new(Targets::new(shared)),
            history,
            latest: Arc::default(),
            telemetry_path: "/metrics".into(),
            reload: None,
            stalls_json: Mutex::default(),
        };
        (app, rss, calls)
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
        let (app, _, calls) = full_hour();
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

    /// The cost figures of BENCHMARKS.md ("History endpoint"). Run in release:
    /// `cargo test --release --lib routes::tests::history_endpoint_cost -- --ignored --nocapture`
    #[test]
    #[ignore = "benchmark: prints figures; run in release"]
    fn history_endpoint_cost() {
        let (app, rss, _) = full_hour();
        println!(
            "history of 8 targets x 5 ops, 1 s interval, full hour: {} bytes allocated ({:.2} MiB), RSS grew {:.2} MiB while filling",
            app.history.allocated_bytes(),
            app.history.allocated_bytes() as f64 / (1 << 20) as f64,
            rss as f64 / (1 << 20) as f64
        );
        // Where the time of a full hour goes: copying and folding the points, or JSON.
        let from = (SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            - 3600) as u32;
        let t = Instant::now();
        let mut n = 0;
        for _ in 0..20 {
            for i in 0..8 {
                for s in &app.history.target(i).unwrap().series {
                    n += s.stepped(from, 10).len();
                }
            }
        }
        println!(
            "copy of 40 series x 1 h in 10 s steps: {:.3} ms ({} points)",
            t.elapsed().as_secs_f64() * 1e3 / 20.0,
            n / 20
        );
        let t = Instant::now();
        let mut n = 0;
        for _ in 0..20 {
            for i in 0..8 {
                for s in &app.history.target(i).unwrap().series {
                    n += s.stepped(from + 3300, 1).len();
                }
            }
        }
        println!(
            "copy of 40 series x 5 min in 1 s steps: {:.3} ms ({} points)",
            t.elapsed().as_secs_f64() * 1e3 / 20.0,
            n / 20
        );
        let t = Instant::now();
        for _ in 0..20 {
            std::hint::black_box(history_json(&app, None, Some(3600), None, None));
        }
        println!(
            "history_json, 1 h: {:.3} ms",
            t.elapsed().as_secs_f64() * 1e3 / 20.0
        );
        let body = history_json(&app, None, Some(3600), None, None);
        for level in [1, 6] {
            let t = Instant::now();
            let mut size = 0;
            for _ in 0..20 {
                use std::io::Write as _;
                let mut z = flate2::write::GzEncoder::new(
                    Vec::with_capacity(body.len() / 2),
                    flate2::Compression::new(level),
                );
                z.write_all(body.as_bytes()).unwrap();
                size = z.finish().unwrap().len();
            }
            println!(
                "gzip level {level} of the 1 h answer ({} bytes) by flate2 directly: {:.3} ms, {size} bytes",
                body.len(),
                t.elapsed().as_secs_f64() * 1e3 / 20.0
            );
        }
        let t = Instant::now();
        for _ in 0..20 {
            std::hint::black_box(serde_json::to_string(&app.stalls.events()).unwrap());
        }
        println!(
            "256 stall events to JSON: {:.3} ms",
            t.elapsed().as_secs_f64() * 1e3 / 20.0
        );
        let app = Arc::new(app);
        let router = super::app(Arc::clone(&app));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        // The page's poll carries the stalls_version of its last answer: the events
        // come again only when the log changed (the first two rows, 256 of them).
        let version = app.stalls.events_if_changed(None).0;
        let cases = [
            (
                "poll, 5 min range (since 2 s ago), stall log changed",
                format!("/api/history?range=300&since={}", now - 2.0),
            ),
            (
                "poll, 1 h range (since 10 s ago), stall log changed",
                format!("/api/history?range=3600&since={}", now - 10.0),
            ),
            (
                "poll, 5 min range (since 2 s ago)",
                format!(
                    "/api/history?range=300&since={}&stalls_version={version}",
                    now - 2.0
                ),
            ),
            (
                "poll, 1 h range (since 10 s ago)",
                format!(
                    "/api/history?range=3600&since={}&stalls_version={version}",
                    now - 10.0
                ),
            ),
            (
                "first load, 5 min range",
                "/api/history?range=300".to_owned(),
            ),
            (
                "first load, 1 h range (10 s steps)",
                "/api/history?range=3600".to_owned(),
            ),
        ];
        for (what, uri) in &cases {
            for gzip in [false, true] {
                let mut times = Vec::new();
                let mut cpu = Vec::new();
                let mut bytes = 0;
                let n = 400;
                for _ in 0..n {
                    let mut req = axum::http::Request::get(uri.as_str());
                    if gzip {
                        req = req.header("accept-encoding", "gzip");
                    }
                    let req = req.body(axum::body::Body::empty()).unwrap();
                    let t = Instant::now();
                    let c0 = thread_cpu_ns();
                    let body = rt.block_on(async {
                        use tower::ServiceExt as _;
                        let r = router.clone().oneshot(req).await.unwrap();
                        assert_eq!(r.status(), StatusCode::OK);
                        axum::body::to_bytes(r.into_body(), usize::MAX)
                            .await
                            .unwrap()
                    });
                    times.push(t.elapsed());
                    cpu.push(thread_cpu_ns() - c0);
                    bytes = body.len();
                }
                times.sort();
                cpu.sort();
                let p = |q: f64| times[((n as f64 * q) as usize).min(n - 1)].as_secs_f64() * 1e3;
                let c = |q: f64| cpu[((n as f64 * q) as usize).min(n - 1)] as f64 / 1e6;
                println!(
                    "{what}{}: {bytes} bytes; wall p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms; CPU p50 {:.3} ms, p99 {:.3} ms ({n} requests)",
                    if gzip { ", gzip" } else { "" },
                    p(0.5),
                    p(0.99),
                    times[n - 1].as_secs_f64() * 1e3,
                    c(0.5),
                    c(0.99),
                );
            }
        }
    }
}
