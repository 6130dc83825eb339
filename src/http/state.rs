//! What the handlers read: the agent's state as the router is given it.

use std::sync::{Arc, Mutex};

use crate::exposition::registry::Registry;
use crate::history::History;
use crate::probe::supervisor::Changes;
use crate::probe::Targets;
use crate::sampler::Latest;
use crate::stall::log::StallLog;

/// Re-reads the configuration: what changed, or why it was refused (the agent's
/// `agent::reload::ReloadError`, which this layer below the agent only prints). Blocking.
pub type ReloadFn =
    Arc<dyn Fn() -> Result<Changes, Box<dyn std::error::Error + Send + Sync>> + Send + Sync>;

/// What the handlers read.
pub struct App {
    pub registry: Registry,
    pub stalls: Arc<StallLog>,
    pub targets: Arc<Targets>,
    /// The last hour of latencies and kernel samples, for the live page.
    pub history: Arc<History>,
    /// The sampler's latest kernel sample, for the landing page.
    pub latest: Arc<Latest>,
    pub telemetry_path: String,
    /// `--web.enable-lifecycle`: what `POST /-/reload` calls; None when off.
    pub reload: Option<ReloadFn>,
    /// The stall events as `/api/history` last serialized them.
    pub stalls_json: Mutex<Option<StallsJson>>,
}

/// The stall events serialized once per change of the log (while none is ongoing, as
/// an ongoing one changes as it lasts): a first load then copies bytes instead of
/// cloning and serializing up to 256 events with their context.
pub struct StallsJson {
    pub(super) version: u64,
    pub(super) json: Vec<u8>,
    /// Each event's end (Unix seconds) and its bytes in `json`, newest first.
    pub(super) events: Vec<(f64, std::ops::Range<usize>)>,
}
