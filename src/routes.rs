//! The routes: `/metrics`, `/healthz`, `/`, `/api/stalls`. Every handler reads the
//! latest cached state only; nothing here waits on a probe. The server around them
//! (TLS, auth, limits, accept loop) is `web/`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tower_http::compression::CompressionLayer;

use crate::metrics;
use crate::probe::{State as TargetState, Targets};
use crate::stalls::StallLog;

/// Events listed on the landing page; `/api/stalls` has them all.
const PAGE_EVENTS: usize = 50;

/// Re-reads the configuration: what changed, or why the file was refused. Blocking.
pub type ReloadFn = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// What the handlers read.
pub struct App {
    pub registry: prometheus::Registry,
    pub stalls: Arc<StallLog>,
    pub targets: Arc<Targets>,
    pub telemetry_path: String,
    /// `--web.enable-lifecycle`: what `POST /-/reload` calls; None when off.
    pub reload: Option<ReloadFn>,
}

/// The router over `state`. Only GET and HEAD are routed, and POST/PUT to `/-/reload`:
/// other methods get 405, unknown paths 404.
pub fn app(state: Arc<App>) -> Router {
    Router::new()
        .route(&state.telemetry_path.clone(), get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/", get(index))
        .route("/api/stalls", get(stalls))
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
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>stallwatch</title>\
         <style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:.3em .6em;text-align:left}}\
         .up{{color:#080}}.bad{{color:#b00}}</style></head><body>\
         <h1>stallwatch {}</h1><p><a href=\"{path}\">Metrics</a> · \
         <a href=\"/api/stalls\">Stalls (JSON)</a> · <a href=\"/healthz\">Health</a></p>\
         <h2>Targets</h2><table><tr><th>target</th><th>path</th><th>state</th>\
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
             <td>{}</td><td>{}</td></tr>",
            esc(&t.target.name),
            esc(&t.target.path.display().to_string()),
            st.state.label(),
            esc(&detail),
            ago(st.since),
            esc(&mount),
            esc(&inflight),
            last
        );
    }
    h.push_str("</table>");
    if let Some(snap) = app.stalls.latest() {
        let c = &snap.vm.counters;
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let pct = if c.dirty_threshold_bytes > 0 {
            100.0 * c.dirty_bytes as f64 / c.dirty_threshold_bytes as f64
        } else {
            0.0
        };
        let _ = write!(
            h,
            "<h2>Kernel now</h2><p>dirty {:.1} MiB ({pct:.1}% of the {:.0} MiB throttling \
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
    h.push_str("<h2>Recent stalls</h2>");
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
    h.push_str("</body></html>\n");
    Html(h)
}
