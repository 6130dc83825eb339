//! The plain-text answers the server gives itself, without the router (401, 429, 503):
//! shared by `limits` and `server`.

use axum::body::Body;
use axum::http::header::{self, HeaderValue};
use axum::http::{Response, StatusCode};

/// A plain-text answer for the refusals (401, 429, 503).
pub(super) fn plain(status: StatusCode, body: String) -> Response<Body> {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}
