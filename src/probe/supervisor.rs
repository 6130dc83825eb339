//! The targets being probed and their lane threads: started at launch, changed in place
//! by a reload (unchanged targets keep their lanes, histograms and stall log), stopped at
//! shutdown. Nothing here waits on a probe: a lane blocked in the kernel is told to stop
//! and left to finish on its own.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::config::Target;
use crate::probe::{Context, TargetShared, Targets, Worker};

/// How long a reload gives the lanes of a removed target to finish their cycle before
/// their series are removed; a lane blocked longer records nothing when it returns.
const RETIRE_GRACE: Duration = Duration::from_secs(1);

/// A lane's stack: a quarter of a MiB, not std's 2 MiB. A lane makes its system calls and
/// records them; measured through every mode, a full filesystem, a read-only remount, an
/// unmount and a 3 s freeze (`--interval 200ms`), no thread stack had more than 40 KiB
/// touched in a debug build, 16 KiB in a release build (the thread's own bookkeeping at
/// the top included). What this bounds is address space: with the memory lock on, the
/// kernel counts every thread's whole stack against `RLIMIT_MEMLOCK` whether touched or
/// not, so 64 targets' 128 lanes lock 32 MiB instead of 256 MiB, and the unit's
/// `TasksMax=` can allow hundreds of lanes within `LimitMEMLOCK=`. Resident memory is
/// the pages touched, the same either way.
const LANE_STACK: usize = 256 * 1024;

/// A probe lane's thread could not be started. Not a `source`: the message carries the
/// reason, and `main` prints the whole chain.
#[derive(Debug, thiserror::Error)]
#[error("spawning a probe lane: {0}")]
pub struct SpawnError(std::io::Error);

/// What a reload changed, by target name.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
    pub unchanged: usize,
}

impl std::fmt::Display for Changes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |v: &[String]| {
            if v.is_empty() {
                "none".to_owned()
            } else {
                v.join(",")
            }
        };
        write!(
            f,
            "added {}; removed {}; changed {}; {} unchanged",
            list(&self.added),
            list(&self.removed),
            list(&self.changed),
            self.unchanged
        )
    }
}

/// Owns the lane threads of every target, current and retired.
pub struct Supervisor {
    ctx: Arc<Context>,
    targets: Arc<Targets>,
    threads: Vec<(Arc<TargetShared>, usize, JoinHandle<()>)>,
    next_index: usize,
    next_lane: usize,
}

impl Supervisor {
    pub fn new(ctx: Arc<Context>) -> Supervisor {
        Supervisor {
            ctx,
            targets: Arc::new(Targets::default()),
            threads: Vec::new(),
            next_index: 0,
            next_lane: 0,
        }
    }

    /// The set the watchdog, the scrape and the landing page read.
    pub fn targets(&self) -> Arc<Targets> {
        Arc::clone(&self.targets)
    }

    /// Makes `wanted` the probed targets, in that order. A target whose settings are
    /// all the same keeps running untouched; a new one starts; a removed one stops; a
    /// changed one (same name, other settings) is stopped and started anew.
    pub fn apply(&mut self, wanted: &[Target]) -> Result<Changes, SpawnError> {
        let old = self.targets.current();
        let kept = |t: &Target| old.iter().find(|o| o.target == *t).cloned();
        let mut changes = Changes::default();
        // Stopped and their series removed first: a changed target's new series have the
        // same names.
        let gone: Vec<Arc<TargetShared>> = old
            .iter()
            .filter(|o| !wanted.contains(&o.target))
            .cloned()
            .collect();
        for o in &gone {
            if wanted.iter().any(|t| t.name == o.target.name) {
                changes.changed.push(o.target.name.clone());
            } else {
                changes.removed.push(o.target.name.clone());
            }
            o.stop();
        }
        self.retire(&gone);
        let mut next = Vec::with_capacity(wanted.len());
        let mut started = Vec::new();
        for t in wanted {
            match kept(t) {
                Some(o) => {
                    changes.unchanged += 1;
                    next.push(o);
                }
                None => {
                    if !old.is_empty() && !changes.changed.contains(&t.name) {
                        changes.added.push(t.name.clone());
                    }
                    let n = self.create(t.clone());
                    started.push(Arc::clone(&n));
                    next.push(n);
                }
            }
        }
        // Probed from now on: the new targets' series exist before their lanes start.
        self.targets.replace(next);
        for t in &started {
            self.spawn(t)?;
        }
        Ok(changes)
    }

    fn create(&mut self, t: Target) -> Arc<TargetShared> {
        info!(target = %t.name, path = %t.path.display(), interval = ?t.interval,
            modes = ?t.modes.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
            size = t.size, sync = t.sync.as_str(), stall_threshold = ?t.stall_threshold,
            require_mountpoint = t.require_mountpoint, "target configured");
        let shared = TargetShared::new(self.next_index, t, self.next_lane, &self.ctx.metrics);
        self.next_index += 1;
        self.next_lane += shared.lanes.len();
        Arc::new(shared)
    }

    /// One thread per lane: targets x modes, whatever happens to the probed filesystems.
    fn spawn(&mut self, t: &Arc<TargetShared>) -> Result<(), SpawnError> {
        for (i, lane) in t.lanes.iter().enumerate() {
            let worker = Worker::new(Arc::clone(t), i, Arc::clone(&self.ctx));
            // Thread names are cut at 15 bytes: the target's number and the mode.
            let h = std::thread::Builder::new()
                .name(format!("p{}-{}", t.index, lane.mode))
                .stack_size(LANE_STACK)
                .spawn(move || worker.run())
                .map_err(SpawnError)?;
            self.threads.push((Arc::clone(t), i, h));
        }
        Ok(())
    }

    /// Waits a moment for the lanes of stopped targets, then removes their series.
    fn retire(&mut self, gone: &[Arc<TargetShared>]) {
        if gone.is_empty() {
            return;
        }
        let deadline = Instant::now() + RETIRE_GRACE;
        let running = |s: &Self| {
            s.threads
                .iter()
                .any(|(t, _, h)| !h.is_finished() && gone.iter().any(|g| Arc::ptr_eq(g, t)))
        };
        while running(self) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        for t in gone {
            t.retire(&self.ctx);
        }
        self.reap();
    }

    /// Joins the lanes that have ended.
    fn reap(&mut self) {
        let (done, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.threads)
            .into_iter()
            .partition(|(_, _, h)| h.is_finished());
        for (_, _, h) in done {
            let _ = h.join();
        }
        self.threads = rest;
    }

    /// Stops every lane and waits for them. A thread blocked in the kernel (a frozen
    /// filesystem, a hung device) cannot be interrupted; say which target holds it,
    /// every few seconds.
    pub fn shutdown(mut self) {
        for t in self.targets.current().iter() {
            t.stop();
        }
        // The first look after a short grace: a lane of a healthy target that was in
        // the middle of an fsync at the signal finishes within it, and is not reported
        // as blocked in the kernel.
        let mut next_log = Instant::now() + Duration::from_millis(250);
        loop {
            self.reap();
            if self.threads.is_empty() {
                return;
            }
            if Instant::now() >= next_log {
                for (t, i, _) in &self.threads {
                    let lane = &t.lanes[*i];
                    match lane.inflight.current() {
                        Some(op) => warn!(target = %t.target.name, path = %t.target.path.display(),
                            mode = %op.mode, op = %op.op, blocked_seconds = op.age.as_secs_f64(),
                            "waiting to exit: probe blocked in the kernel; it cannot be interrupted, not even by SIGKILL"),
                        None => info!(target = %t.target.name, mode = %lane.mode,
                            "waiting for probe thread to finish"),
                    }
                }
                next_log = Instant::now() + Duration::from_secs(5);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::labels::{Mode, SyncKind};
    use crate::exposition::registry::Registry;
    use crate::kernel::kernfs::Roots;
    use crate::probe::ProbeMetrics;
    use crate::stall::log::StallLog;
    use std::path::Path;

    fn target(name: &str, path: &Path, interval_ms: u64) -> Target {
        Target {
            name: name.into(),
            path: path.to_owned(),
            interval: Duration::from_millis(interval_ms),
            modes: vec![Mode::Create, Mode::Overwrite],
            size: 4096,
            sync: SyncKind::Fsync,
            require_mountpoint: false,
            stall_threshold: Duration::from_secs(60),
            rotate_size: 1 << 20,
        }
    }

    /// The targets that have a series of `family`.
    fn targets_of(r: &Registry, family: &str) -> Vec<String> {
        let text = crate::exposition::registry::encode(r);
        let mut names: Vec<String> = text
            .lines()
            .filter(|l| {
                l.strip_prefix(family)
                    .is_some_and(|rest| rest.starts_with('{'))
            })
            .filter_map(|l| {
                let at = l.find("target=\"")? + "target=\"".len();
                Some(l[at..].split('"').next()?.to_owned())
            })
            .collect();
        names.sort();
        names.dedup();
        names
    }

    #[test]
    fn a_reload_keeps_unchanged_targets_and_replaces_the_series_of_the_others() {
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let r = Registry::new();
        let ctx = Arc::new(Context::new(
            Arc::new(ProbeMetrics::new(&r)),
            Arc::new(StallLog::new(4, &r, Arc::default())),
            Arc::default(),
            Roots::default(),
        ));
        let history = Arc::clone(&ctx.history);
        let mut s = Supervisor::new(ctx);
        let (a, b, c) = (dirs[0].path(), dirs[1].path(), dirs[2].path());
        let first = s
            .apply(&[target("a", a, 100), target("b", b, 100)])
            .unwrap();
        assert_eq!(first.unchanged, 0);
        let a_before = Arc::clone(&s.targets().current()[0]);
        let b_old = s.targets().current()[1].index;
        assert!(history.target(b_old).is_some(), "b's history");

        let changes = s
            .apply(&[
                target("a", a, 100),
                target("b", b, 200),
                target("c", c, 100),
            ])
            .unwrap();
        assert_eq!(
            changes,
            Changes {
                added: vec!["c".into()],
                removed: vec![],
                changed: vec!["b".into()],
                unchanged: 1,
            }
        );
        let now = s.targets().current();
        assert!(Arc::ptr_eq(&now[0], &a_before), "a kept its lanes");
        assert_eq!(now[1].target.interval, Duration::from_millis(200));
        // The changed target's series were removed before its new ones were created.
        for family in [
            "stallwatch_stalls_total",
            "stallwatch_probes_total",
            "stallwatch_target_up",
        ] {
            assert_eq!(targets_of(&r, family), ["a", "b", "c"], "{family}");
        }

        // The live page's history: the changed target's was replaced by a new one.
        assert!(history.target(now[0].index).is_some(), "a kept its history");
        assert!(history.target(now[1].index).is_some(), "b's new history");
        assert!(history.target(b_old).is_none(), "b's old history is gone");

        let changes = s.apply(&[target("c", c, 100)]).unwrap();
        assert_eq!(changes.removed, ["a", "b"]);
        assert!(
            history.target(now[0].index).is_none(),
            "a removed: its history too"
        );
        assert_eq!(targets_of(&r, "stallwatch_target_up"), ["c"]);
        // Within the grace a reload gives them, the removed lanes ended and cleaned up.
        assert!(
            !a.join(".stallwatch").exists(),
            "a removed target's lanes clean up"
        );
        s.shutdown();
        assert!(!c.join(".stallwatch").exists(), "cleaned up at shutdown");
    }
}
