//! The shared test harness, one module per concern. What a crate does is left to the
//! crate: HTTP to `ureq`, the mount table to `procfs`, the text exposition to
//! `nom-openmetrics`.
//!
//! * [`root`]: the gate of tests that need root; never lets them pass silently.
//! * [`machine`]: the lock that keeps heavy or kernel-wide tests apart from the tests
//!   that measure stalls and timings.
//! * [`loopfs`]: a scratch filesystem on a loop device inside a temporary directory, with
//!   freeze / throttle / shutdown / read-only / unmount / fill helpers and a `Drop` that
//!   undoes all of it (thaw, unthrottle, umount, `losetup -d`, delete) on every exit
//!   path, panics included.
//! * [`agent`]: the real `stallwatch` binary on a temporary config, its log captured;
//!   [`http`]: the client that talks to it.
//! * [`metrics`]: a parsed Prometheus text exposition with lookups by name and labels.
//! * [`prom`]: a real Prometheus scraping agents, queried over its API; [`vm`]: a real
//!   VictoriaMetrics with vmalert, the second engine behind the same [`prom::Engine`];
//!   [`alertmanager`]: a real Alertmanager and the webhook receiver it notifies.
//! * [`cmd`], [`mounts`], [`wait`], [`writer`]: external commands, the mount table,
//!   bounded polling, and the random writer that fills a device's queue.

pub mod agent;
pub mod alertmanager;
pub mod cmd;
pub mod http;
pub mod loopfs;
pub mod machine;
pub mod metrics;
pub mod mounts;
pub mod prom;
pub mod root;
pub mod tracefs;
pub mod vm;
pub mod wait;
pub mod writer;
