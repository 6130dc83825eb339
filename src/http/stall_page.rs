//! `/stalls` (the list of stall events, filterable by target) and `/stalls/{id}` (one
//! event written for a person): server-rendered from the stall log's copy of the events,
//! the same data `/api/stalls` serves. The markup is `assets/stall.html`,
//! `assets/stalls.html` and `assets/stall-missing.html` (askama: every value escaped);
//! the device window is an inline SVG drawn here from the evidence's intervals, so the
//! pages need no script.

use std::sync::Arc;
use std::time::SystemTime;

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use serde::Deserialize;

use super::state::App;
use crate::stall::event::StallEvent;
use crate::stall::evidence::{binary_bytes, decimal_bytes, duration, DeviceFigures};

/// A time as the pages show it: UTC to the millisecond.
fn utc(t: SystemTime) -> String {
    let s = humantime::format_rfc3339_millis(t).to_string();
    format!("{} UTC", s.trim_end_matches('Z').replacen('T', " ", 1))
}

fn held(e: &StallEvent) -> String {
    format!(
        "held for {}{}",
        duration(e.duration_seconds),
        if e.ongoing { " so far" } else { "" }
    )
}

fn render(t: &impl Template, status: StatusCode) -> Response {
    match t.render() {
        Ok(html) => (status, Html(html)).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

/// The `/stalls/{id}` link of an event; ids are URL-safe (`stall/id.rs`).
fn href(id: &str) -> String {
    format!("/stalls/{id}")
}

/// `/stalls?target=NAME`, the name as a query value.
fn target_href(name: &str) -> String {
    let q: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("target", name)
        .finish();
    format!("/stalls?{q}")
}

// ---- /stalls ----

#[derive(Template)]
#[template(path = "stalls.html")]
struct List<'a> {
    version: &'static str,
    telemetry_path: &'a str,
    /// The target the list is filtered by.
    filter: Option<String>,
    rows: Vec<ListRow>,
}

struct ListRow {
    href: String,
    started: String,
    target: String,
    target_href: String,
    op: String,
    duration: String,
    ongoing: bool,
    cause: &'static str,
    verdict: String,
    /// "restored" or "restored, interrupted" for events of an earlier run; empty else.
    note: &'static str,
}

#[derive(Deserialize)]
pub(super) struct ListQuery {
    target: Option<String>,
}

/// How the list marks an event an earlier run recorded.
fn restored_note(e: &StallEvent) -> &'static str {
    match (e.restored, e.interrupted) {
        (true, true) => " (restored, interrupted)",
        (true, false) => " (restored)",
        _ => "",
    }
}

/// `GET /stalls`: every event the log holds, newest first.
pub(super) async fn list(State(app): State<Arc<App>>, Query(q): Query<ListQuery>) -> Response {
    let rows = app
        .stalls
        .events()
        .into_iter()
        .filter(|e| q.target.as_ref().is_none_or(|t| *t == e.target))
        .map(|e| ListRow {
            href: href(&e.id),
            started: utc(e.started_at),
            target_href: target_href(&e.target),
            op: format!("{} {}", e.mode, e.op),
            duration: format!(
                "{}{}",
                duration(e.duration_seconds),
                if e.ongoing { " so far" } else { "" }
            ),
            ongoing: e.ongoing,
            cause: e.cause.as_str(),
            note: restored_note(&e),
            verdict: e.verdict,
            target: e.target,
        })
        .collect();
    let page = List {
        version: env!("CARGO_PKG_VERSION"),
        telemetry_path: &app.telemetry_path,
        filter: q.target,
        rows,
    };
    render(&page, StatusCode::OK)
}

// ---- /stalls/{id} ----

#[derive(Template)]
#[template(path = "stall-missing.html")]
struct Missing<'a> {
    version: &'static str,
    telemetry_path: &'a str,
    id: String,
}

#[derive(Template)]
#[template(path = "stall.html")]
struct Page<'a> {
    version: &'static str,
    telemetry_path: &'a str,
    id: String,
    json_href: String,
    target: String,
    target_href: String,
    verdict: String,
    ongoing: bool,
    /// Recorded by an earlier run (`--storage.path`), and whether it was cut short.
    restored: bool,
    interrupted: bool,
    started: String,
    held: String,
    mode: &'static str,
    op: &'static str,
    cause: &'static str,
    cause_text: &'static str,
    /// The cause the stall was counted under, where the wait moved after the crossing.
    counted_cause: Option<&'static str>,
    error: Option<String>,
    /// The wait points with the time held at each (`waits`); empty in records of agents
    /// before 0.2.0, which show `waits`.
    held_at: Vec<(String, &'static str, String)>,
    /// The `wchan` symbols with their sample counts.
    waits: Vec<(String, u64)>,
    stack: Option<Vec<String>>,
    dirtiers: Vec<[String; 4]>,
    cgroup_note: String,
    writers: Vec<[String; 4]>,
    processes_unreadable: usize,
    evidence_note: String,
    /// The backing disk and its peak requests in flight (from the sampler).
    device: Option<String>,
    devices: Vec<DeviceView>,
    journal: Option<JournalView>,
    md: Vec<(String, &'static str)>,
    also_blocked: Vec<(String, String)>,
    vm: Vec<(&'static str, String)>,
}

struct DeviceView {
    name: String,
    role: &'static str,
    figures: Vec<(&'static str, String)>,
    chart: Option<Chart>,
}

struct JournalView {
    name: String,
    transactions: u64,
    /// Figure, at the start of the window, at its end.
    rows: Vec<(&'static str, String, String)>,
}

/// The device window's chart: one panel of bars per figure, one bar per interval.
struct Chart {
    width: u32,
    height: u32,
    /// The x of the plot's left edge and its width.
    left: u32,
    plot: u32,
    panels: Vec<Panel>,
    /// The axis: where (y) and its labels with their x.
    axis_y: u32,
    ticks: Vec<(String, String)>,
}

struct Panel {
    y: u32,
    h: u32,
    label: &'static str,
    /// The panel's top value in words.
    top: String,
    /// x, y, width, height of each bar, and its tooltip.
    bars: Vec<(String, String, String, String, String)>,
    class: &'static str,
}

const PANEL_H: u32 = 46;
const PANEL_GAP: u32 = 14;

fn chart(d: &DeviceFigures) -> Option<Chart> {
    let iv = &d.intervals;
    let last = iv.last()?;
    let span = (last.start_seconds + last.seconds).max(0.001);
    let (left, plot) = (170u32, 900u32);
    let x = |s: f64| left as f64 + s / span * plot as f64;
    type Get = fn(&crate::stall::evidence::DeviceInterval) -> Option<f64>;
    /// A panel: its label, its bars' class, its value per interval, the value in words.
    type Spec = (&'static str, &'static str, Get, fn(f64) -> String);
    let specs: [Spec; 4] = [
        (
            "write throughput",
            "bps",
            |i| Some(i.write_bytes_per_second),
            |v| format!("{}/s", decimal_bytes(v)),
        ),
        (
            "write latency",
            "lat",
            |i| i.write_latency_seconds,
            duration,
        ),
        (
            "utilisation",
            "util",
            |i| Some(i.utilisation),
            |v| format!("{:.0} %", v * 100.0),
        ),
        (
            "cache flushes",
            "flush",
            |i| i.flushes.map(|n| n as f64),
            |v| format!("{v:.0}"),
        ),
    ];
    let mut panels = Vec::new();
    let mut y = 8u32;
    for (label, class, get, words) in specs {
        if iv.iter().all(|i| get(i).is_none()) {
            continue;
        }
        let max = iv.iter().filter_map(get).fold(0.0f64, f64::max);
        // Utilisation is against 100 %; the others against their peak.
        let top = if class == "util" { 1.0 } else { max };
        let bars = iv
            .iter()
            .filter_map(|i| {
                let v = get(i)?;
                // A zero is a 1 px line: the interval was read, and was nothing.
                let h = if top > 0.0 {
                    v / top * PANEL_H as f64
                } else {
                    0.0
                }
                .max(1.0);
                let (x0, x1) = (x(i.start_seconds), x(i.start_seconds + i.seconds));
                Some((
                    format!("{x0:.1}"),
                    format!("{:.1}", y as f64 + PANEL_H as f64 - h),
                    format!("{:.1}", (x1 - x0 - 1.0).max(1.0)),
                    format!("{h:.1}"),
                    format!(
                        "{:.1}–{:.1} s: {}",
                        i.start_seconds,
                        i.start_seconds + i.seconds,
                        words(v)
                    ),
                ))
            })
            .collect();
        panels.push(Panel {
            y,
            h: PANEL_H,
            label,
            top: format!("peak {}", words(max)),
            bars,
            class,
        });
        y += PANEL_H + PANEL_GAP;
    }
    let ticks = (0..=4)
        .map(|k| {
            let s = span * k as f64 / 4.0;
            (format!("{:.1}", x(s)), format!("{s:.1} s"))
        })
        .collect();
    Some(Chart {
        width: left + plot + 50,
        height: y + 18,
        left,
        plot,
        panels,
        axis_y: y,
        ticks,
    })
}

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map_or_else(|| "-".to_owned(), f)
}

fn device_view(d: &DeviceFigures) -> DeviceView {
    let pct = |v: f64| format!("{:.0} %", v * 100.0);
    let rate = |v: f64| format!("{}/s", decimal_bytes(v));
    let mut figures = vec![
        (
            "window",
            format!(
                "{}, {} written",
                duration(d.window_seconds),
                decimal_bytes(d.written_bytes as f64)
            ),
        ),
        (
            "write throughput",
            format!(
                "avg {}, min {}, max {}",
                opt(d.write_bytes_per_second_avg, rate),
                opt(d.write_bytes_per_second_min, rate),
                opt(d.write_bytes_per_second_max, rate)
            ),
        ),
        (
            "write IOPS",
            format!(
                "min {}, max {}",
                opt(d.write_iops_min, |v| format!("{v:.1}")),
                opt(d.write_iops_max, |v| format!("{v:.1}"))
            ),
        ),
        (
            "write latency",
            format!("avg {}", opt(d.write_latency_seconds_avg, duration)),
        ),
        (
            "utilisation",
            format!(
                "avg {}, min {}, max {}",
                opt(d.utilisation_avg, pct),
                opt(d.utilisation_min, pct),
                opt(d.utilisation_max, pct)
            ),
        ),
    ];
    if let Some(n) = d.flushes {
        figures.push((
            "cache flushes",
            format!("{n}, avg {}", opt(d.flush_seconds_avg, duration)),
        ));
    }
    figures.push((
        "requests in flight",
        format!(
            "at most {} writes, {} reads{}",
            d.inflight_writes_max,
            d.inflight_reads_max,
            opt(d.nr_requests, |n| format!(", of {n} the queue holds"))
        ),
    ));
    DeviceView {
        name: d.device.clone(),
        role: if d.role == "md_member" {
            "md member"
        } else {
            "disk"
        },
        figures,
        chart: chart(d),
    }
}

fn journal_view(e: &StallEvent) -> Option<JournalView> {
    let j = e.evidence.journal.as_ref()?;
    let s = |v: Option<f64>| opt(v, duration);
    let n = |v: Option<u64>| opt(v, |n| n.to_string());
    let (a, b) = (&j.start, &j.end);
    Some(JournalView {
        name: j.journal.clone(),
        transactions: j.transactions,
        rows: vec![
            (
                "transactions (since mount)",
                a.transactions.to_string(),
                b.transactions.to_string(),
            ),
            (
                "commit time (moving average)",
                s(a.commit_seconds_avg),
                s(b.commit_seconds_avg),
            ),
            (
                "waiting",
                s(a.waiting_seconds_avg),
                s(b.waiting_seconds_avg),
            ),
            (
                "request delay",
                s(a.request_delay_seconds_avg),
                s(b.request_delay_seconds_avg),
            ),
            (
                "running",
                s(a.running_seconds_avg),
                s(b.running_seconds_avg),
            ),
            ("locked", s(a.locked_seconds_avg), s(b.locked_seconds_avg)),
            (
                "flushing",
                s(a.flushing_seconds_avg),
                s(b.flushing_seconds_avg),
            ),
            (
                "logging",
                s(a.logging_seconds_avg),
                s(b.logging_seconds_avg),
            ),
            (
                "handles per transaction",
                n(a.handles_per_transaction),
                n(b.handles_per_transaction),
            ),
            (
                "blocks per transaction",
                n(a.blocks_per_transaction),
                n(b.blocks_per_transaction),
            ),
        ],
    })
}

fn vm_rows(e: &StallEvent) -> Vec<(&'static str, String)> {
    let v = &e.vm;
    let of = |b: u64| {
        if v.dirty_threshold_bytes > 0 {
            format!(
                "{} ({:.1} % of the throttling threshold)",
                binary_bytes(b),
                100.0 * b as f64 / v.dirty_threshold_bytes as f64
            )
        } else {
            binary_bytes(b)
        }
    };
    let mut rows = vec![
        ("dirty at the start", of(v.dirty_bytes_start)),
        ("dirty at most", of(v.dirty_bytes_max)),
        (
            "under writeback at most",
            binary_bytes(v.writeback_bytes_max),
        ),
        (
            "throttling threshold",
            binary_bytes(v.dirty_threshold_bytes),
        ),
        (
            "background writeback from",
            binary_bytes(v.dirty_background_threshold_bytes),
        ),
    ];
    if let (Some(some), Some(full)) = (v.io_pressure_some_seconds, v.io_pressure_full_seconds) {
        rows.push((
            "I/O pressure (PSI)",
            format!("some {some:.2} s, full {full:.2} s stalled during the stall"),
        ));
    }
    rows
}

fn page<'a>(app: &'a App, e: StallEvent) -> Page<'a> {
    let ev = &e.evidence;
    Page {
        version: env!("CARGO_PKG_VERSION"),
        telemetry_path: &app.telemetry_path,
        json_href: format!("/api/stalls/{}", e.id),
        target_href: target_href(&e.target),
        ongoing: e.ongoing,
        restored: e.restored,
        interrupted: e.interrupted,
        started: utc(e.started_at),
        held: held(&e),
        mode: e.mode,
        op: e.op,
        cause: e.cause.as_str(),
        cause_text: e.cause.text(),
        counted_cause: (e.counted_cause != e.cause).then(|| e.counted_cause.as_str()),
        held_at: e
            .waits
            .iter()
            .map(|w| {
                (
                    w.symbol.clone(),
                    w.cause.as_str(),
                    format!("{:.1} s", w.seconds),
                )
            })
            .collect(),
        waits: e
            .wchan
            .iter()
            .map(|w| (w.symbol.clone(), w.count))
            .collect(),
        dirtiers: ev
            .dirtiers
            .iter()
            .map(|d| {
                [
                    d.cgroup.clone(),
                    binary_bytes(d.dirty_bytes),
                    binary_bytes(d.writeback_bytes),
                    decimal_bytes(d.written_bytes as f64),
                ]
            })
            .collect(),
        cgroup_note: match ev.cgroup_version {
            Some(v) => format!(
                "cgroup v{v}, {} cgroups walked{}",
                ev.cgroups_walked,
                if ev.cgroup_reads_capped > 0 {
                    format!(" ({} readings stopped at the cap)", ev.cgroup_reads_capped)
                } else {
                    String::new()
                }
            ),
            None => "no memory controller: no per-cgroup figures".to_owned(),
        },
        writers: ev
            .writers
            .iter()
            .map(|w| {
                [
                    w.comm.clone(),
                    w.pid.to_string(),
                    w.cgroup.clone().unwrap_or_else(|| "-".into()),
                    decimal_bytes(w.written_bytes as f64),
                ]
            })
            .collect(),
        processes_unreadable: ev.processes_unreadable,
        evidence_note: if ev.reads == 0 {
            "The call returned before the watchdog saw it: no evidence was read.".to_owned()
        } else {
            format!(
                "{} reading{} from the crossing on{}.",
                ev.reads,
                if ev.reads == 1 { "" } else { "s" },
                if ev.complete {
                    ", the last after the call returned"
                } else if e.interrupted {
                    "; the agent stopped before the call returned, so these are the last"
                } else {
                    "; the figures are not final yet"
                }
            )
        },
        device: e.device.as_ref().map(|d| {
            format!(
                "{}; the sampler saw at most {} requests in flight during the stall",
                d.device, d.inflight_requests_max
            )
        }),
        devices: ev.block_devices.iter().map(device_view).collect(),
        journal: journal_view(&e),
        md: e
            .md
            .iter()
            .map(|m| (m.device.clone(), m.action_label()))
            .collect(),
        also_blocked: e
            .also_blocked
            .iter()
            .map(|b| (format!("{} {}", b.mode, b.op), duration(b.blocked_seconds)))
            .collect(),
        vm: vm_rows(&e),
        stack: e.stack.clone(),
        error: e.error.clone(),
        verdict: e.verdict.clone(),
        target: e.target.clone(),
        id: e.id,
    }
}

/// `GET /stalls/{id}`: the event written for a person; 404 with a small page for an id
/// the log does not hold.
pub(super) async fn one(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    match app.stalls.event(&id) {
        Some(e) => render(&page(&app, e), StatusCode::OK),
        None => render(
            &Missing {
                version: env!("CARGO_PKG_VERSION"),
                telemetry_path: &app.telemetry_path,
                id,
            },
            StatusCode::NOT_FOUND,
        ),
    }
}
