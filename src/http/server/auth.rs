//! Basic authentication (`basic_auth_users`): bcrypt hashes checked off the runtime
//! thread, one at a time, with verified credentials remembered so that a scrape every
//! few seconds does not pay a bcrypt each time.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use axum::http::header::{self, HeaderMap};
use base64::Engine as _;

use crate::base::sync::lock;

/// Successful verifications remembered; each costs a bcrypt (tens of milliseconds by
/// design), which a scrape every few seconds should not pay each time.
const AUTH_CACHE_SIZE: usize = 128;

/// bcrypt reads at most 72 bytes of a password; like Go, longer ones are refused rather
/// than silently truncated.
const BCRYPT_MAX_PASSWORD: usize = 72;

/// A `basic_auth_users` entry that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("basic_auth_users: {user}: not a bcrypt hash ({error})")]
    NotBcrypt {
        user: String,
        error: bcrypt::BcryptError,
    },
    #[error("basic_auth_users: {user}: bcrypt cost {cost} outside 4..31")]
    Cost { user: String, cost: u32 },
    /// The hash for unknown users could not be made.
    #[error("basic_auth_users: {0}")]
    Decoy(bcrypt::BcryptError),
}

/// The configured users and what has been verified for them.
pub(super) struct BasicAuth {
    users: HashMap<String, String>,
    /// Checked for unknown users, so that their answer takes as long as a known one's.
    decoy_hash: String,
    /// SHA-256 of user, hash and password of verified credentials; never the password.
    verified: Mutex<HashSet<[u8; 32]>>,
    /// One bcrypt at a time: a burst of wrong passwords costs one core, not all.
    bcrypt: Mutex<()>,
}

impl BasicAuth {
    pub fn new(users: BTreeMap<String, String>) -> Result<BasicAuth, AuthError> {
        let mut max_cost = 4;
        for (user, hash) in &users {
            let parts: bcrypt::HashParts = hash.parse().map_err(|error| AuthError::NotBcrypt {
                user: user.clone(),
                error,
            })?;
            let cost = parts.get_cost();
            if !(4..=31).contains(&cost) {
                return Err(AuthError::Cost {
                    user: user.clone(),
                    cost,
                });
            }
            max_cost = max_cost.max(cost);
        }
        let decoy_hash =
            bcrypt::hash(b"stallwatch decoy password", max_cost).map_err(AuthError::Decoy)?;
        Ok(BasicAuth {
            users: users.into_iter().collect(),
            decoy_hash,
            verified: Mutex::new(HashSet::new()),
            bcrypt: Mutex::new(()),
        })
    }

    /// True when the request carries the credentials of a configured user.
    pub async fn check(self: &Arc<Self>, headers: &HeaderMap) -> bool {
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

#[cfg(test)]
mod tests {
    use super::super::config::tests::{err, parse};
    use super::*;
    use axum::http::header::HeaderValue;

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
}
