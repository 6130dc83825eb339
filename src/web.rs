//! The HTTP server: `--web.config.file` (the Prometheus exporter-toolkit format: TLS,
//! basic auth, extra headers, rate limit) and our own accept loop, which bounds what a
//! client can hold: header size and read time, idle keep-alive, requests in flight,
//! open connections. A scrape from a well-behaved client must get through while
//! hundreds of idle or half-sent connections are open.

use crate::sync::lock;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::convert::Infallible;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::body::Body;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{Request, Response, StatusCode};
use axum::Router;
use base64::Engine as _;
use hyper::body::Incoming;
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, Semaphore};
use tracing::{debug, info, warn};

/// `--web.max-requests` default, as node_exporter's.
pub const DEFAULT_MAX_REQUESTS: usize = 40;

/// What one client may hold. The defaults suit an agent scraped every few seconds by a
/// handful of Prometheus servers.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Requests served at once; beyond this a request gets 503 at once, never queued
    /// (a queued scrape would only time out later). 0: no limit.
    pub max_requests: usize,
    /// Open connections. At the cap, the oldest connection with no request in flight
    /// (idle, half-sent or still in its TLS handshake) is closed for the new one, so
    /// piling up connections cannot lock out a fresh scrape.
    pub max_connections: usize,
    /// Time allowed for a TLS handshake and for each request head, counted from the
    /// moment the server waits for it: against slowloris, and the keep-alive idle
    /// timeout as well (hyper waits for the next head under the same timer).
    pub header_read_timeout: Duration,
    /// Request line plus headers; larger gets 431.
    pub max_header_bytes: usize,
    /// After the listener is closed, how long open connections may finish.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_requests: DEFAULT_MAX_REQUESTS,
            max_connections: 512,
            header_read_timeout: Duration::from_secs(10),
            max_header_bytes: 16 * 1024,
            shutdown_grace: Duration::from_secs(1),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The web configuration file
// ---------------------------------------------------------------------------------------

/// A web config file that was refused.
#[derive(Debug, thiserror::Error)]
#[error("invalid web config file {}: {message}", path.display())]
pub struct WebConfigError {
    pub path: PathBuf,
    pub message: String,
}

/// The file as written. Unknown keys are refused, as the toolkit's strict YAML
/// decoding does; sections may be present but empty.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    tls_server_config: Option<TlsFile>,
    http_server_config: Option<HttpFile>,
    rate_limit: Option<RateLimitFile>,
    basic_auth_users: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct TlsFile {
    cert: String,
    key: String,
    client_ca: String,
    cert_file: String,
    key_file: String,
    client_auth_type: String,
    client_ca_file: String,
    cipher_suites: Vec<String>,
    curve_preferences: Vec<String>,
    min_version: Option<String>,
    max_version: Option<String>,
    prefer_server_cipher_suites: Option<bool>,
    client_allowed_sans: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct HttpFile {
    /// Accepted for compatibility; this server speaks HTTP/1.1 only.
    #[allow(dead_code)]
    http2: Option<bool>,
    headers: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RateLimitFile {
    burst: u32,
    interval: Option<GoDuration>,
}

/// A Go `time.Duration` in YAML: a string like `1s` or an integer of nanoseconds.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum GoDuration {
    Nanos(u64),
    Text(String),
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
    tls: Option<Arc<rustls::ServerConfig>>,
    auth: Option<Arc<BasicAuth>>,
    headers: Vec<(HeaderName, HeaderValue)>,
    rate_limit: Option<RateLimiter>,
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
        let err = |message: String| WebConfigError {
            path: path.to_path_buf(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        WebConfig::parse(&text, dir).map_err(err)
    }

    /// Parses `text`; relative file names are taken relative to `dir`.
    pub fn parse(text: &str, dir: &Path) -> Result<WebConfig, String> {
        let file: FileConfig = serde_yaml::from_str::<Option<FileConfig>>(text)
            .map_err(|e| e.to_string())?
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
            Some(t) => tls_config(t, dir)?,
            None => None,
        };
        let rate_limit = match file.rate_limit {
            Some(r) => RateLimiter::new(r)?,
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
) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let mut out = Vec::new();
    for (k, v) in headers {
        // The toolkit compares names exactly, so do we: a file that passes promtool passes here.
        let Some((_, allowed)) = EXTRA_HEADERS.iter().find(|(name, _)| name == k) else {
            return Err(format!(
                "http_server_config.headers: HTTP header {k:?} can not be configured"
            ));
        };
        if let Some(allowed) = allowed {
            if !allowed.contains(&v.as_str()) {
                return Err(format!(
                    "http_server_config.headers: invalid value for {k}: expected one of {allowed:?}, got {v:?}"
                ));
            }
        }
        let name = HeaderName::from_bytes(k.as_bytes()).map_err(|e| format!("{k}: {e}"))?;
        let value = HeaderValue::from_str(v).map_err(|e| format!("{k}: {e}"))?;
        out.push((name, value));
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// TLS
// ---------------------------------------------------------------------------------------

/// Where a certificate or key comes from: a file is re-read when it changes (certificate
/// rotation without a restart, as the toolkit does), inline text never changes.
#[derive(Debug, Clone)]
enum Pem {
    File(PathBuf),
    Inline(String),
}

impl Pem {
    fn pick(file: &str, inline: &str, dir: &Path) -> Option<Pem> {
        if !file.is_empty() {
            Some(Pem::File(dir.join(file)))
        } else if !inline.is_empty() {
            Some(Pem::Inline(inline.to_owned()))
        } else {
            None
        }
    }

    fn read(&self, what: &str) -> Result<Vec<u8>, String> {
        match self {
            Pem::File(p) => std::fs::read(p).map_err(|e| format!("{what} {}: {e}", p.display())),
            Pem::Inline(s) => Ok(s.as_bytes().to_vec()),
        }
    }

    fn modified(&self) -> Option<SystemTime> {
        match self {
            Pem::File(p) => std::fs::metadata(p).and_then(|m| m.modified()).ok(),
            Pem::Inline(_) => None,
        }
    }
}

fn tls_config(t: TlsFile, dir: &Path) -> Result<Option<Arc<rustls::ServerConfig>>, String> {
    let enabled = [
        &t.cert,
        &t.key,
        &t.client_ca,
        &t.cert_file,
        &t.key_file,
        &t.client_ca_file,
        &t.client_auth_type,
    ]
    .iter()
    .any(|s| !s.is_empty());
    if !enabled {
        return Ok(None);
    }
    let cert = Pem::pick(&t.cert_file, &t.cert, dir)
        .ok_or("tls_server_config: missing one of cert or cert_file")?;
    let key = Pem::pick(&t.key_file, &t.key, dir)
        .ok_or("tls_server_config: missing one of key or key_file")?;

    let mut provider = rustls::crypto::ring::default_provider();
    if !t.cipher_suites.is_empty() {
        provider.cipher_suites = cipher_suites(&t.cipher_suites, &provider.cipher_suites)?;
    }
    if !t.curve_preferences.is_empty() {
        provider.kx_groups = curves(&t.curve_preferences, &provider.kx_groups)?;
    }
    let provider = Arc::new(provider);
    let versions = versions(t.min_version.as_deref(), t.max_version.as_deref())?;

    let resolver = CertResolver::new(cert, key, Arc::clone(&provider))?;
    let client_ca = match Pem::pick(&t.client_ca_file, &t.client_ca, dir) {
        Some(ca) => Some(client_roots(&ca)?),
        None => None,
    };
    let verifier = client_verifier(
        &t.client_auth_type,
        client_ca,
        t.client_allowed_sans.as_deref(),
        &provider,
    )?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .map_err(|e| format!("tls_server_config: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(resolver));
    // The toolkit's default: the server's cipher order wins.
    cfg.ignore_client_order = t.prefer_server_cipher_suites.unwrap_or(true);
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(Arc::new(cfg)))
}

/// Go's names of the TLS 1.2 suites it considers secure. Only those rustls implements
/// can be used; TLS 1.3 suites are not configurable, in Go as here.
const GO_CIPHER_SUITES: &[&str] = &[
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
];

fn cipher_suites(
    names: &[String],
    all: &[rustls::SupportedCipherSuite],
) -> Result<Vec<rustls::SupportedCipherSuite>, String> {
    let mut tls12 = Vec::new();
    for n in names {
        if !GO_CIPHER_SUITES.contains(&n.as_str()) {
            return Err(format!(
                "tls_server_config.cipher_suites: unknown cipher: {n}"
            ));
        }
        if let Some(s) = all.iter().find(|s| {
            s.version() == &rustls::version::TLS12 && s.suite().as_str() == Some(n.as_str())
        }) {
            if !tls12.contains(s) {
                tls12.push(*s);
            }
        }
    }
    if tls12.is_empty() {
        return Err(format!(
            "tls_server_config.cipher_suites: none of {names:?} is available here; \
             use ECDHE suites with AES-GCM or ChaCha20-Poly1305"
        ));
    }
    let mut out: Vec<_> = all
        .iter()
        .filter(|s| s.version() == &rustls::version::TLS13)
        .copied()
        .collect();
    out.extend(tls12);
    Ok(out)
}

fn curves(
    names: &[String],
    all: &[&'static dyn rustls::crypto::SupportedKxGroup],
) -> Result<Vec<&'static dyn rustls::crypto::SupportedKxGroup>, String> {
    use rustls::NamedGroup;
    let mut out = Vec::new();
    for n in names {
        let group = match n.as_str() {
            "CurveP256" => NamedGroup::secp256r1,
            "CurveP384" => NamedGroup::secp384r1,
            "CurveP521" => NamedGroup::secp521r1,
            "X25519" => NamedGroup::X25519,
            _ => {
                return Err(format!(
                    "tls_server_config.curve_preferences: unknown curve: {n}"
                ))
            }
        };
        if let Some(g) = all.iter().find(|g| g.name() == group) {
            out.push(*g);
        }
    }
    if out.is_empty() {
        return Err(format!(
            "tls_server_config.curve_preferences: none of {names:?} is available here; \
             use X25519, CurveP256 or CurveP384"
        ));
    }
    Ok(out)
}

/// rustls speaks TLS 1.2 and 1.3 only: a minimum of TLS10 or TLS11 means TLS12 here.
fn versions(
    min: Option<&str>,
    max: Option<&str>,
) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, String> {
    let rank = |v: Option<&str>, default: u8, key: &str| -> Result<u8, String> {
        match v {
            None => Ok(default),
            Some("TLS10") => Ok(10),
            Some("TLS11") => Ok(11),
            Some("TLS12") => Ok(12),
            Some("TLS13") => Ok(13),
            Some(other) => Err(format!(
                "tls_server_config.{key}: unknown TLS version: {other}"
            )),
        }
    };
    let lo = rank(min, 12, "min_version")?;
    let hi = rank(max, 13, "max_version")?;
    if hi < 12 {
        return Err(
            "tls_server_config.max_version: below TLS12, which is the least this server speaks"
                .into(),
        );
    }
    if lo > hi {
        return Err("tls_server_config: min_version is above max_version".into());
    }
    let mut v = Vec::new();
    if hi >= 13 {
        v.push(&rustls::version::TLS13);
    }
    if lo <= 12 {
        v.push(&rustls::version::TLS12);
    }
    Ok(v)
}

fn load_certified_key(
    cert: &Pem,
    key: &Pem,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, String> {
    let cert_pem = cert.read("cert_file")?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("tls_server_config: certificate: {e:?}"))?;
    if chain.is_empty() {
        return Err("tls_server_config: no PEM certificate in cert or cert_file".into());
    }
    let key_pem = key.read("key_file")?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| format!("tls_server_config: private key: {e:?}"))?;
    CertifiedKey::from_der(chain, key, provider)
        .map_err(|e| format!("tls_server_config: certificate and key: {e}"))
}

/// Serves the configured certificate, re-reading the files at most once a second when
/// their modification time changed. A broken new pair is logged and the old one kept.
#[derive(Debug)]
struct CertResolver {
    cert: Pem,
    key: Pem,
    provider: Arc<CryptoProvider>,
    state: Mutex<CertState>,
}

#[derive(Debug)]
struct CertState {
    current: Arc<CertifiedKey>,
    stamp: (Option<SystemTime>, Option<SystemTime>),
    checked: Instant,
}

impl CertResolver {
    fn new(cert: Pem, key: Pem, provider: Arc<CryptoProvider>) -> Result<CertResolver, String> {
        let stamp = (cert.modified(), key.modified());
        let current = Arc::new(load_certified_key(&cert, &key, &provider)?);
        Ok(CertResolver {
            cert,
            key,
            provider,
            state: Mutex::new(CertState {
                current,
                stamp,
                checked: Instant::now(),
            }),
        })
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut st = lock(&self.state);
        if st.checked.elapsed() >= Duration::from_secs(1) {
            st.checked = Instant::now();
            let stamp = (self.cert.modified(), self.key.modified());
            if stamp != st.stamp {
                st.stamp = stamp;
                match load_certified_key(&self.cert, &self.key, &self.provider) {
                    Ok(k) => {
                        info!("TLS certificate reloaded");
                        st.current = Arc::new(k);
                    }
                    Err(e) => {
                        warn!(error = %e, "TLS certificate changed but cannot be loaded; keeping the previous one")
                    }
                }
            }
        }
        Some(Arc::clone(&st.current))
    }
}

fn client_roots(ca: &Pem) -> Result<Arc<RootCertStore>, String> {
    let pem = ca.read("client_ca_file")?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("tls_server_config: client CA: {e:?}"))?;
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(
            "tls_server_config: no usable CA certificate in client_ca or client_ca_file".into(),
        );
    }
    Ok(Arc::new(roots))
}

fn client_verifier(
    auth_type: &str,
    roots: Option<Arc<RootCertStore>>,
    allowed_sans: Option<&[String]>,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, String> {
    let verified = |optional: bool| -> Result<Arc<dyn ClientCertVerifier>, String> {
        let roots = roots.clone().ok_or_else(|| {
            format!(
                "tls_server_config: client_auth_type {auth_type} needs client_ca_file or client_ca"
            )
        })?;
        let b = WebPkiClientVerifier::builder_with_provider(roots, Arc::clone(provider));
        let b = if optional {
            b.allow_unauthenticated()
        } else {
            b
        };
        b.build()
            .map_err(|e| format!("tls_server_config: client CA: {e}"))
    };
    let any = |mandatory: bool| -> Arc<dyn ClientCertVerifier> {
        Arc::new(AnyClientCert {
            mandatory,
            provider: Arc::clone(provider),
        })
    };
    let (verifier, mandatory) = match auth_type {
        "" | "NoClientCert" => {
            if roots.is_some() {
                return Err("tls_server_config: client CA's have been configured without a client_auth_type".into());
            }
            (WebPkiClientVerifier::no_client_auth(), false)
        }
        "RequestClientCert" => (any(false), false),
        "RequireAnyClientCert" | "RequireClientCert" => (any(true), true),
        "VerifyClientCertIfGiven" => (verified(true)?, false),
        "RequireAndVerifyClientCert" => (verified(false)?, true),
        other => {
            return Err(format!(
                "tls_server_config.client_auth_type: invalid {other:?}; one of NoClientCert, \
                 RequestClientCert, RequireAnyClientCert, VerifyClientCertIfGiven, \
                 RequireAndVerifyClientCert"
            ))
        }
    };
    let Some(sans) = allowed_sans else {
        return Ok(verifier);
    };
    if !mandatory {
        return Err(
            "tls_server_config: client_allowed_sans requires client_auth_type \
                    RequireAnyClientCert or RequireAndVerifyClientCert"
                .into(),
        );
    }
    for s in sans {
        if s.contains('@') && !s.contains(':') {
            return Err(format!(
                "tls_server_config.client_allowed_sans: {s:?}: e-mail SANs are not supported; \
                 use DNS names, IP addresses or URIs"
            ));
        }
    }
    Ok(Arc::new(SanCheck {
        inner: verifier,
        allowed: sans.to_vec(),
    }))
}

/// `RequestClientCert` / `RequireAnyClientCert`: a certificate is asked for and its
/// handshake signature checked, but not its issuer (Go's semantics for these modes).
#[derive(Debug)]
struct AnyClientCert {
    mandatory: bool,
    provider: Arc<CryptoProvider>,
}

impl ClientCertVerifier for AnyClientCert {
    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// `client_allowed_sans`: after the inner verifier, the client certificate must carry
/// one of the listed DNS names, IP addresses or URIs (compared exactly, as the toolkit).
#[derive(Debug)]
struct SanCheck {
    inner: Arc<dyn ClientCertVerifier>,
    allowed: Vec<String>,
}

impl SanCheck {
    fn matches(&self, cert: &CertificateDer<'_>) -> bool {
        let Ok(ee) = webpki::EndEntityCert::try_from(cert) else {
            return false;
        };
        self.allowed.iter().any(|want| {
            ee.valid_dns_names().any(|n| n == want)
                || ee.valid_uri_names().any(|n| n == want)
                || match want.parse::<std::net::IpAddr>() {
                    Ok(ip) => ee
                        .verify_is_valid_for_subject_name(&ServerName::IpAddress(ip.into()))
                        .is_ok(),
                    Err(_) => false,
                }
        })
    }
}

impl ClientCertVerifier for SanCheck {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let ok = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        if self.matches(end_entity) {
            Ok(ok)
        } else {
            Err(rustls::Error::General(
                "client certificate carries none of client_allowed_sans".into(),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

// ---------------------------------------------------------------------------------------
// Basic auth and rate limit
// ---------------------------------------------------------------------------------------

/// Successful verifications remembered; each costs a bcrypt (tens of milliseconds by
/// design), which a scrape every few seconds should not pay each time.
const AUTH_CACHE_SIZE: usize = 128;

/// bcrypt reads at most 72 bytes of a password; like Go, longer ones are refused rather
/// than silently truncated.
const BCRYPT_MAX_PASSWORD: usize = 72;

struct BasicAuth {
    users: HashMap<String, String>,
    /// Checked for unknown users, so that their answer takes as long as a known one's.
    decoy_hash: String,
    /// SHA-256 of user, hash and password of verified credentials; never the password.
    verified: Mutex<HashSet<[u8; 32]>>,
    /// One bcrypt at a time: a burst of wrong passwords costs one core, not all.
    bcrypt: Mutex<()>,
}

impl BasicAuth {
    fn new(users: BTreeMap<String, String>) -> Result<BasicAuth, String> {
        let mut max_cost = 4;
        for (user, hash) in &users {
            let parts: bcrypt::HashParts = hash
                .parse()
                .map_err(|e| format!("basic_auth_users: {user}: not a bcrypt hash ({e})"))?;
            let cost = parts.get_cost();
            if !(4..=31).contains(&cost) {
                return Err(format!(
                    "basic_auth_users: {user}: bcrypt cost {cost} outside 4..31"
                ));
            }
            max_cost = max_cost.max(cost);
        }
        let decoy_hash = bcrypt::hash(b"stallwatch decoy password", max_cost)
            .map_err(|e| format!("basic_auth_users: {e}"))?;
        Ok(BasicAuth {
            users: users.into_iter().collect(),
            decoy_hash,
            verified: Mutex::new(HashSet::new()),
            bcrypt: Mutex::new(()),
        })
    }

    /// True when the request carries the credentials of a configured user.
    async fn check(self: &Arc<Self>, headers: &HeaderMap) -> bool {
        let Some((user, pass)) = basic_credentials(headers) else {
            return false;
        };
        let (hash, known) = match self.users.get(&user) {
            Some(h) => (h.clone(), true),
            None => (self.decoy_hash.clone(), false),
        };
        let key = cache_key(&user, &hash, &pass);
        if known && lock(&self.verified).contains(&key) {
            return true;
        }
        let me = Arc::clone(self);
        // bcrypt blocks for tens of milliseconds: never on the runtime's only thread.
        let ok = tokio::task::spawn_blocking(move || {
            let _one = lock(&me.bcrypt);
            pass.len() <= BCRYPT_MAX_PASSWORD && bcrypt::verify(&pass, &hash).unwrap_or(false)
        })
        .await
        .unwrap_or(false);
        if ok && known {
            let mut v = lock(&self.verified);
            if v.len() >= AUTH_CACHE_SIZE {
                if let Some(old) = v.iter().next().copied() {
                    v.remove(&old);
                }
            }
            v.insert(key);
        }
        ok && known
    }
}

fn cache_key(user: &str, hash: &str, pass: &[u8]) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [user.as_bytes(), hash.as_bytes(), pass] {
        ctx.update(&(part.len() as u64).to_be_bytes());
        ctx.update(part);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// `Authorization: Basic base64(user:password)`; the scheme name is case-insensitive.
fn basic_credentials(headers: &HeaderMap) -> Option<(String, Vec<u8>)> {
    let v = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, rest) = v.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(rest)
        .ok()?;
    let colon = raw.iter().position(|&b| b == b':')?;
    let user = String::from_utf8(raw[..colon].to_vec()).ok()?;
    Some((user, raw[colon + 1..].to_vec()))
}

/// The toolkit's `rate_limit`: a token bucket of `burst` requests refilled one per
/// `interval`, over all clients. Beyond it: 429.
struct RateLimiter {
    per_token: Duration,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    fn new(r: RateLimitFile) -> Result<Option<RateLimiter>, String> {
        let interval = match r.interval {
            None => return Ok(None),
            Some(GoDuration::Nanos(n)) => Duration::from_nanos(n),
            Some(GoDuration::Text(s)) => humantime::parse_duration(&s)
                .map_err(|e| format!("rate_limit.interval: {s:?}: {e}"))?,
        };
        if interval.is_zero() {
            return Ok(None);
        }
        let burst = f64::from(r.burst);
        Ok(Some(RateLimiter {
            per_token: interval,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }))
    }

    fn allow(&self) -> bool {
        let mut st = lock(&self.state);
        let now = Instant::now();
        let refill = now.duration_since(st.1).as_secs_f64() / self.per_token.as_secs_f64();
        st.0 = (st.0 + refill).min(self.burst);
        st.1 = now;
        if st.0 >= 1.0 {
            st.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

// ---------------------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------------------

struct Server {
    router: TowerToHyperService<Router>,
    web: WebConfig,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: Limits,
    requests: Option<Arc<Semaphore>>,
    http: hyper::server::conn::http1::Builder,
    conns: Conns,
}

/// Serves `app` on `listener` until `shutdown` completes; then closes the listener at
/// once, lets open connections finish for up to `limits.shutdown_grace`, and returns.
/// Connections still open then are dropped with the runtime.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    web: WebConfig,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    if web.tls_enabled() {
        info!("TLS is enabled");
    }
    if web.auth_enabled() {
        info!("basic authentication is enabled");
    }
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_header_bytes)
        // Bounds a head that never completes, too: past this it is 431 as well.
        .max_buf_size((2 * limits.max_header_bytes).max(8192))
        .keep_alive(true);
    let srv = Arc::new(Server {
        router: TowerToHyperService::new(app),
        tls: web.tls.clone().map(tokio_rustls::TlsAcceptor::from),
        web,
        requests: (limits.max_requests > 0).then(|| Arc::new(Semaphore::new(limits.max_requests))),
        limits,
        http,
        conns: Conns::default(),
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _peer)) => {
                    let _ = tcp.set_nodelay(true);
                    if let Some(guard) = srv.conns.open(srv.limits.max_connections) {
                        tokio::spawn(connection(tcp, Arc::clone(&srv), guard, stop_rx.clone()));
                    }
                }
                Err(e) => {
                    // Out of descriptors: free one and pause, rather than spin on accept.
                    let errno = e.raw_os_error();
                    if errno == Some(nix::errno::Errno::EMFILE as i32)
                        || errno == Some(nix::errno::Errno::ENFILE as i32)
                    {
                        srv.conns.evict_oldest_idle();
                        srv.conns.warn_throttled("accept: out of file descriptors; closed the oldest idle connection");
                    } else {
                        debug!(error = %e, "accept failed");
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let deadline = Instant::now() + srv.limits.shutdown_grace;
    while !srv.conns.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

impl Server {
    /// Limits, authentication, then the router; the configured headers on every answer.
    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let mut resp = self.guarded(req).await;
        for (k, v) in &self.web.headers {
            resp.headers_mut().insert(k.clone(), v.clone());
        }
        resp
    }

    async fn guarded(&self, req: Request<Incoming>) -> Response<Body> {
        // Held until the response is ready, not while a slow client reads it: the limit
        // bounds the work of producing answers, and a slow reader must not lock out others.
        let _permit = match &self.requests {
            Some(sem) => match Arc::clone(sem).try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_) => {
                    return plain(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "limit of concurrent requests reached ({}), try again later\n",
                            self.limits.max_requests
                        ),
                    )
                }
            },
            None => None,
        };
        if let Some(rl) = &self.web.rate_limit {
            if !rl.allow() {
                return plain(StatusCode::TOO_MANY_REQUESTS, "Too Many Requests\n".into());
            }
        }
        if let Some(auth) = &self.web.auth {
            if !auth.check(req.headers()).await {
                let mut r = plain(StatusCode::UNAUTHORIZED, "Unauthorized\n".into());
                r.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic"));
                return r;
            }
        }
        match self.router.call(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        }
    }
}

fn plain(status: StatusCode, body: String) -> Response<Body> {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// One accepted connection, from TLS handshake to close; ends early when evicted.
async fn connection(
    tcp: TcpStream,
    srv: Arc<Server>,
    guard: ConnGuard,
    mut stop: watch::Receiver<bool>,
) {
    let state = Arc::clone(&guard.state);
    let evicted = state.evict.notified();
    tokio::pin!(evicted);
    tokio::select! {
        _ = &mut evicted => debug!("connection closed to make room for a new one"),
        _ = async {
            match &srv.tls {
                None => serve_http(tcp, &srv, &state, stop).await,
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(
                        srv.limits.header_read_timeout,
                        acceptor.accept(tcp),
                    );
                    let tls = tokio::select! {
                        r = handshake => match r {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => {
                                debug!(error = %e, "TLS handshake failed");
                                return;
                            }
                            Err(_) => {
                                debug!("TLS handshake timed out");
                                return;
                            }
                        },
                        _ = stop.wait_for(|s| *s) => return,
                    };
                    serve_http(tls, &srv, &state, stop).await
                }
            }
        } => {}
    }
    drop(guard);
}

async fn serve_http<I>(
    io: I,
    srv: &Arc<Server>,
    state: &Arc<ConnState>,
    mut stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (srv2, state2) = (Arc::clone(srv), Arc::clone(state));
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let busy = Busy::new(Arc::clone(&state2));
        let fut = Arc::clone(&srv2).handle(req);
        async move {
            let resp = fut.await;
            drop(busy);
            Ok::<_, Infallible>(resp)
        }
    });
    let conn = srv.http.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                debug!(error = %e, "HTTP connection ended with an error");
            }
            return;
        }
        _ = stop.wait_for(|s| *s) => conn.as_mut().graceful_shutdown(),
    }
    let _ = conn.await;
}

/// The open connections, oldest first, with whether each is serving a request.
#[derive(Default)]
struct Conns {
    table: Arc<Mutex<ConnTable>>,
}

#[derive(Default)]
struct ConnTable {
    next_id: u64,
    open: BTreeMap<u64, Arc<ConnState>>,
    last_warning: Option<Instant>,
}

#[derive(Default)]
struct ConnState {
    /// Requests being answered on this connection (0 or 1 without pipelining).
    busy: AtomicUsize,
    evict: Notify,
}

struct ConnGuard {
    table: Arc<Mutex<ConnTable>>,
    id: u64,
    state: Arc<ConnState>,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        lock(&self.table).open.remove(&self.id);
    }
}

struct Busy(Arc<ConnState>);

impl Busy {
    fn new(s: Arc<ConnState>) -> Busy {
        s.busy.fetch_add(1, Ordering::Relaxed);
        Busy(s)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ConnTable {
    /// Closes the oldest connection that is not answering a request; false if none.
    fn evict_oldest_idle(&mut self) -> bool {
        let victim = self
            .open
            .iter()
            .find(|(_, s)| s.busy.load(Ordering::Relaxed) == 0)
            .map(|(id, _)| *id);
        match victim.and_then(|id| self.open.remove(&id)) {
            Some(s) => {
                s.evict.notify_one();
                true
            }
            None => false,
        }
    }

    fn warn_throttled(&mut self, msg: &str) {
        let now = Instant::now();
        if self
            .last_warning
            .map_or(true, |t| now.duration_since(t) >= Duration::from_secs(10))
        {
            self.last_warning = Some(now);
            warn!("{msg}");
        }
    }
}

impl Conns {
    /// Registers a new connection, first closing the oldest idle one at the cap. None
    /// (refuse the newcomer) only when every open connection is answering a request.
    fn open(&self, cap: usize) -> Option<ConnGuard> {
        let mut t = lock(&self.table);
        if t.open.len() >= cap {
            if !t.evict_oldest_idle() {
                t.warn_throttled(
                    "connection limit reached and every connection is busy; refusing a new one",
                );
                return None;
            }
            t.warn_throttled(&format!(
                "connection limit ({cap}) reached; closing the oldest idle connections for new ones"
            ));
        }
        let id = t.next_id;
        t.next_id += 1;
        let state = Arc::new(ConnState::default());
        t.open.insert(id, Arc::clone(&state));
        Some(ConnGuard {
            table: Arc::clone(&self.table),
            id,
            state,
        })
    }

    fn evict_oldest_idle(&self) {
        lock(&self.table).evict_oldest_idle();
    }

    fn warn_throttled(&self, msg: &str) {
        lock(&self.table).warn_throttled(msg);
    }

    fn is_empty(&self) -> bool {
        lock(&self.table).open.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<WebConfig, String> {
        WebConfig::parse(yaml, Path::new("/nonexistent"))
    }

    fn err(yaml: &str) -> String {
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
        .unwrap();
        assert!(e.contains("/etc/stallwatch-test-dir/sub/c.pem"), "{e}");
        let e = WebConfig::parse(
            "tls_server_config:\n  cert_file: /abs/c.pem\n  key_file: k.pem\n",
            Path::new("/etc/x"),
        )
        .err()
        .unwrap();
        assert!(e.contains("/abs/c.pem"), "{e}");
    }

    #[test]
    fn bad_tls_options_are_refused() {
        assert!(versions(Some("TLS14"), None).unwrap_err().contains("TLS14"));
        assert!(versions(Some("TLS13"), Some("TLS12")).is_err());
        assert!(versions(None, Some("TLS11")).is_err());
        assert_eq!(versions(Some("TLS10"), None).unwrap().len(), 2);
        assert_eq!(versions(Some("TLS13"), None).unwrap().len(), 1);
        let p = rustls::crypto::ring::default_provider();
        assert!(cipher_suites(&["TLS_FOO".into()], &p.cipher_suites)
            .unwrap_err()
            .contains("unknown cipher"));
        assert!(
            cipher_suites(&["TLS_RSA_WITH_AES_128_CBC_SHA".into()], &p.cipher_suites)
                .unwrap_err()
                .contains("none of")
        );
        let s = cipher_suites(
            &["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".into()],
            &p.cipher_suites,
        )
        .unwrap();
        assert_eq!(
            s.iter()
                .filter(|s| s.version() == &rustls::version::TLS12)
                .count(),
            1
        );
        assert!(curves(&["CurveP999".into()], &p.kx_groups).is_err());
        assert_eq!(
            curves(&["X25519".into(), "CurveP521".into()], &p.kx_groups)
                .unwrap()
                .len(),
            1
        );
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
    fn bcrypt_hashes_are_checked_at_load() {
        let h = bcrypt::hash("pw", 4).unwrap();
        let c = parse(&format!("basic_auth_users:\n  alice: {h}\n")).unwrap();
        assert!(c.auth_enabled());
        assert!(err("basic_auth_users:\n  alice: plaintext\n").contains("alice"));
        assert!(err("basic_auth_users:\n  alice: $2y$99$abcdefghijklmnopqrstuuabcdefghijklmnopqrstuvwxyz01234\n").contains("cost"));
    }

    #[test]
    fn basic_credentials_parse() {
        let mut h = HeaderMap::new();
        assert!(basic_credentials(&h).is_none());
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bAsIc YWxpY2U6cDpx"),
        );
        assert_eq!(
            basic_credentials(&h),
            Some(("alice".into(), b"p:q".to_vec()))
        );
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer YWxpY2U6cDpx"),
        );
        assert!(basic_credentials(&h).is_none());
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic !!!"));
        assert!(basic_credentials(&h).is_none());
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic YWxpY2U="),
        );
        assert!(basic_credentials(&h).is_none(), "no colon");
    }

    fn auth_header(user: &str, pass: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        let v = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
        h.insert(header::AUTHORIZATION, format!("Basic {v}").parse().unwrap());
        h
    }

    #[test]
    fn auth_checks_and_caches_only_successes() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut users = BTreeMap::new();
        users.insert("alice".to_string(), bcrypt::hash("secret", 4).unwrap());
        let a = Arc::new(BasicAuth::new(users).unwrap());
        rt.block_on(async {
            assert!(!a.check(&HeaderMap::new()).await);
            assert!(!a.check(&auth_header("alice", "wrong")).await);
            assert!(!a.check(&auth_header("bob", "secret")).await);
            assert!(lock(&a.verified).is_empty());
            assert!(a.check(&auth_header("alice", "secret")).await);
            assert_eq!(lock(&a.verified).len(), 1);
            assert!(a.check(&auth_header("alice", "secret")).await);
            assert!(!a.check(&auth_header("alice", &"x".repeat(80))).await);
        });
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

    #[test]
    fn at_the_cap_the_oldest_idle_connection_makes_room() {
        let conns = Conns::default();
        let a = conns.open(2).unwrap();
        let b = conns.open(2).unwrap();
        let _busy = Busy::new(Arc::clone(&a.state));
        let c = conns.open(2).unwrap();
        // `a` is busy, so `b` (the oldest idle) went.
        let open: Vec<u64> = lock(&conns.table).open.keys().copied().collect();
        assert_eq!(open, vec![a.id, c.id]);
        let _busy_c = Busy::new(Arc::clone(&c.state));
        assert!(conns.open(2).is_none(), "all busy: the newcomer is refused");
        drop(b);
        drop((a, c));
        assert!(conns.is_empty());
    }
}
