//! HTTP to the agent with `ureq`: the client settings, and a response as the agent sent it.

use std::time::{Duration, Instant};

/// An HTTP response as the agent sent it: header names lower-case, the body undecoded
/// (ureq is built without its gzip feature, so a gzip body stays gzip).
#[derive(Debug, Clone)]
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub elapsed: Duration,
}

impl RawResponse {
    /// First header of that name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// ureq settings for talking to the agent: a status is an answer, not an error; no
/// proxy; no `Accept-Encoding` unless a test sends one; IPv4 only, so `localhost` is the
/// 127.0.0.1 the agent listens on.
pub fn client_config() -> ureq::config::ConfigBuilder<ureq::typestate::AgentScope> {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(2)))
        .timeout_global(Some(Duration::from_secs(10)))
        .proxy(None)
        .ip_family(ureq::config::IpFamily::Ipv4Only)
        .accept_encoding(ureq::config::AutoHeaderValue::None)
}

/// A client that opens a new connection for every request (nothing pooled), like a
/// scraper's first request: what is measured includes the agent accepting it.
pub fn fresh_client() -> ureq::Agent {
    client_config().max_idle_connections(0).build().into()
}

/// One request with `client`; Err (naming method and URL) on a transport failure:
/// refused, reset, TLS handshake, timeout.
pub fn request(
    client: &ureq::Agent,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<RawResponse, String> {
    let fail = |e: &dyn std::fmt::Display| format!("{method} {url}: {e}");
    let mut req = ureq::http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(()).map_err(|e| fail(&e))?;
    let start = Instant::now();
    let mut resp = client.run(req).map_err(|e| fail(&e))?;
    let body = resp.body_mut().read_to_vec().map_err(|e| fail(&e))?;
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| {
            let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
            (k.as_str().to_ascii_lowercase(), v)
        })
        .collect();
    Ok(RawResponse {
        status: resp.status().as_u16(),
        headers,
        body,
        elapsed: start.elapsed(),
    })
}
