//! The router: which path goes to which handler (`fn app(state) -> Router`), and the
//! small handlers (`/metrics`, `/healthz`, `/api/stalls`, `/api/stalls/{id}`,
//! `/-/reload`); the stall pages `/stalls` and `/stalls/{id}` are `stall_page`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tower_http::compression::CompressionLayer;

use super::api::api_history;
use super::assets::asset;
use super::page::index;
use super::stall_page;
use super::state::App;
use crate::exposition::registry as metrics;

/// The router over `state`. Only GET and HEAD are routed, and POST/PUT to `/-/reload`:
/// other methods get 405, unknown paths 404.
pub fn app(state: Arc<App>) -> Router {
    Router::new()
        .route(&state.telemetry_path.clone(), get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/", get(index))
        .route("/api/stalls", get(stalls))
        .route("/api/stalls/{id}", get(stall))
        .route("/stalls", get(stall_page::list))
        .route("/stalls/{id}", get(stall_page::one))
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

/// The exposition in the format the `Accept` header asks for (`Format::negotiate`):
/// protobuf with native histograms, OpenMetrics text with the classic buckets and their
/// exemplars, or (the default) the text format with the classic buckets.
async fn metrics(State(app): State<Arc<App>>, headers: header::HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = metrics::Format::negotiate(accept);
    let ct = [(header::CONTENT_TYPE, format.content_type())];
    (ct, metrics::body(&app.registry, format)).into_response()
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

/// `GET /api/stalls/{id}`: one event as `/api/stalls` serves it, copied under the stall
/// log's lock; 404 when the ring does not hold it.
async fn stall(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    match app.stalls.event(&id) {
        Some(ev) => Json(ev).into_response(),
        None => (StatusCode::NOT_FOUND, "no stall event with this id\n").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use axum::body::{to_bytes, Body};
    use axum::http::{Method, Request};
    use tower::ServiceExt;

    use super::*;
    use crate::base::labels::{Mode, Op};
    use crate::exposition::registry::Registry;
    use crate::history::History;
    use crate::kernel::blockdev::TargetDevices;
    use crate::probe::Targets;
    use crate::stall::inflight::InFlightOp;
    use crate::stall::log::{FinishedCall, LaneKey, StallLog};

    /// An agent's state with no target and a log of two events: one completed, one
    /// ongoing.
    fn state() -> Arc<App> {
        state_named("wal")
    }

    /// As [`state`], the target named `name`.
    fn state_named(name: &'static str) -> Arc<App> {
        let registry = Registry::new();
        let stalls = Arc::new(StallLog::new(8, &registry, Arc::default()));
        let devices = TargetDevices::default();
        let key = |lane| LaneKey {
            devices: &devices,
            lane,
            name,
        };
        let call = FinishedCall {
            mode: Mode::Overwrite,
            op: Op::Fsync,
            seq: 1,
            elapsed: Duration::from_millis(1500),
            failure: None,
            waits: None,
        };
        stalls.finished(key(0), call, &[]);
        let blocked = InFlightOp {
            mode: Mode::Create,
            op: Op::Create,
            seq: 3,
            started: std::time::Instant::now() - Duration::from_secs(2),
            age: Duration::from_secs(2),
        };
        stalls.crossed(key(1), blocked, &[], None);
        Arc::new(App {
            registry,
            stalls,
            targets: Arc::new(Targets::new(Vec::new())),
            history: Arc::new(History::new()),
            latest: Arc::default(),
            telemetry_path: "/metrics".into(),
            reload: None,
            stalls_json: Mutex::default(),
        })
    }

    async fn get(app: &Arc<App>, method: Method, path: &str) -> (StatusCode, String, String) {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .unwrap();
        let resp = super::app(Arc::clone(app)).oneshot(req).await.unwrap();
        let status = resp.status();
        let ctype = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let body = to_bytes(resp.into_body(), 1 << 20).await.unwrap();
        (status, ctype, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn one_stall_event_by_its_id_as_the_list_serves_it() {
        let app = state();
        let (status, _, body) = get(&app, Method::GET, "/api/stalls").await;
        assert_eq!(status, StatusCode::OK);
        let list: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
        assert_eq!(list.len(), 2);
        for want in &list {
            let id = want["id"].as_str().expect("every event has an id");
            let (status, ctype, body) = get(&app, Method::GET, &format!("/api/stalls/{id}")).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            assert_eq!(ctype, "application/json");
            let got: serde_json::Value = serde_json::from_str(&body).unwrap();
            if want["ongoing"] == true {
                // Served with its age so far: later than the list's.
                assert!(got["duration_seconds"].as_f64() >= want["duration_seconds"].as_f64());
                let (mut got, mut want) = (got.clone(), want.clone());
                for v in [&mut got, &mut want] {
                    v["duration_seconds"] = 0.into();
                    v["verdict"] = "".into();
                }
                assert_eq!(got, want);
            } else {
                assert_eq!(&got, want);
            }
        }
        let (status, _, body) = get(
            &app,
            Method::HEAD,
            &format!("/api/stalls/{}", list[0]["id"].as_str().unwrap()),
        )
        .await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, ""));
    }

    #[tokio::test]
    async fn an_unknown_stall_id_is_404_in_plain_text() {
        let app = state();
        for path in [
            "/api/stalls/0000-0000-1",
            "/api/stalls/%2e%2e",
            "/api/stalls/x/y",
        ] {
            let (status, ctype, body) = get(&app, Method::GET, path).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
            assert!(ctype.starts_with("text/plain"), "{path}: {ctype}");
            assert!(body.len() < 64 && body.ends_with('\n'), "{path}: {body:?}");
        }
        let id = app.stalls.events()[0].id.clone();
        let (status, _, _) = get(&app, Method::POST, &format!("/api/stalls/{id}")).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    }

    #[tokio::test]
    async fn the_stall_pages_link_the_list_to_each_event_and_404_in_html() {
        let app = state();
        let (status, ctype, html) = get(&app, Method::GET, "/stalls").await;
        assert_eq!(status, StatusCode::OK);
        assert!(ctype.starts_with("text/html"), "{ctype}");
        for e in app.stalls.events() {
            let link = format!("<a href=\"/stalls/{}\">", e.id);
            assert!(html.contains(&link), "{link} in\n{html}");
            let (status, ctype, page) = get(&app, Method::GET, &format!("/stalls/{}", e.id)).await;
            assert_eq!(status, StatusCode::OK, "{page}");
            assert!(ctype.starts_with("text/html"), "{ctype}");
            assert!(page.contains("id=\"verdict\""), "{page}");
            assert!(page.contains(&format!("<dd>{}</dd>", e.op)), "{page}");
            if e.ongoing {
                assert!(page.contains("so far."), "{page}");
            }
            // No evidence in these events: no journal, no device chart, no md.
            for absent in ["id=\"journal\"", "<svg", "id=\"md\"", "id=\"dirtiers\""] {
                assert!(!page.contains(absent), "{absent} in\n{page}");
            }
        }
        for path in ["/stalls/0000-0000-1", "/stalls/%3Cb%3Ex"] {
            let (status, ctype, body) = get(&app, Method::GET, path).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
            assert!(ctype.starts_with("text/html"), "{path}: {ctype}");
            assert!(body.contains("No such stall"), "{body}");
            assert!(!body.contains("<b>x"), "the id is escaped: {body}");
            assert!(body.len() < 2048, "a small page: {}", body.len());
        }
        assert_eq!(
            get(&app, Method::GET, "/stalls/a/b").await.0,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            get(&app, Method::POST, "/stalls").await.0,
            StatusCode::METHOD_NOT_ALLOWED
        );
    }

    #[tokio::test]
    async fn the_stall_list_filters_by_target_and_says_so() {
        let app = state();
        let (_, _, all) = get(&app, Method::GET, "/stalls").await;
        assert_eq!(
            all.matches("<tr").count(),
            3,
            "header and two events: {all}"
        );
        let (status, _, html) = get(&app, Method::GET, "/stalls?target=wal").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(html.matches("<tr").count(), 3, "{html}");
        assert!(html.contains("Only the stalls of target wal."), "{html}");
        assert!(
            html.contains("<a href=\"/stalls\">All targets</a>"),
            "{html}"
        );
        let (status, _, html) = get(&app, Method::GET, "/stalls?target=data").await;
        assert_eq!(status, StatusCode::OK);
        assert!(!html.contains("<table"), "{html}");
        assert!(
            html.contains("No stall of this target has been recorded since the agent started."),
            "{html}"
        );
        let empty = Arc::new(App {
            stalls: Arc::new(StallLog::new(8, &Registry::new(), Arc::default())),
            ..Arc::into_inner(state()).unwrap()
        });
        let (_, _, html) = get(&empty, Method::GET, "/stalls").await;
        assert!(
            html.contains("No stall has been recorded since the agent started."),
            "{html}"
        );
    }

    #[tokio::test]
    async fn a_hostile_target_name_is_escaped_in_the_stall_pages() {
        let evil = "<script>alert('x')</script>&\"q\"";
        let app = state_named(evil);
        let id = app.stalls.events()[0].id.clone();
        for path in [
            "/stalls".to_owned(),
            format!("/stalls/{id}"),
            "/stalls?target=%3Cscript%3Ealert('x')%3C%2Fscript%3E%26%22q%22".to_owned(),
        ] {
            let (status, _, html) = get(&app, Method::GET, &path).await;
            assert_eq!(status, StatusCode::OK, "{path}");
            assert!(!html.contains("<script>"), "{path}: {html}");
            assert!(
                html.contains(
                    "&#60;script&#62;alert(&#39;x&#39;)&#60;/script&#62;&#38;&#34;q&#34;"
                ),
                "{path}: {html}"
            );
            // The filter link carries the name as a query value.
            assert!(
                html.contains(
                    "/stalls?target=%3Cscript%3Ealert%28%27x%27%29%3C%2Fscript%3E%26%22q%22"
                ),
                "{path}: {html}"
            );
        }
        let (_, _, html) = get(
            &app,
            Method::GET,
            "/stalls?target=%3Cscript%3Ealert('x')%3C%2Fscript%3E%26%22q%22",
        )
        .await;
        assert_eq!(html.matches("<tr").count(), 3, "the filter matched: {html}");
    }
}
