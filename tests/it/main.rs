//! The integration tests: one binary, one module per area (as ripgrep's
//! `tests/tests.rs`), the harness in [`support`]. One binary links once; 21 did it 21
//! times.
//!
//! `cargo test --test it` runs them all; `cargo test --test it stalls::` one area.
//! Tests of different areas now run at the same time: those that must not share the
//! machine take [`support::machine`]'s lock. Root tests need root, or
//! `STALLWATCH_SKIP_ROOT_TESTS=1` to skip them loudly (see [`support::root`]).

mod support;

mod agent;
mod alerting;
mod architecture;
mod config_cli;
mod deploy;
mod diagnosis;
mod evidence;
mod exposition;
mod faults;
mod fleet;
mod fuzz;
mod golden;
mod harness_selftest;
mod lanes;
mod matrix;
mod mixin;
mod page;
mod precision;
mod probe_cli;
mod reload;
mod resident;
mod socket_activation;
mod stalls;
mod storage;
mod systemd;
mod web;
