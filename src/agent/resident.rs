//! A resident agent: its memory is locked (`mlockall`), so that when the disk the agent's
//! binary or the host's root filesystem lives on stalls, the agent's own code pages are
//! not the next thing to wait on it. An agent that page-faults on the stalled disk cannot
//! answer the scrape that would have reported the stall.
//!
//! Two calls, at the very start of `main`, before any thread exists:
//!
//! 1. `mlockall(MCL_CURRENT)` reads in and locks everything mapped now: the binary's code
//!    and read-only data, the C library and the loader, the heap so far. The code paths
//!    that only run during a stall (the watchdog's crossing, the stall log, the kernel
//!    context readers) have never run before the first stall: they must be resident
//!    already, which MCL_ONFAULT would not do.
//! 2. `mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT)`: everything mapped later (thread
//!    stacks, heap growth, glibc's per-thread arenas) is locked as it is touched, not
//!    populated in full when mapped. Without ONFAULT each thread's 2 MiB stack and each
//!    64 MiB malloc arena would be made resident at creation: with one thread per lane
//!    that is well past the unit's `MemoryMax=128M`. Anonymous memory touched for the
//!    first time is zero-filled, it never waits on a disk; once touched it stays locked.
//!    Pages already locked by step 1 stay locked (the kernel does not re-fault a locked
//!    mapping when only its ONFAULT flag changes).
//!
//! The kernel counts locked *address space* against `RLIMIT_MEMLOCK`, not resident
//! memory: each thread stack and each malloc arena reservation counts in full, even with
//! ONFAULT. glibc gives threads arenas of their own, up to 8 per CPU, each a 64 MiB
//! reservation (128 MiB while it is being aligned): locked address space would then grow
//! with the host's CPU count, not with what the agent uses. So with the lock on, malloc
//! keeps one arena (`M_ARENA_MAX` 1); the agent's threads mostly sleep, there is no
//! allocation contention to speak of. The limit (the unit's `LimitMEMLOCK=`) is sized
//! from `VmLck`, not from the RSS, while `MemoryMax=` bounds what is really resident.
//! With the lock in place a mapping that would pass the limit fails (ENOMEM, EAGAIN):
//! that is why the unit's limit has wide headroom.
//!
//! Not allowed (no `CAP_IPC_LOCK` and a `RLIMIT_MEMLOCK` below the address space, or a
//! seccomp filter): the agent says so once, with how to allow it, and runs unlocked.

use prometheus::{IntGauge, Registry};
use rustix::mm::{mlockall, MlockAllFlags};
use rustix::process::{getrlimit, Resource};
use tracing::{info, warn};

/// What [`lock`] achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lock {
    /// Current and future memory locked.
    Locked,
    /// `--memory.lock=false`.
    Off,
    /// The kernel refused: the agent runs unlocked. The message says why and how to allow it.
    Refused(String),
}

impl Lock {
    pub fn is_locked(&self) -> bool {
        matches!(self, Lock::Locked)
    }
}

/// Locks the process's memory as the module doc describes and logs the outcome (one line).
/// Call once, first thing, before any thread is started: `mlockall(MCL_CURRENT)` is only
/// allowed when the whole address space fits the limit, and every thread adds its stack.
pub fn lock(enabled: bool) -> Lock {
    if !enabled {
        info!("memory lock off (--memory.lock=false): the agent's pages can be evicted and re-read from disk");
        return Lock::Off;
    }
    let outcome = mlockall(MlockAllFlags::CURRENT).and_then(|()| {
        mlockall(MlockAllFlags::CURRENT | MlockAllFlags::FUTURE | MlockAllFlags::ONFAULT)
    });
    match outcome {
        Ok(()) => {
            let (locked, rss) = status_kib();
            if let Some(why) = too_tight(locked) {
                unlock();
                warn!("memory not locked: {why}");
                return Lock::Refused(why);
            }
            // No thread exists yet, so no arena but the main one: from here on, none.
            one_malloc_arena();
            info!(
                locked_kib = locked,
                rss_kib = rss,
                memlock_limit = %limit_text(),
                "memory locked (mlockall MCL_CURRENT, then MCL_FUTURE|MCL_ONFAULT): the agent's code and heap stay resident"
            );
            Lock::Locked
        }
        Err(e) => {
            // A failed MCL_CURRENT leaves nothing locked; a failed second call leaves
            // the first one's lock on the current pages, but nothing future: undo it, so
            // the state is one of the two that are reported.
            unlock();
            let why = format!(
                "mlockall: {e} (RLIMIT_MEMLOCK {}, address space {} KiB); running unlocked: the agent's own pages \
                 can be evicted and it may stall with the disk it watches. To allow it: LimitMEMLOCK= in the \
                 systemd unit (the packaged unit sets it) or `ulimit -l` above the address space, or CAP_IPC_LOCK; \
                 a seccomp filter must allow mlockall (@memlock). --memory.lock=false turns the lock off \
                 and this warning with it",
                limit_text(),
                vm_size_kib().map_or_else(|| "?".into(), |k| k.to_string()),
            );
            warn!(error = %e, "memory not locked: {why}");
            Lock::Refused(why)
        }
    }
}

/// glibc: one malloc arena for all threads (see the module doc). Other C libraries
/// (musl) have no per-thread arenas.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before any thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// glibc: allocations from 128 KiB up always get a mapping of their own, returned to the
/// kernel when freed. Left to itself glibc raises that threshold to the largest block it
/// has freed (up to 32 MiB), so after the first scrape each `/metrics` body (1.2 MB at
/// 64 targets) and its encoding buffers came from the heap; the heap kept those pages
/// between scrapes, and under the lock they stayed resident: 2 MiB of RSS at 64
/// targets. Setting the threshold turns the adjustment off: a large block goes back to
/// the kernel when freed. The body's buffer alone is kept on purpose, once, by the
/// registry (`exposition::registry::body`), so scrapes do not fault its ~285 pages in
/// again. Call first thing, before any thread: whatever the lock's outcome.
pub fn fixed_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before any thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

/// Back to an unlocked process.
fn unlock() {
    let _ = rustix::mm::munlockall();
}

/// `stallwatch_memory_locked`: 1 when the agent's memory is locked, 0 when not (off or
/// refused).
pub fn register(registry: &Registry, lock: &Lock) {
    let g = IntGauge::new(
        "stallwatch_memory_locked",
        "1 when the agent's memory is locked (mlockall), so its code and heap never wait on a disk; 0 when the lock is off or was refused.",
    )
    .expect("valid metric definition");
    g.set(i64::from(lock.is_locked()));
    registry.register(Box::new(g)).expect("registered once");
}

/// Address space that must stay lockable after start-up: thread stacks (2 MiB each: lanes
/// added by a reload, the HTTP runtime's blocking threads) and heap growth. Below this the
/// lock would make a later thread or allocation fail, which is worse than no lock.
pub const MIN_HEADROOM_KIB: u64 = 64 * 1024;

/// Why a lock that succeeded must be given up: without CAP_IPC_LOCK, a soft
/// RLIMIT_MEMLOCK that leaves less than [`MIN_HEADROOM_KIB`] beyond what is locked now.
fn too_tight(locked_kib: u64) -> Option<String> {
    if has_cap_ipc_lock() {
        return None;
    }
    let limit_kib = getrlimit(Resource::Memlock).current? / 1024;
    if limit_kib >= locked_kib + MIN_HEADROOM_KIB {
        return None;
    }
    Some(format!(
        "RLIMIT_MEMLOCK {} leaves less than {} KiB beyond the {locked_kib} KiB locked at start-up: \
         later threads and allocations would fail under the lock, so the agent runs unlocked. \
         To allow it: raise LimitMEMLOCK= (the packaged unit sets 512M) or `ulimit -l`, or give CAP_IPC_LOCK; \
         --memory.lock=false turns the lock off and this warning with it",
        limit_text(),
        MIN_HEADROOM_KIB
    ))
}

/// CAP_IPC_LOCK (bit 14) in `CapEff` of /proc/self/status: locking is not limited then.
fn has_cap_ipc_lock() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    cap_eff(&status).is_some_and(|caps| caps & (1 << 14) != 0)
}

fn cap_eff(status: &str) -> Option<u64> {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    u64::from_str_radix(hex, 16).ok()
}

fn limit_text() -> String {
    let l = getrlimit(Resource::Memlock);
    let fmt =
        |v: Option<u64>| v.map_or_else(|| "unlimited".to_string(), |b| format!("{} KiB", b / 1024));
    if l.current == l.maximum {
        fmt(l.current)
    } else {
        format!("{} (hard {})", fmt(l.current), fmt(l.maximum))
    }
}

/// `VmLck` and `VmRSS` of /proc/self/status, in KiB (0 when unreadable).
fn status_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    (
        field_kib(&status, "VmLck:").unwrap_or(0),
        field_kib(&status, "VmRSS:").unwrap_or(0),
    )
}

fn vm_size_kib() -> Option<u64> {
    field_kib(
        &std::fs::read_to_string("/proc/self/status").ok()?,
        "VmSize:",
    )
}

/// `NAME:   1234 kB` → 1234.
fn field_kib(status: &str, name: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields() {
        let s =
            "Name:\tstallwatch\nVmSize:\t  123456 kB\nVmLck:\t    2048 kB\nVmRSS:\t   10240 kB\n";
        assert_eq!(field_kib(s, "VmLck:"), Some(2048));
        assert_eq!(field_kib(s, "VmRSS:"), Some(10240));
        assert_eq!(field_kib(s, "VmSize:"), Some(123456));
        assert_eq!(field_kib(s, "VmSwap:"), None);
        assert_eq!(field_kib("VmLck:\tgarbage kB\n", "VmLck:"), None);
    }

    #[test]
    fn capabilities() {
        let root = "CapPrm:\t000001fffeffffff\nCapEff:\t000001fffeffffff\n";
        assert_eq!(cap_eff(root), Some(0x1fffeffffff));
        assert!(cap_eff(root).unwrap() & (1 << 14) != 0);
        assert_eq!(cap_eff("CapEff:\t0000000000000000\n"), Some(0));
        assert_eq!(cap_eff("CapEff:\tzz\n"), None);
        assert_eq!(cap_eff("Name:\tx\n"), None);
    }
}
