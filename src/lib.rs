//! stallwatch: synthetic storage probes, kernel writeback state and a stall log, served for Prometheus.
//!
//! The modules are layers, each importing only from those below it; ARCHITECTURE.md is
//! the one list of them, their order and who owns what, and `tests/it/architecture.rs`
//! holds the code to it.

pub mod agent;
pub mod base;
pub mod cli;
pub mod config;
pub mod exposition;
pub mod history;
pub mod http;
pub mod kernel;
pub mod probe;
pub mod sampler;
pub mod stall;
