//! The web configuration file (`--web.config.file`, the Prometheus exporter-toolkit
//! format): its schema, the extra-header checks and loading into a ready [`WebConfig`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::http::header::{HeaderName, HeaderValue, InvalidHeaderName, InvalidHeaderValue};

use super::auth::{AuthError, BasicAuth};
use super::file::{FileConfig, GoDuration, RateLimitFile};
use super::limits::RateLimiter;
use super::tls::{self, Tls};
use super::tls_error::TlsError;

/// A web config file that was refused.
#[derive(Debug, thiserror::Error)]
pub enum WebConfigError {
    #[error("invalid web config file {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("invalid web config file {}: {error}", path.display())]
    Invalid { path: PathBuf, error: Invalid },
}

/// What is wrong in a web config file.
#[derive(Debug, thiserror::Error)]
pub enum Invalid {
    /// Syntax, an unknown key or a value of the wrong type: the parser's message.
    #[error("{0}")]
    Syntax(yaml_serde::Error),
    #[error("http_server_config.headers: HTTP header {0:?} can not be configured")]
    Header(String),
    #[error(
        "http_server_config.headers: invalid value for {name}: expected one of {allowed:?}, got {value:?}"
    )]
    HeaderValue {
        name: String,
        allowed: &'static [&'static str],
        value: String,
    },
    #[error("{name}: {error}")]
    HeaderName {
        name: String,
        error: InvalidHeaderName,
    },
    #[error("{name}: {error}")]
    HeaderText {
        name: String,
        error: InvalidHeaderValue,
    },
    #[error("rate_limit.interval: {text:?}: {error}")]
    RateLimitInterval {
        text: String,
        error: humantime::DurationError,
    },
    #[error("{0}")]
    Auth(#[from] AuthError),
    #[error("{0}")]
    Tls(#[from] TlsError),
}

/// Headers the toolkit lets a web config set, with the values it allows (None: any).
const EXTRA_HEADERS: &[(&str, Option<&[&str]>)] = &[
    ("Strict-Transport-Security", None),
    ("X-Content-Type-Options", Some(&["nosniff"])),
    ("X-Frame-Options", Some(&["deny", "sameorigin"])),
    ("X-XSS-Protection", None),
    ("Content-Security-Policy", None),
];

/// The web configuration in force: ready to serve, every file already read.
pub struct WebConfig {
    pub(super) tls: Option<Tls>,
    pub(super) auth: Option<Arc<BasicAuth>>,
    pub(super) headers: Vec<(HeaderName, HeaderValue)>,
    pub(super) rate_limit: Option<RateLimiter>,
}

impl WebConfig {
    /// Plain HTTP, no authentication: the configuration without `--web.config.file`.
    pub fn none() -> WebConfig {
        WebConfig {
            tls: None,
            auth: None,
            headers: Vec::new(),
            rate_limit: None,
        }
    }

    /// Reads and checks `path`, the certificates and keys it names (relative to its own
    /// directory) and the password hashes, so that a bad file is refused at start.
    pub fn load(path: &Path) -> Result<WebConfig, WebConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| WebConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        WebConfig::parse(&text, dir).map_err(|error| WebConfigError::Invalid {
            path: path.to_path_buf(),
            error,
        })
    }

    /// Parses `text`; relative file names are taken relative to `dir`.
    pub fn parse(text: &str, dir: &Path) -> Result<WebConfig, Invalid> {
        let file: FileConfig = yaml_serde::from_str::<Option<FileConfig>>(text)
            .map_err(Invalid::Syntax)?
            .unwrap_or_default();
        let headers = check_headers(
            &file
                .http_server_config
                .map(|h| h.headers)
                .unwrap_or_default(),
        )?;
        let auth = match file.basic_auth_users {
            Some(users) if !users.is_empty() => Some(Arc::new(BasicAuth::new(users)?)),
            _ => None,
        };
        let tls = match file.tls_server_config {
            Some(t) => tls::server_config(t, dir)?,
            None => None,
        };
        let rate_limit = match file.rate_limit {
            Some(r) => rate_limiter(r)?,
            None => None,
        };
        Ok(WebConfig {
            tls,
            auth,
            headers,
            rate_limit,
        })
    }

    pub fn tls_enabled(&self) -> bool {
        self.tls.is_some()
    }

    pub fn auth_enabled(&self) -> bool {
        self.auth.is_some()
    }
}

fn check_headers(
    headers: &BTreeMap<String, String>,
) -> Result<Vec<(HeaderName, HeaderValue)>, Invalid> {
    let mut out = Vec::new();
    for (k, v) in headers {
        // The toolkit compares names exactly, so do we: a file that passes promtool passes here.
        let Some((_, allowed)) = EXTRA_HEADERS.iter().find(|(name, _)| name == k) else {
            return Err(Invalid::Header(k.clone()));
        };
        if let Some(allowed) = allowed {
            if !allowed.contains(&v.as_str()) {
                return Err(Invalid::HeaderValue {
                    name: k.clone(),
                    allowed,
                    value: v.clone(),
                });
            }
        }
        let name = HeaderName::from_bytes(k.as_bytes()).map_err(|error| Invalid::HeaderName {
            name: k.clone(),
            error,
        })?;
        let value = HeaderValue::from_str(v).map_err(|error| Invalid::HeaderText {
            name: k.clone(),
            error,
        })?;
        out.push((name, value));
    }
    Ok(out)
}

/// `rate_limit` without an interval, or with a zero one, means no limit (the toolkit's rule).
fn rate_limiter(r: RateLimitFile) -> Result<Option<RateLimiter>, Invalid> {
    let interval = match r.interval {
        None => return Ok(None),
        Some(GoDuration::Nanos(n)) => Duration::from_nanos(n),
        Some(GoDuration::Text(s)) => humantime::parse_duration(&s)
            .map_err(|error| Invalid::RateLimitInterval { text: s, error })?,
    };
    if interval.is_zero() {
        return Ok(None);
    }
    Ok(Some(RateLimiter::new(r.burst, interval)))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::http::server) fn parse(yaml: &str) -> Result<WebConfig, String> {
        WebConfig::parse(yaml, Path::new("/nonexistent")).map_err(|e| e.to_string())
    }

    pub(in crate::http::server) fn err(yaml: &str) -> String {
        match parse(yaml) {
            Ok(_) => panic!("accepted:\n{yaml}"),
            Err(e) => e,
        }
    }

    #[test]
    fn empty_files_and_sections_mean_plain_http() {
        for y in [
            "",
            "# nothing\n",
            "tls_server_config:\nbasic_auth_users:\nhttp_server_config:\n",
        ] {
            let c = parse(y).unwrap();
            assert!(!c.tls_enabled() && !c.auth_enabled(), "{y:?}");
        }
        let c = parse("http_server_config:\n  http2: false\n").unwrap();
        assert!(!c.tls_enabled());
    }

    #[test]
    fn unknown_keys_are_refused_with_their_name() {
        assert!(err("tls_server_config:\n  cert_fil: x\n").contains("cert_fil"));
        assert!(err("basic_auth:\n  a: b\n").contains("basic_auth"));
        assert!(err("http_server_config:\n  http3: true\n").contains("http3"));
        assert!(err("rate_limit:\n  bursts: 3\n").contains("bursts"));
    }

    #[test]
    fn tls_needs_cert_and_key() {
        assert!(err("tls_server_config:\n  key_file: k\n").contains("cert or cert_file"));
        assert!(err("tls_server_config:\n  cert_file: c\n").contains("key or key_file"));
        assert!(
            err("tls_server_config:\n  client_auth_type: RequireAnyClientCert\n")
                .contains("cert or cert_file")
        );
    }

    #[test]
    fn relative_files_resolve_against_the_config_directory() {
        let e = WebConfig::parse(
            "tls_server_config:\n  cert_file: sub/c.pem\n  key_file: k.pem\n",
            Path::new("/etc/stallwatch-test-dir"),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("/etc/stallwatch-test-dir/sub/c.pem"), "{e}");
        let e = WebConfig::parse(
            "tls_server_config:\n  cert_file: /abs/c.pem\n  key_file: k.pem\n",
            Path::new("/etc/x"),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("/abs/c.pem"), "{e}");
    }

    #[test]
    fn headers_are_checked_like_the_toolkit() {
        let c = parse("http_server_config:\n  headers:\n    X-Frame-Options: deny\n    Strict-Transport-Security: max-age=31536000\n").unwrap();
        assert_eq!(c.headers.len(), 2);
        assert!(
            err("http_server_config:\n  headers:\n    X-Frame-Options: allow\n")
                .contains("X-Frame-Options")
        );
        assert!(err("http_server_config:\n  headers:\n    Server: x\n")
            .contains("can not be configured"));
        assert!(
            err("http_server_config:\n  headers:\n    x-frame-options: deny\n")
                .contains("can not be configured")
        );
    }

    #[test]
    fn rate_limit_is_a_token_bucket() {
        assert!(parse("rate_limit:\n  burst: 2\n")
            .unwrap()
            .rate_limit
            .is_none());
        let c = parse("rate_limit:\n  burst: 2\n  interval: 1h\n").unwrap();
        let rl = c.rate_limit.unwrap();
        assert!(rl.allow() && rl.allow() && !rl.allow());
        assert!(parse("rate_limit:\n  burst: 2\n  interval: 1000000000\n")
            .unwrap()
            .rate_limit
            .is_some());
        assert!(err("rate_limit:\n  interval: soon\n").contains("interval"));
    }
}
