//! Why a web config's TLS section is refused: one error for `tls`, `pem` and
//! `client_cert`, so that none of them imports another for it.

use std::path::PathBuf;

use rustls::pki_types::pem;

/// A `tls_server_config` that cannot be served, or a certificate pair that cannot be
/// read. The texts name the key as the exporter-toolkit does.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("tls_server_config: missing one of cert or cert_file")]
    MissingCert,
    #[error("tls_server_config: missing one of key or key_file")]
    MissingKey,
    #[error("tls_server_config.cipher_suites: unknown cipher: {0}")]
    UnknownCipher(String),
    #[error(
        "tls_server_config.cipher_suites: none of {0:?} is available here; \
         use ECDHE suites with AES-GCM or ChaCha20-Poly1305"
    )]
    NoCipher(Vec<String>),
    #[error("tls_server_config.curve_preferences: unknown curve: {0}")]
    UnknownCurve(String),
    #[error(
        "tls_server_config.curve_preferences: none of {0:?} is available here; \
         use X25519, CurveP256 or CurveP384"
    )]
    NoCurve(Vec<String>),
    #[error("tls_server_config.{key}: unknown TLS version: {version}")]
    UnknownVersion { key: &'static str, version: String },
    #[error("tls_server_config.max_version: below TLS12, which is the least this server speaks")]
    MaxBelowTls12,
    #[error("tls_server_config: min_version is above max_version")]
    MinAboveMax,
    /// rustls refused the protocol versions.
    #[error("tls_server_config: {0}")]
    Versions(rustls::Error),
    /// `what` is the key that names the file (`cert_file`, `key_file`, `client_ca_file`).
    #[error("{what} {}: {error}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("tls_server_config: certificate: {0:?}")]
    Certificate(pem::Error),
    #[error("tls_server_config: no PEM certificate in cert or cert_file")]
    NoCertificate,
    #[error("tls_server_config: private key: {0:?}")]
    PrivateKey(pem::Error),
    #[error("tls_server_config: certificate and key: {0}")]
    CertifiedKey(rustls::Error),
    #[error("tls_server_config: client CA: {0:?}")]
    ClientCa(pem::Error),
    #[error("tls_server_config: no usable CA certificate in client_ca or client_ca_file")]
    NoClientCa,
    #[error("tls_server_config: client_auth_type {0} needs client_ca_file or client_ca")]
    ClientCaNeeded(String),
    #[error("tls_server_config: client CA: {0}")]
    ClientVerifier(rustls::server::VerifierBuilderError),
    /// `expected` lists the accepted names, comma-separated.
    #[error("tls_server_config.client_auth_type: invalid {name:?}; one of {expected}")]
    ClientAuthType { name: String, expected: String },
    #[error("tls_server_config: client CA's have been configured without a client_auth_type")]
    CaWithoutAuthType,
    #[error(
        "tls_server_config: client_allowed_sans requires client_auth_type \
         RequireAnyClientCert or RequireAndVerifyClientCert"
    )]
    SansNeedCertificate,
    #[error(
        "tls_server_config.client_allowed_sans: {0:?}: e-mail SANs are not supported; \
         use DNS names, IP addresses or URIs"
    )]
    EmailSan(String),
}
