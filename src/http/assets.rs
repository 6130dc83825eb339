//! The files of the live page, embedded in the binary, served with a strong ETag.

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

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

pub(super) async fn asset(
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
