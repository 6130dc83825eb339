//! The web configuration file as written (`--web.config.file`, the exporter-toolkit
//! schema): plain serde types, read by `config` and, for its TLS section, by `tls`.

use std::collections::BTreeMap;

use serde::Deserialize;

/// The file as written. Unknown keys are refused, as the toolkit's strict YAML
/// decoding does; sections may be present but empty.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    pub(super) tls_server_config: Option<TlsFile>,
    pub(super) http_server_config: Option<HttpFile>,
    pub(super) rate_limit: Option<RateLimitFile>,
    pub(super) basic_auth_users: Option<BTreeMap<String, String>>,
}

/// `tls_server_config` as written; `tls::server_config` turns it into rustls terms.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct TlsFile {
    pub cert: String,
    pub key: String,
    pub client_ca: String,
    pub cert_file: String,
    pub key_file: String,
    pub client_auth_type: String,
    pub client_ca_file: String,
    pub cipher_suites: Vec<String>,
    pub curve_preferences: Vec<String>,
    pub min_version: Option<String>,
    pub max_version: Option<String>,
    pub prefer_server_cipher_suites: Option<bool>,
    pub client_allowed_sans: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct HttpFile {
    /// Accepted for compatibility; this server speaks HTTP/1.1 only.
    #[allow(dead_code)]
    pub(super) http2: Option<bool>,
    pub(super) headers: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RateLimitFile {
    pub(super) burst: u32,
    pub(super) interval: Option<GoDuration>,
}

/// A Go `time.Duration` in YAML: a string like `1s` or an integer of nanoseconds.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum GoDuration {
    Nanos(u64),
    Text(String),
}
