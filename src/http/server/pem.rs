//! Where a certificate or key comes from: a file or inline text, as the web
//! configuration names it; shared by `tls` and `client_cert`.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::tls_error::TlsError;

/// Where a certificate or key comes from: a file is re-read when it changes (certificate
/// rotation without a restart, as the toolkit does), inline text never changes.
#[derive(Debug, Clone)]
pub(super) enum Pem {
    File(PathBuf),
    Inline(String),
}

impl Pem {
    pub(super) fn pick(file: &str, inline: &str, dir: &Path) -> Option<Pem> {
        if !file.is_empty() {
            Some(Pem::File(dir.join(file)))
        } else if !inline.is_empty() {
            Some(Pem::Inline(inline.to_owned()))
        } else {
            None
        }
    }

    pub(super) fn read(&self, what: &'static str) -> Result<Vec<u8>, TlsError> {
        match self {
            Pem::File(p) => std::fs::read(p).map_err(|error| TlsError::Read {
                what,
                path: p.clone(),
                error,
            }),
            Pem::Inline(s) => Ok(s.as_bytes().to_vec()),
        }
    }

    pub(super) fn modified(&self) -> Option<SystemTime> {
        match self {
            Pem::File(p) => std::fs::metadata(p).and_then(|m| m.modified()).ok(),
            Pem::Inline(_) => None,
        }
    }

    pub(super) fn is_file(&self) -> bool {
        matches!(self, Pem::File(_))
    }
}
