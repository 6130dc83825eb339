//! The evidence worker: a thread that sleeps until a stall starts, then reads who is
//! dirtying, what the devices do and the journal (`evidence/`) at the crossing, at
//! most once a second while any stall lasts and once after each one ends, and writes
//! each stall's view into its event. With no stall ongoing it reads nothing.
//!
//! It sleeps on its own wake-up (`wake.rs`), which the stall log notifies. It runs on
//! no probe lane and never holds the stall log's lock while reading, so the
//! watchdog's crossings and the probe threads' returns wait on it for a copy at most;
//! it reads only cgroupfs, sysfs and procfs, never the probed filesystems.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::kernel::cgroups::Hierarchies;
use crate::kernel::kernfs::Roots;
use crate::stall::event::EventId;
use crate::stall::evidence::{self, Window};
use crate::stall::log::StallLog;
use crate::stall::wake::Wake;

/// The pause between two readings while a stall lasts.
pub const PERIOD: Duration = Duration::from_secs(1);

/// The shortest pause between two readings, when stalls start or end in a burst.
pub const MIN_GAP: Duration = Duration::from_millis(100);

/// Runs until `wake` is closed (shutdown). The stall log notifies `wake` when a stall
/// starts or ends.
pub fn run(stalls: Arc<StallLog>, wake: Arc<Wake>, roots: Roots) {
    let mut windows: HashMap<EventId, Window> = HashMap::new();
    let mut seen = 0;
    let mut hierarchies = Hierarchies::default();
    loop {
        let ongoing = stalls.ongoing_scopes();
        if ongoing.is_empty() && windows.is_empty() {
            match wake.wait(seen, None) {
                Some(change) => seen = change,
                None => return,
            }
            continue;
        }
        if windows.is_empty() {
            // A stall after a quiet time: cgroupfs may have been mounted meanwhile.
            hierarchies = Hierarchies::find(&roots.sys_root);
        }
        for (id, scope) in &ongoing {
            windows
                .entry(*id)
                .or_insert_with(|| Window::new(scope.clone()));
        }
        let started = Instant::now();
        let scopes: Vec<_> = windows.values().map(Window::scope).collect();
        let reading = evidence::read(&roots, &hierarchies, &scopes);
        for (id, w) in windows.iter_mut() {
            w.fold(&reading);
            // A window no longer ongoing has just had the reading after its end.
            let last = !ongoing.iter().any(|(i, _)| i == id);
            stalls.set_evidence(*id, w.evidence(&roots.proc_root), last);
        }
        windows.retain(|id, _| ongoing.iter().any(|(i, _)| i == id));
        if windows.is_empty() {
            continue;
        }
        match wake.wait(seen, Some(started + PERIOD)) {
            Some(change) => seen = change,
            None => return,
        }
        let gap = started + MIN_GAP;
        if let Some(rest) = gap.checked_duration_since(Instant::now()) {
            std::thread::sleep(rest);
        }
    }
}
