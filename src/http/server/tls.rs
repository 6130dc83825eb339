//! TLS for the web server: the exporter-toolkit's `tls_server_config` in rustls terms
//! (cipher suites, curves, versions by their Go names) and the served certificate, re-read
//! from its files by a background thread when they change.

use std::path::Path;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tracing::{info, warn};

use super::client_cert;
use super::file::TlsFile;
use super::pem::Pem;
use super::tls_error::TlsError;
use crate::base::sync::lock;

/// How often the certificate files are checked for a change: a replaced certificate is
/// served within this long, without a restart.
const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// The TLS side of a web config: the rustls configuration and the certificate it serves.
pub(super) struct Tls {
    pub config: Arc<rustls::ServerConfig>,
    certs: Arc<CertResolver>,
}

impl Tls {
    /// Starts checking the certificate files for a change once a second, for as long as
    /// the returned guard lives; None when there is nothing to watch (inline PEM).
    pub fn watch_certificates(&self) -> Option<CertWatch> {
        if !self.certs.cert.is_file() && !self.certs.key.is_file() {
            return None;
        }
        let (stop, stopped) = mpsc::channel::<()>();
        let certs = Arc::clone(&self.certs);
        let spawned = std::thread::Builder::new()
            .name("tls-reload".into())
            .spawn(move || {
                // Dropping the guard drops the sender: the wait ends at once, and so the thread.
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(RELOAD_CHECK) {
                    certs.reload_if_changed();
                }
            });
        match spawned {
            Ok(_) => Some(CertWatch { _stop: stop }),
            Err(e) => {
                warn!(error = %e, "cannot start the TLS certificate reload thread; the certificate will not be reloaded");
                None
            }
        }
    }
}

/// Keeps the certificate reload thread running. The thread is not joined on drop: it
/// may be inside a read of a certificate on a stalled filesystem, and the server must
/// not wait for that; it ends as soon as that read returns.
pub(super) struct CertWatch {
    _stop: mpsc::Sender<()>,
}

/// The rustls server configuration for `t`; None when the section sets nothing.
pub(super) fn server_config(t: TlsFile, dir: &Path) -> Result<Option<Tls>, TlsError> {
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
    let cert = Pem::pick(&t.cert_file, &t.cert, dir).ok_or(TlsError::MissingCert)?;
    let key = Pem::pick(&t.key_file, &t.key, dir).ok_or(TlsError::MissingKey)?;

    let mut provider = rustls::crypto::ring::default_provider();
    if !t.cipher_suites.is_empty() {
        provider.cipher_suites = cipher_suites(&t.cipher_suites, &provider.cipher_suites)?;
    }
    if !t.curve_preferences.is_empty() {
        provider.kx_groups = curves(&t.curve_preferences, &provider.kx_groups)?;
    }
    let provider = Arc::new(provider);
    let versions = versions(t.min_version.as_deref(), t.max_version.as_deref())?;

    let certs = Arc::new(CertResolver::new(cert, key, Arc::clone(&provider))?);
    let client_ca = match Pem::pick(&t.client_ca_file, &t.client_ca, dir) {
        Some(ca) => Some(client_cert::roots(&ca)?),
        None => None,
    };
    let verifier = client_cert::verifier(
        &t.client_auth_type,
        client_ca,
        t.client_allowed_sans.as_deref(),
        &provider,
    )?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .map_err(TlsError::Versions)?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::clone(&certs) as Arc<dyn ResolvesServerCert>);
    // The toolkit's default: the server's cipher order wins.
    cfg.ignore_client_order = t.prefer_server_cipher_suites.unwrap_or(true);
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(Tls {
        config: Arc::new(cfg),
        certs,
    }))
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
) -> Result<Vec<rustls::SupportedCipherSuite>, TlsError> {
    let mut tls12 = Vec::new();
    for n in names {
        if !GO_CIPHER_SUITES.contains(&n.as_str()) {
            return Err(TlsError::UnknownCipher(n.clone()));
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
        return Err(TlsError::NoCipher(names.to_vec()));
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
) -> Result<Vec<&'static dyn rustls::crypto::SupportedKxGroup>, TlsError> {
    use rustls::NamedGroup;
    let mut out = Vec::new();
    for n in names {
        let group = match n.as_str() {
            "CurveP256" => NamedGroup::secp256r1,
            "CurveP384" => NamedGroup::secp384r1,
            "CurveP521" => NamedGroup::secp521r1,
            "X25519" => NamedGroup::X25519,
            _ => return Err(TlsError::UnknownCurve(n.clone())),
        };
        if let Some(g) = all.iter().find(|g| g.name() == group) {
            out.push(*g);
        }
    }
    if out.is_empty() {
        return Err(TlsError::NoCurve(names.to_vec()));
    }
    Ok(out)
}

/// rustls speaks TLS 1.2 and 1.3 only: a minimum of TLS10 or TLS11 means TLS12 here.
fn versions(
    min: Option<&str>,
    max: Option<&str>,
) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, TlsError> {
    let rank = |v: Option<&str>, default: u8, key: &'static str| -> Result<u8, TlsError> {
        match v {
            None => Ok(default),
            Some("TLS10") => Ok(10),
            Some("TLS11") => Ok(11),
            Some("TLS12") => Ok(12),
            Some("TLS13") => Ok(13),
            Some(other) => Err(TlsError::UnknownVersion {
                key,
                version: other.to_owned(),
            }),
        }
    };
    let lo = rank(min, 12, "min_version")?;
    let hi = rank(max, 13, "max_version")?;
    if hi < 12 {
        return Err(TlsError::MaxBelowTls12);
    }
    if lo > hi {
        return Err(TlsError::MinAboveMax);
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
) -> Result<CertifiedKey, TlsError> {
    let cert_pem = cert.read("cert_file")?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(TlsError::Certificate)?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    let key_pem = key.read("key_file")?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(TlsError::PrivateKey)?;
    CertifiedKey::from_der(chain, key, provider).map_err(TlsError::CertifiedKey)
}

/// Modification times of the certificate and key files when they were last read.
type Stamp = (Option<SystemTime>, Option<SystemTime>);

/// Serves the current certificate. The handshake only clones it: the files are checked
/// and read by the reload thread ([`Tls::watch_certificates`]), never on the runtime.
#[derive(Debug)]
struct CertResolver {
    cert: Pem,
    key: Pem,
    provider: Arc<CryptoProvider>,
    current: Mutex<Arc<CertifiedKey>>,
    stamp: Mutex<Stamp>,
}

impl CertResolver {
    fn new(cert: Pem, key: Pem, provider: Arc<CryptoProvider>) -> Result<CertResolver, TlsError> {
        let stamp = (cert.modified(), key.modified());
        let current = Arc::new(load_certified_key(&cert, &key, &provider)?);
        Ok(CertResolver {
            cert,
            key,
            provider,
            current: Mutex::new(current),
            stamp: Mutex::new(stamp),
        })
    }

    /// Re-reads the pair when either file's modification time changed. A broken new pair
    /// is logged and the old one kept; it is not retried until a file changes again.
    fn reload_if_changed(&self) {
        let stamp = (self.cert.modified(), self.key.modified());
        {
            let mut seen = lock(&self.stamp);
            if stamp == *seen {
                return;
            }
            *seen = stamp;
        }
        match load_certified_key(&self.cert, &self.key, &self.provider) {
            Ok(k) => {
                info!("TLS certificate reloaded");
                *lock(&self.current) = Arc::new(k);
            }
            Err(e) => {
                warn!(error = %e, "TLS certificate changed but cannot be loaded; keeping the previous one")
            }
        }
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&lock(&self.current)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_tls_options_are_refused() {
        assert!(versions(Some("TLS14"), None)
            .unwrap_err()
            .to_string()
            .contains("TLS14"));
        assert!(versions(Some("TLS13"), Some("TLS12")).is_err());
        assert!(versions(None, Some("TLS11")).is_err());
        assert_eq!(versions(Some("TLS10"), None).unwrap().len(), 2);
        assert_eq!(versions(Some("TLS13"), None).unwrap().len(), 1);
        let p = rustls::crypto::ring::default_provider();
        assert!(cipher_suites(&["TLS_FOO".into()], &p.cipher_suites)
            .unwrap_err()
            .to_string()
            .contains("unknown cipher"));
        assert!(
            cipher_suites(&["TLS_RSA_WITH_AES_128_CBC_SHA".into()], &p.cipher_suites)
                .unwrap_err()
                .to_string()
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
}
