//! The router: which path goes to which handler (`fn app(state) -> Router`), and the
//! small handlers (`/metrics`, `/healthz`, `/api/stalls`, `/-/reload`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tower_http::compression::CompressionLayer;

use super::api::api_history;
use super::assets::asset;
use super::page::index;
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
