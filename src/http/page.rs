//! The landing page `/`: the markup is the template `assets/page.html` (askama, which
//! escapes every value inserted into it); this file gathers what it shows. Without
//! JavaScript the page is these tables as of the load; the page script (`assets/page.js`)
//! then draws the overview (one row per target, trouble first) from
//! `/api/history?view=overview`, the charts of the target the URL names (of every target
//! on a host of one or two) from `/api/history`, and keeps the tables current.

use std::sync::Arc;
use std::time::SystemTime;

use askama::Template;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};

use super::state::App;
use crate::probe::State as TargetState;

/// Events listed on the landing page; `/api/stalls` has them all.
const PAGE_EVENTS: usize = 50;

/// What `assets/page.html` shows, every value as text.
#[derive(Template)]
#[template(path = "page.html")]
struct Page<'a> {
    version: &'static str,
    telemetry_path: &'a str,
    targets: Vec<TargetRow>,
    /// The latest kernel sample in words; None before the sampler's first.
    kernel_now: Option<String>,
    events: Vec<EventRow>,
}

/// A row of the targets table.
struct TargetRow {
    name: String,
    path: String,
    /// `up` or `bad`: the state cell's class.
    class: &'static str,
    state: &'static str,
    /// `: ` and the error, for a failing target or a changed mount.
    detail: String,
    since: String,
    mount: String,
    in_flight: String,
    last_success: String,
}

/// A row of the recent stalls table.
struct EventRow {
    /// The event's page, `/stalls/{id}`.
    href: String,
    started: String,
    target: String,
    /// Mode and op.
    op: String,
    duration: String,
    cause: &'static str,
    verdict: String,
    also_blocked: String,
    dirty_max: String,
    writeback_max: String,
    md: String,
    error: String,
}

fn ago(t: SystemTime) -> String {
    match SystemTime::now().duration_since(t) {
        Ok(d) => format!("{:.0} s ago", d.as_secs_f64()),
        Err(_) => "just now".into(),
    }
}

fn target_rows(app: &App) -> Vec<TargetRow> {
    let mut rows = Vec::new();
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
        let in_flight = if calls.is_empty() {
            "-".to_owned()
        } else {
            calls.join(", ")
        };
        rows.push(TargetRow {
            name: t.target.name.clone(),
            path: t.target.path.display().to_string(),
            class,
            state: st.state.label(),
            detail,
            since: ago(st.since),
            mount,
            in_flight,
            last_success: st.last_success.map(ago).unwrap_or_else(|| "never".into()),
        });
    }
    rows
}

/// The latest kernel sample in words: dirty against the thresholds, writeback, md.
fn kernel_now(app: &App) -> Option<String> {
    let snap = app.latest.get()?;
    let c = &snap.vm.counters;
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let pct = if c.dirty_threshold_bytes > 0 {
        100.0 * c.dirty_bytes as f64 / c.dirty_threshold_bytes as f64
    } else {
        0.0
    };
    let mut s = format!(
        "dirty {:.1} MiB ({pct:.1}% of the {:.0} MiB throttling threshold; background \
         writeback from {:.0} MiB), under writeback {:.1} MiB",
        mib(c.dirty_bytes),
        mib(c.dirty_threshold_bytes),
        mib(c.dirty_background_threshold_bytes),
        mib(c.writeback_bytes),
    );
    let mut md: Vec<_> = snap.devices.md_action.iter().collect();
    md.sort_by(|a, b| a.0.cmp(b.0));
    for (dev, action) in md {
        s.push_str(&format!("; {dev} {}", action.as_str()));
    }
    Some(s)
}

fn event_rows(app: &App) -> Vec<EventRow> {
    app.stalls
        .recent(PAGE_EVENTS)
        .iter()
        .map(|e| {
            let md: Vec<String> =
                e.md.iter()
                    .map(|m| format!("{} {}", m.device, m.action_label()))
                    .collect();
            let also: Vec<String> = e
                .also_blocked
                .iter()
                .map(|b| format!("{} {} ({:.1} s)", b.mode, b.op, b.blocked_seconds))
                .collect();
            EventRow {
                href: format!("/stalls/{}", e.id),
                started: humantime::format_rfc3339_millis(e.started_at).to_string(),
                target: e.target.clone(),
                op: format!("{} {}", e.mode, e.op),
                duration: format!(
                    "{:.3} s{}",
                    e.duration_seconds,
                    if e.ongoing { " (ongoing)" } else { "" }
                ),
                cause: e.cause.as_str(),
                verdict: e.verdict.clone(),
                also_blocked: if also.is_empty() {
                    "none".to_owned()
                } else {
                    also.join(", ")
                },
                dirty_max: format!("{} MiB", e.vm.dirty_bytes_max >> 20),
                writeback_max: format!("{} MiB", e.vm.writeback_bytes_max >> 20),
                md: md.join(", "),
                error: e.error.clone().unwrap_or_default(),
            }
        })
        .collect()
}

/// `GET /`: the page as of now.
pub(super) async fn index(State(app): State<Arc<App>>) -> Response {
    let page = Page {
        version: env!("CARGO_PKG_VERSION"),
        telemetry_path: &app.telemetry_path,
        targets: target_rows(&app),
        kernel_now: kernel_now(&app),
        events: event_rows(&app),
    };
    match page.render() {
        Ok(html) => Html(html).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_is_escaped_in_the_markup() {
        let evil = "<script>alert('x')</script> & \"q\"";
        let row = TargetRow {
            name: evil.into(),
            path: "/srv/a".into(),
            class: "up",
            state: "up",
            detail: String::new(),
            since: "1 s ago".into(),
            mount: "-".into(),
            in_flight: "-".into(),
            last_success: "never".into(),
        };
        let page = Page {
            version: "0",
            telemetry_path: "/metrics",
            targets: vec![row],
            kernel_now: None,
            events: Vec::new(),
        };
        let html = page.render().unwrap();
        assert!(!html.contains("<script>alert"), "{html}");
        assert!(
            html.contains(
                "<td>&#60;script&#62;alert(&#39;x&#39;)&#60;/script&#62; &#38; &#34;q&#34;</td>"
            ),
            "{html}"
        );
        assert!(html.contains("<a href=\"/metrics\">Metrics</a>"));
        assert!(html.contains("<a href=\"/stalls\">Stalls</a>"));
        assert!(html.contains("<p>None since start.</p>"));
        assert!(!html.contains("id=\"kernel-now\""));
    }
}
