//! One lock for the machine, now that every area's tests share one process and may run
//! at the same time (libtest runs as many tests at once as there are cores).
//!
//! * [`exclusive`]: a test that changes kernel state every process sees (drop_caches,
//!   cgroups, blkio throttles read back as device-wide figures), loads the machine for
//!   minutes (a release build, a booted systemd, twenty agents), or measures what such
//!   load would distort. No [`shared`] test runs beside it.
//! * [`shared`]: a test that makes stalls on its own loop devices or asserts on
//!   durations, cycle counts or latencies. Any number of them run together, as the tests
//!   of one file always did, but never beside an [`exclusive`] one.
//!
//! Tests that take neither (parsers, files, refusals) run beside anything. Take the guard
//! first thing in the test (after the root gate) and hold it to the end; never take it
//! twice in one test (a waiting `exclusive` would block the second `shared` for good).
//! A test that panics while holding the guard poisons the lock; the next taker goes on
//! regardless (the guard protects no data, only the machine's quiet).

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

static MACHINE: RwLock<()> = RwLock::new(());

/// Held by a test that must not share the machine with [`shared`] tests.
pub fn exclusive() -> RwLockWriteGuard<'static, ()> {
    MACHINE.write().unwrap_or_else(PoisonError::into_inner)
}

/// Held by a test that may run beside other [`shared`] tests, not beside an
/// [`exclusive`] one.
pub fn shared() -> RwLockReadGuard<'static, ()> {
    MACHINE.read().unwrap_or_else(PoisonError::into_inner)
}
