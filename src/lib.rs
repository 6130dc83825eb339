//! stallwatch: synthetic storage probes, kernel writeback state and a stall log, served for Prometheus.

pub mod agent;
pub mod blockdev;
pub mod config;
pub mod http;
pub mod kernfs;
pub mod metrics;
pub mod mounts;
pub mod probe;
pub mod probe_cli;
pub mod stalls;
pub mod vm;
pub mod web;
