//! The HTTP server: `--web.config.file` (the Prometheus exporter-toolkit format: TLS,
//! basic auth, extra headers, rate limit) and our own accept loop, which bounds what a
//! client can hold: header size and read time, idle keep-alive, requests in flight,
//! open connections. A scrape from a well-behaved client must get through while
//! hundreds of idle or half-sent connections are open.
//!
//! `activation` takes the sockets systemd passes (`--web.systemd-socket`); `file` is the
//! file as written and `config` reads it into a ready `WebConfig`; `tls`, `pem` and
//! `client_cert` turn its TLS section into rustls terms (`tls_error` says why one is
//! refused); `auth` checks passwords;
//! `limits` holds what one client may hold; `reply` is the server's own plain answers;
//! `accept` runs the accept loop and each connection.

mod accept;
mod activation;
mod auth;
mod client_cert;
mod config;
mod file;
mod limits;
mod pem;
mod reply;
mod tls;
mod tls_error;

pub use accept::serve;
pub use activation::{systemd_listeners, ActivationError};
pub use auth::AuthError;
pub use config::{Invalid, WebConfig, WebConfigError};
pub use limits::{Limits, DEFAULT_MAX_REQUESTS};
pub use tls_error::TlsError;
