//! Probe lanes: one OS thread per (target, mode), each with its own schedule, in-flight
//! slot, skips and outcome, sharing the target's mount check; the target's state is
//! folded from its lanes. This module owns the probe metric families (`metrics.rs` here)
//! and fills them; nothing else writes them.
//!
//! A call blocked in the kernel blocks only its own lane: the other lanes of the target
//! keep probing, so "only fsync is stuck" and "everything on this filesystem is stuck"
//! read differently. Everything other threads need from a lane is in atomics or behind
//! short-held locks that are never held across a system call on the probed filesystem.
//!
//! `target` holds what other threads share with a target's lanes, `worker` is a lane's
//! thread, `pending` the calls a lane has timed and not yet recorded, `ops` the system
//! calls of each mode, `metrics` and `scrape` the probe metric families, `supervisor`
//! the running targets and reloads, `devices` the target → device registry, `watchdog`
//! the thread that watches the lanes' in-flight slots.

pub mod devices;
mod metrics;
pub mod ops;
mod pending;
mod scrape;
pub mod supervisor;
mod target;
pub mod watchdog;
mod worker;

pub use metrics::{ProbeMetrics, SkipReason, BUCKETS};
pub use ops::probe_dir_of;
pub use scrape::register_inflight;
pub use target::{Context, Lane, State, Status, TargetShared, Targets};
pub use worker::Worker;
