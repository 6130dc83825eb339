//! The HTTP side: `/metrics`, `/healthz`, `/` (the live page and its `/assets/`),
//! `/api/stalls`, `/api/stalls/{id}`, `/api/history`, `/stalls`, `/stalls/{id}`,
//! `/-/reload`. Every handler reads the latest cached state only; nothing here waits on a
//! probe.
//!
//! `router` maps paths to handlers, `state` is what they read, `page` the landing page
//! (its markup is `assets/page.html`), `stall_page` the stall list and the page of one
//! stall (`assets/stall*.html`), `assets` the embedded files, `api` the `/api/history`
//! body, written by `json`; `server` is the server around them (TLS, auth, limits, the
//! accept loop).

mod api;
mod assets;
mod json;
mod page;
mod router;
pub mod server;
mod stall_page;
mod state;

pub use api::{history_json, overview_json};
pub use router::app;
pub use state::{App, ReloadFn, StallsJson};
