//! stallwatch: synthetic storage probes, kernel writeback state and a stall log, served for Prometheus.
//!
//! The module graph runs one way (see ARCHITECTURE.md): leaf types and kernel readers
//! (`sync`, `config`, `op`, `inflight`, `kernfs`, `host`, `mounts`, `vm`, `blockdev`,
//! `resident`, `causes`, `waits`, `verdict`, `history`, `cgroups`, `devstat`, `jbd2`,
//! `procio`, `evidence`) → the workers (`probe`, `stalls`, `watchdog`, `sampler`,
//! `evidence_worker`) → the serving side (`metrics`, `routes`,
//! `web`) → `agent` and `probe_cli` → `main`.

pub mod agent;
pub mod blockdev;
pub mod causes;
pub mod cgroups;
pub mod config;
pub mod devstat;
pub mod evidence;
pub mod evidence_worker;
pub mod family;
pub mod history;
pub mod host;
pub mod inflight;
pub mod jbd2;
pub mod kernfs;
pub mod metrics;
pub mod mounts;
pub mod op;
pub mod probe;
pub mod probe_cli;
pub mod procio;
pub mod reload;
pub mod resident;
pub mod routes;
pub mod sampler;
pub mod stalls;
pub mod supervisor;
pub mod sync;
pub mod verdict;
pub mod vm;
pub mod waits;
pub mod watchdog;
pub mod web;
