//! Client certificates: `client_auth_type` in rustls terms, the client CA, and the two
//! verifiers rustls does not have: Go's "any certificate" modes and `client_allowed_sans`.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use strum::VariantArray as _;

use super::pem::Pem;
use super::tls_error::TlsError;

/// The CA certificates client certificates are verified against.
pub(super) fn roots(ca: &Pem) -> Result<Arc<RootCertStore>, TlsError> {
    let pem = ca.read("client_ca_file")?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(TlsError::ClientCa)?;
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(TlsError::NoClientCa);
    }
    Ok(Arc::new(roots))
}

/// `client_auth_type`: Go's `tls.ClientAuthType` names; empty means `NoClientCert`.
#[derive(Debug, Clone, Copy, strum::EnumString, strum::IntoStaticStr, strum::VariantArray)]
enum ClientAuthType {
    NoClientCert,
    RequestClientCert,
    /// Go's `RequireAnyClientCert`; `RequireClientCert` is accepted for it as well.
    #[strum(to_string = "RequireAnyClientCert", serialize = "RequireClientCert")]
    RequireAnyClientCert,
    VerifyClientCertIfGiven,
    RequireAndVerifyClientCert,
}

impl ClientAuthType {
    fn as_str(self) -> &'static str {
        self.into()
    }
}

/// The verifier for `client_auth_type` (Go's `tls.ClientAuthType` names), wrapped in the
/// SAN check when `client_allowed_sans` is set.
pub(super) fn verifier(
    auth_type: &str,
    roots: Option<Arc<RootCertStore>>,
    allowed_sans: Option<&[String]>,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let verified = |optional: bool| -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
        let roots = roots
            .clone()
            .ok_or_else(|| TlsError::ClientCaNeeded(auth_type.to_owned()))?;
        let b = WebPkiClientVerifier::builder_with_provider(roots, Arc::clone(provider));
        let b = if optional {
            b.allow_unauthenticated()
        } else {
            b
        };
        b.build().map_err(TlsError::ClientVerifier)
    };
    let any = |mandatory: bool| -> Arc<dyn ClientCertVerifier> {
        Arc::new(AnyClientCert {
            mandatory,
            provider: Arc::clone(provider),
        })
    };
    let parsed = match auth_type {
        "" => ClientAuthType::NoClientCert,
        name => name.parse().map_err(|_| {
            let names: Vec<&str> = ClientAuthType::VARIANTS
                .iter()
                .map(|t| t.as_str())
                .collect();
            TlsError::ClientAuthType {
                name: name.to_owned(),
                expected: names.join(", "),
            }
        })?,
    };
    let (verifier, mandatory) = match parsed {
        ClientAuthType::NoClientCert => {
            if roots.is_some() {
                return Err(TlsError::CaWithoutAuthType);
            }
            (WebPkiClientVerifier::no_client_auth(), false)
        }
        ClientAuthType::RequestClientCert => (any(false), false),
        ClientAuthType::RequireAnyClientCert => (any(true), true),
        ClientAuthType::VerifyClientCertIfGiven => (verified(true)?, false),
        ClientAuthType::RequireAndVerifyClientCert => (verified(false)?, true),
    };
    let Some(sans) = allowed_sans else {
        return Ok(verifier);
    };
    if !mandatory {
        return Err(TlsError::SansNeedCertificate);
    }
    for s in sans {
        if s.contains('@') && !s.contains(':') {
            return Err(TlsError::EmailSan(s.clone()));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_auth_types_go_by_their_go_names() {
        let p = Arc::new(rustls::crypto::ring::default_provider());
        for (name, mandatory) in [
            ("", false),
            ("NoClientCert", false),
            ("RequestClientCert", false),
            ("RequireAnyClientCert", true),
            ("RequireClientCert", true),
        ] {
            let v = verifier(name, None, None, &p).unwrap();
            assert_eq!(v.client_auth_mandatory(), mandatory, "{name:?}");
        }
        assert_eq!(
            verifier("requireanyclientcert", None, None, &p)
                .unwrap_err()
                .to_string(),
            "tls_server_config.client_auth_type: invalid \"requireanyclientcert\"; one of \
             NoClientCert, RequestClientCert, RequireAnyClientCert, VerifyClientCertIfGiven, \
             RequireAndVerifyClientCert"
        );
        assert!(verifier("VerifyClientCertIfGiven", None, None, &p)
            .unwrap_err()
            .to_string()
            .contains("VerifyClientCertIfGiven needs client_ca_file"));
    }
}
