//! The stall matrix (issue 23): real stalls made by the scenarios of the seed reports on
//! ext4, XFS and btrfs loop filesystems, probed by the real agent in its default modes
//! plus `append`, and every stall of 2 s or more checked against the kernel's own stack.
//!
//! The kernel's side comes from a tracefs instance of the test's own: `sched/sched_switch`
//! filtered on the agent's lane threads (`p0-<mode>`, supervisor.rs) with
//! `options/stacktrace`, so each switch-out carries the stack the thread went to sleep
//! with, and the switch-in after it says how long it slept there. For each stall the test
//! sums the time the lane's thread slept in each class over the stall's window and takes
//! the class with most time; the class of a stack is decided by [`CLASSES`], a table
//! written here, apart from the agent's (`src/stall/causes.rs` is not used).
//!
//! * `matrix::bounded` (CI): a freeze and a streaming writer on ext4, XFS and btrfs, and
//!   the dirty-limit drop on ext4; about 75 s. Asserts that every stall of 2 s
//!   or more has a named cause and that the agent's cause is the kernel stack's class,
//!   except for mixed stalls (the agent's class at least a third of the time asleep),
//!   which are printed with their seconds per class.
//! * `matrix::full` (`#[ignore]`, the bench section, about five minutes): every scenario
//!   of the issue on the three filesystems and a FUSE server that stops answering;
//!   asserts the rule (no `other`/`unknown`, at least 95 % agreement) and prints
//!   the exceptions. Results and the story of each cell: docs/stall-matrix.md.
//!
//! `STALLWATCH_MATRIX_ONLY=WORD[,WORD]` runs only some cells, `STALLWATCH_MATRIX_TRACES=DIR`
//! keeps each cell's raw trace, `STALLWATCH_MATRIX_JSON=FILE` writes the cells and rows
//! as JSON (the bench's `matrix` section reads it).
//!
//! Both print the matrix (`--nocapture`). Global state (the `vm.dirty_*` sysctls of the
//! dirty-limit drop, `drop_caches`) is touched only under [`machine::exclusive`], saved
//! and restored by a guard on every exit path, for seconds.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use crate::diagnosis::FuseMount;
use crate::support::agent::Agent;
use crate::support::cmd::run_cmd;
use crate::support::loopfs::LoopFs;
use crate::support::machine;
use crate::support::root::require_root;
use crate::support::wait::wait_until;
use crate::support::writer::{random_writer, Kick};

/// Stalls at least this long are checked.
const MIN_STALL: f64 = 2.0;

/// The lanes the agent runs: its default modes plus `append`.
const MODES: &[&str] = &["create", "overwrite", "append"];

/// The kernel's stack → class, innermost frame first; `*` ends a prefix. Scheduling and
/// generic waits (`io_schedule`, `folio_wait_bit_common`, `out_of_line_wait_on_bit`,
/// `rwsem_down_*`) are not here, so the search walks past them to the caller that says
/// what was awaited. Written from the kernel sources, not from the agent's table.
const CLASSES: &[(&str, &str)] = &[
    // freeze_super() holds the superblock's percpu rwsem for writing until the thaw.
    ("percpu_rwsem_wait", "frozen"),
    ("__percpu_down_read", "frozen"),
    ("sb_start_*", "frozen"),
    ("__sb_start_write", "frozen"),
    ("balance_dirty_pages*", "dirty_throttle"),
    ("jbd2_*", "journal"),
    ("start_this_handle", "journal"),
    ("wait_transaction_locked", "journal"),
    ("add_transaction_credits", "journal"),
    ("do_get_write_access", "journal"),
    ("xlog_*", "journal"),
    ("xfs_log_force*", "journal"),
    ("wait_current_trans", "journal"),
    ("wait_for_commit", "journal"),
    ("btrfs_commit_transaction", "journal"),
    ("btrfs_sync_log", "journal"),
    ("folio_wait_writeback", "writeback_wait"),
    ("wait_on_page_writeback", "writeback_wait"),
    ("folio_wait_stable", "writeback_wait"),
    ("__filemap_fdatawait_range", "writeback_wait"),
    ("filemap_fdatawait*", "writeback_wait"),
    ("wb_wait_for_completion", "writeback_wait"),
    ("btrfs_wait_ordered_range", "writeback_wait"),
    ("btrfs_start_ordered_extent*", "writeback_wait"),
    ("rq_qos_wait", "device_queue"),
    ("wbt_wait", "device_queue"),
    ("blk_mq_get_tag", "device_queue"),
    ("__bio_queue_enter", "device_queue"),
    ("submit_bio_wait", "device_queue"),
    ("blkdev_issue_flush", "device_queue"),
    // A metadata block (buffer head, xfs_buf, extent buffer) locked or under I/O.
    ("__wait_on_buffer", "metadata_buffer"),
    ("__lock_buffer", "metadata_buffer"),
    ("bh_uptodate_or_lock", "metadata_buffer"),
    ("ext4_wait_block_bitmap", "metadata_buffer"),
    ("ext4_read_inode_bitmap", "metadata_buffer"),
    ("ext4_read_block_bitmap*", "metadata_buffer"),
    ("__ext4_get_inode_loc", "metadata_buffer"),
    ("ext4_read_bh*", "metadata_buffer"),
    ("__ext4_find_entry", "metadata_buffer"),
    ("ext4_bread*", "metadata_buffer"),
    // A lookup waiting for another thread's lookup of the same name (fs/dcache.c), which
    // is reading the directory block or the inode.
    ("d_alloc_parallel", "metadata_buffer"),
    ("d_wait_lookup", "metadata_buffer"),
    ("xfs_buf_lock", "metadata_buffer"),
    ("xfs_buf_iowait", "metadata_buffer"),
    ("xfs_buf_read_map", "metadata_buffer"),
    ("read_extent_buffer_pages*", "metadata_buffer"),
    ("btrfs_read_extent_buffer", "metadata_buffer"),
    ("__btrfs_tree_lock", "metadata_buffer"),
    ("__btrfs_tree_read_lock", "metadata_buffer"),
    ("btrfs_tree_lock*", "metadata_buffer"),
    ("btrfs_tree_read_lock*", "metadata_buffer"),
    ("request_wait_answer", "fuse"),
    ("fuse_*", "fuse"),
    ("__fuse_*", "fuse"),
];

/// The class of one stack (innermost first) and the frame that decided it; `other` with
/// the first frame outside the scheduler when no frame is known.
fn class_of(frames: &[String]) -> (&'static str, String) {
    let find = |f: &str| {
        CLASSES
            .iter()
            .find(|(p, _)| match p.strip_suffix('*') {
                Some(prefix) => f.starts_with(prefix),
                None => f == *p,
            })
            .map(|&(_, c)| c)
    };
    for f in frames {
        if let Some(c) = find(f) {
            return (c, f.clone());
        }
    }
    let first = frames
        .iter()
        .find(|f| !SCHED_FRAMES.contains(&f.as_str()) && !f.starts_with("schedule"))
        .cloned()
        .unwrap_or_default();
    ("other", first)
}

/// The frames of the tracer and the scheduler at the top of every stack.
const SCHED_FRAMES: &[&str] = &[
    "trace_event_raw_event_sched_switch",
    "__traceiter_sched_switch",
    "__schedule",
    "schedule",
    "io_schedule",
    "io_schedule_timeout",
    "schedule_timeout",
    "bit_wait_io",
    "__wait_on_bit",
    "__wait_on_bit_lock",
    "out_of_line_wait_on_bit",
    "out_of_line_wait_on_bit_lock",
    "folio_wait_bit_common",
    "percpu_rwsem_wait",
];

/// The agent's cause in the words of [`CLASSES`].
fn as_class(cause: &str) -> &str {
    match cause {
        "remote" => "fuse",
        c => c,
    }
}

// ---------------------------------------------------------------------------------------
// The kernel's view: a tracefs instance of the test's own

const TRACEFS: &str = "/sys/kernel/tracing";

/// A tracefs instance with `sched_switch` on the given threads and a stack on each
/// switch; disabled and removed on drop.
struct Tracer {
    dir: PathBuf,
}

impl Tracer {
    fn start(tids: &[u32]) -> Tracer {
        if !Path::new(TRACEFS).join("instances").is_dir() {
            run_cmd("mount", &["-t", "tracefs", "nodev", TRACEFS])
                .unwrap_or_else(|e| panic!("tracefs not mounted and mount failed: {e}"));
        }
        let dir = Path::new(TRACEFS)
            .join("instances")
            .join(format!("stallwatch-matrix-{}", std::process::id()));
        if dir.exists() {
            let _ = std::fs::remove_dir(&dir);
        }
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let t = Tracer { dir };
        let filter = tids
            .iter()
            .map(|t| format!("prev_pid == {t} || next_pid == {t}"))
            .collect::<Vec<_>>()
            .join(" || ");
        t.write("trace_clock", "mono");
        t.write("buffer_size_kb", "8192");
        t.write("events/sched/sched_switch/filter", &filter);
        t.write("options/stacktrace", "1");
        t.write("events/sched/sched_switch/enable", "1");
        t
    }

    fn write(&self, file: &str, value: &str) {
        let p = self.dir.join(file);
        std::fs::write(&p, value).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    }

    fn stop(&self) {
        let _ = std::fs::write(self.dir.join("events/sched/sched_switch/enable"), "0");
        let _ = std::fs::write(self.dir.join("options/stacktrace"), "0");
    }

    fn read(&self) -> String {
        std::fs::read_to_string(self.dir.join("trace")).expect("read trace")
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        self.stop();
        for _ in 0..20 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("Tracer drop: could not remove {}", self.dir.display());
    }
}

/// One sleep of a traced thread: from its switch-out (not runnable) to its switch-in.
#[derive(Debug, Clone)]
struct Sleep {
    tid: u32,
    from: f64,
    to: f64,
    frames: Vec<String>,
}

fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let i = line.find(name)?;
    line[i + name.len()..].split_whitespace().next()
}

/// The sleeps of `tids` in a `trace` text of sched_switch events with stacks.
fn sleeps(trace: &str, tids: &[u32]) -> Vec<Sleep> {
    // The stack event follows its switch event on the same CPU.
    let mut last_on_cpu: BTreeMap<String, Option<usize>> = BTreeMap::new();
    let mut open: BTreeMap<u32, usize> = BTreeMap::new();
    let mut out: Vec<Sleep> = Vec::new();
    let mut stack_for: Option<usize> = None;
    let mut last_ts = 0.0f64;
    for line in trace.lines() {
        if let Some(frame) = line.trim_start().strip_prefix("=> ") {
            if let Some(i) = stack_for {
                let f = frame.split(['+', ' ']).next().unwrap_or("").to_owned();
                out[i].frames.push(f);
            }
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let cpu = line
            .split('[')
            .nth(1)
            .and_then(|r| r.split(']').next())
            .unwrap_or("")
            .to_owned();
        if line.contains("<stack trace>") {
            stack_for = last_on_cpu.get(&cpu).copied().flatten();
            continue;
        }
        stack_for = None;
        let Some(head) = line
            .split(": sched_switch:")
            .next()
            .filter(|_| line.contains(": sched_switch:"))
        else {
            continue;
        };
        let ts: f64 = match head.split_whitespace().last().and_then(|t| t.parse().ok()) {
            Some(t) => t,
            None => continue,
        };
        let prev: u32 = field(line, "prev_pid=")
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        let next: u32 = field(line, "next_pid=")
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        let state = field(line, "prev_state=").unwrap_or("R");
        let mut this = None;
        if tids.contains(&prev) && !state.starts_with('R') {
            out.push(Sleep {
                tid: prev,
                from: ts,
                to: f64::INFINITY,
                frames: Vec::new(),
            });
            // A switch-in the buffer lost: the earlier sleep ended by now at the latest.
            if let Some(old) = open.insert(prev, out.len() - 1) {
                out[old].to = out[old].to.min(ts);
            }
            this = Some(out.len() - 1);
        }
        if tids.contains(&next) {
            if let Some(i) = open.remove(&next) {
                out[i].to = ts;
            }
        }
        last_on_cpu.insert(cpu, this);
        last_ts = ts;
    }
    // Still asleep when the trace stopped.
    for s in &mut out {
        s.to = s.to.min(last_ts);
    }
    out
}

/// CLOCK_MONOTONIC seconds of a wall-clock instant.
fn mono_of(t: SystemTime) -> f64 {
    let now_wall = SystemTime::now();
    let now_mono = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let mono = now_mono.tv_sec as f64 + now_mono.tv_nsec as f64 / 1e9;
    match now_wall.duration_since(t) {
        Ok(ago) => mono - ago.as_secs_f64(),
        Err(e) => mono + e.duration().as_secs_f64(),
    }
}

/// What the kernel's stacks say of one window of one thread: the class with most time
/// asleep, that time, the share of the window asleep in it, and the stack that decided.
#[derive(Debug, Clone)]
struct KernelView {
    class: String,
    /// Seconds asleep in the window by class.
    shares: BTreeMap<String, f64>,
    seconds: f64,
    frame: String,
    stack: Vec<String>,
}

fn kernel_view(all: &[Sleep], tid: u32, from: f64, to: f64) -> Option<KernelView> {
    let mut by: BTreeMap<&'static str, (f64, String, Vec<String>, f64)> = BTreeMap::new();
    for s in all.iter().filter(|s| s.tid == tid) {
        let overlap = s.to.min(to) - s.from.max(from);
        if overlap <= 0.0 {
            continue;
        }
        let (class, frame) = class_of(&s.frames);
        let e = by
            .entry(class)
            .or_insert((0.0, String::new(), Vec::new(), 0.0));
        e.0 += overlap;
        if overlap > e.3 {
            e.1 = frame;
            e.2 = s.frames.clone();
            e.3 = overlap;
        }
    }
    let shares: BTreeMap<String, f64> = by.iter().map(|(c, v)| (c.to_string(), v.0)).collect();
    by.into_iter().max_by(|a, b| a.1 .0.total_cmp(&b.1 .0)).map(
        |(class, (seconds, frame, stack, _))| KernelView {
            class: class.to_owned(),
            shares,
            seconds,
            frame,
            stack: stack
                .into_iter()
                .filter(|f| !SCHED_FRAMES[..2].contains(&f.as_str()))
                .collect(),
        },
    )
}

// ---------------------------------------------------------------------------------------
// Global state: the dirty limits, saved and restored

const DIRTY_SYSCTLS: &[&str] = &[
    "dirty_bytes",
    "dirty_ratio",
    "dirty_background_bytes",
    "dirty_background_ratio",
];

/// The machine's `vm.dirty_*` as they were; written back on drop (bytes or ratio,
/// whichever was in force), on every exit path.
struct DirtyLimits {
    saved: Vec<(&'static str, String)>,
}

impl DirtyLimits {
    fn save() -> DirtyLimits {
        let saved = DIRTY_SYSCTLS
            .iter()
            .map(|k| {
                let v = std::fs::read_to_string(format!("/proc/sys/vm/{k}")).unwrap();
                (*k, v.trim().to_owned())
            })
            .collect();
        DirtyLimits { saved }
    }

    /// Lowers `vm.dirty_bytes` (never below 16 MiB), the background limit to half.
    fn lower(&self, bytes: u64) {
        assert!(
            bytes >= 16 << 20,
            "the machine's dirty limit stays >= 16 MiB"
        );
        std::fs::write("/proc/sys/vm/dirty_bytes", bytes.to_string()).unwrap();
        std::fs::write(
            "/proc/sys/vm/dirty_background_bytes",
            (bytes / 2).to_string(),
        )
        .unwrap();
    }

    fn restore(&self) {
        // Writing a ratio clears the bytes value and back; the non-zero one wins.
        for (k, v) in &self.saved {
            if v != "0" {
                if let Err(e) = std::fs::write(format!("/proc/sys/vm/{k}"), v) {
                    eprintln!("DirtyLimits: restoring vm.{k}={v}: {e}");
                }
            }
        }
    }
}

impl Drop for DirtyLimits {
    fn drop(&mut self) {
        self.restore();
    }
}

// ---------------------------------------------------------------------------------------
// Scenarios

#[derive(Debug, Clone, Copy, PartialEq)]
enum Scenario {
    /// A streaming `dd` into the same filesystem on a device throttled to 4 MB/s (seed 000).
    Stream,
    /// Random 4 KiB buffered writes into a 64 MiB file, throttled to 1 MB/s (seed 003).
    Random,
    /// 48 MiB dirtied under the default limit, then `vm.dirty_bytes` at 16 MiB for 6 s,
    /// the device throttled to 4 MB/s (seed 003's balance_dirty_pages).
    DirtyDrop,
    /// Six O_DIRECT writers of 1 MiB saturating a device throttled to 2 MB/s (seed 002).
    Direct,
    /// Eight threads creating, writing (64 KiB) and fsyncing small files, the device
    /// throttled to 256 kB/s.
    MetaStorm,
    /// 2000 small files and a 16 MiB one, reads throttled to 64 kB/s, three sequential
    /// readers of the big file, then caches dropped and a reader walking the small ones.
    ColdRead,
    /// `fsfreeze` for 5 s.
    Freeze,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Stream => "stream (dd)",
            Scenario::Random => "random 4k writes",
            Scenario::DirtyDrop => "dirty-limit drop",
            Scenario::Direct => "O_DIRECT saturation",
            Scenario::MetaStorm => "metadata storm",
            Scenario::ColdRead => "cold reads",
            Scenario::Freeze => "freeze",
        }
    }
}

/// Bounded loops of the scenarios' load.
fn spawn_loop(
    stop: &Arc<AtomicBool>,
    limit: Duration,
    mut body: impl FnMut(u64) -> bool + Send + 'static,
) -> JoinHandle<()> {
    let stop = Arc::clone(stop);
    std::thread::spawn(move || {
        let t0 = Instant::now();
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) && t0.elapsed() < limit && body(i) {
            i += 1;
        }
    })
}

/// `dd bs=1M` of `mib` MiB into `path`. On a machine with much memory the kernel would
/// start writing it back only after 30 s (dirty_expire_centisecs): every 4 MiB the
/// writer starts writeback of what it wrote (sync_file_range WRITE, which does not wait),
/// as the background flusher does on a host whose dirty memory is at its background limit.
fn streaming(path: PathBuf, stop: &Arc<AtomicBool>, limit: Duration, mib: u64) -> JoinHandle<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::create(&path).unwrap();
    let buf = vec![0xa5u8; 1 << 20];
    spawn_loop(stop, limit, move |i| {
        let ok = i < mib && f.write_at(&buf, i << 20).is_ok();
        if ok && i % 4 == 3 {
            // SAFETY: a plain syscall on a descriptor we own.
            unsafe {
                libc::sync_file_range(f.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
            }
        }
        ok
    })
}

/// Runs the scenario's load on `fs` (the agent probing it), for about `secs`; returns
/// with the device unthrottled and the load stopped.
fn load(s: Scenario, fs: &mut LoopFs, secs: u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let limit = Duration::from_secs(secs + 20);
    let dir = fs.path().to_owned();
    let mut handles = Vec::new();
    let mut read_throttle = None;
    match s {
        Scenario::Freeze => {
            std::thread::sleep(Duration::from_secs(1));
            fs.freeze();
            std::thread::sleep(Duration::from_secs(secs));
            fs.thaw();
            return;
        }
        Scenario::Stream => {
            fs.throttle_write_bps(4 << 20);
            handles.push(streaming(dir.join("stream"), &stop, limit, 96));
        }
        Scenario::Random => {
            fs.throttle_write_bps(1 << 20);
            handles.push(random_writer(
                &dir.join("big"),
                Arc::clone(&stop),
                12288,
                limit,
                Kick::FadviseDontneed,
            ));
        }
        Scenario::DirtyDrop => {
            let limits = DirtyLimits::save();
            fs.throttle_write_bps(4 << 20);
            // 48 MiB dirty at once, under the machine's default limit.
            let h = streaming(dir.join("dirty"), &stop, limit, 48);
            h.join().unwrap();
            // Keep dirtying in 4 KiB writes while the limit is low.
            let f = std::fs::File::create(dir.join("dribble")).unwrap();
            handles.push(spawn_loop(&stop, limit, move |i| {
                f.write_at(&[7u8; 4096], (i % 4096) * 4096).is_ok()
            }));
            limits.lower(16 << 20);
            std::thread::sleep(Duration::from_secs(secs.min(6)));
            drop(limits);
        }
        Scenario::Direct => {
            fs.throttle_write_bps(2 << 20);
            for k in 0..6u64 {
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(dir.join(format!("direct{k}")))
                    .unwrap();
                f.set_len(16 << 20).unwrap();
                let buf = AlignedBuf::new(1 << 20);
                handles.push(spawn_loop(&stop, limit, move |i| {
                    f.write_at(buf.as_slice(), (i % 16) << 20).is_ok()
                }));
            }
        }
        Scenario::MetaStorm => {
            fs.throttle_write_bps(256 << 10);
            for k in 0..8u64 {
                let d = dir.join(format!("storm{k}"));
                std::fs::create_dir_all(&d).unwrap();
                handles.push(spawn_loop(&stop, limit, move |i| {
                    let p = d.join(format!("f{}", i % 400));
                    match std::fs::File::create(&p) {
                        Ok(f) => {
                            let _ = f.write_at(&[1u8; 65536], 0);
                            f.sync_all().is_ok()
                        }
                        Err(_) => false,
                    }
                }));
            }
        }
        Scenario::ColdRead => {
            let tree = dir.join("tree");
            for d in 0..20 {
                let sub = tree.join(format!("d{d}"));
                std::fs::create_dir_all(&sub).unwrap();
                for f in 0..100 {
                    std::fs::write(sub.join(format!("f{f}")), [0u8; 512]).unwrap();
                }
            }
            let big = dir.join("cold");
            let f = std::fs::File::create(&big).unwrap();
            for i in 0..16u64 {
                f.write_at(&[3u8; 1 << 20], i << 20).unwrap();
            }
            drop(f);
            let _ = run_cmd("sync", &["-f", dir.to_str().unwrap()]);
            read_throttle = Some(fs.throttle_read_bps(64 << 10));
            // Cold: the big file's pages go first, then, once three sequential readers
            // keep the throttled read queue seconds deep, everything else (the probes'
            // directory blocks, inode table blocks and dentries with it), so the probes'
            // next lookups read behind that queue.
            rustix::fs::fadvise(
                std::fs::File::open(&big).unwrap(),
                0,
                None,
                rustix::fs::Advice::DontNeed,
            )
            .unwrap();
            for k in 0..3u64 {
                let f = std::fs::File::open(&big).unwrap();
                let mut buf = vec![0u8; 1 << 20];
                handles.push(spawn_loop(&stop, limit, move |i| {
                    f.read_at(&mut buf, ((i + 5 * k) % 16) << 20).is_ok()
                }));
            }
            std::thread::sleep(Duration::from_secs(1));
            std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
            handles.push(spawn_loop(&stop, limit, move |i| {
                let sub = tree.join(format!("d{}", i % 20));
                if let Ok(rd) = std::fs::read_dir(&sub) {
                    for e in rd.flatten() {
                        let _ = e.metadata();
                    }
                }
                true
            }));
        }
    }
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    if fs.is_throttled() {
        fs.unthrottle();
    }
    drop(read_throttle);
    for h in handles {
        let _ = h.join();
    }
}

/// A buffer aligned for O_DIRECT.
struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: a non-zero size; freed in Drop with the same layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        AlignedBuf { ptr, len }
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: allocated with `len` bytes, zeroed, alive while self is.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, 4096).unwrap();
        // SAFETY: allocated in new() with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

// ---------------------------------------------------------------------------------------
// One cell: a scenario on a filesystem

/// One stall of 2 s or more and what each side says of it.
#[derive(Debug, Clone)]
struct Row {
    scenario: &'static str,
    fs: String,
    mode: String,
    op: String,
    seconds: f64,
    cause: String,
    symbol: String,
    verdict: String,
    kernel: Option<KernelView>,
}

impl Row {
    fn named(&self) -> bool {
        !matches!(self.cause.as_str(), "other" | "unknown")
    }

    fn agrees(&self) -> bool {
        self.kernel
            .as_ref()
            .is_some_and(|k| k.class == as_class(&self.cause))
    }

    /// A mixed stall: the kernel's stacks show the agent's class for at least a third
    /// of the time asleep, though another class had more.
    fn partly_agrees(&self) -> bool {
        self.kernel.as_ref().is_some_and(|k| {
            let total: f64 = k.shares.values().sum();
            let mine = k.shares.get(as_class(&self.cause)).copied().unwrap_or(0.0);
            total > 0.0 && mine >= total / 3.0
        })
    }

    fn verdict_word(&self) -> &'static str {
        if self.agrees() {
            "agree"
        } else if self.partly_agrees() {
            "MIXED"
        } else {
            "DISAGREE"
        }
    }
}

fn lane_tids(agent: &Agent) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(format!("/proc/{}/task", agent.pid())).unwrap() {
        let e = e.unwrap();
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if let Some(mode) = comm.trim().strip_prefix("p0-") {
            out.insert(
                mode.to_owned(),
                e.file_name().to_str().unwrap().parse().unwrap(),
            );
        }
    }
    out
}

fn config(path: &Path, modes: &[&str]) -> String {
    format!(
        "vm_interval: 200ms\nstall_threshold: 1s\ntargets:\n  - path: {}\n    name: t\n    interval: 500ms\n    modes: [{}]\n",
        path.display(),
        modes.join(", ")
    )
}

fn stalls(agent: &Agent) -> Vec<Value> {
    let (status, body, _) = agent.get("/api/stalls");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("/api/stalls: {e}: {body}"))
}

/// Probes `path` with the agent while `make` makes the stall, traces the lanes, and
/// returns a row per stall of 2 s or more.
fn observe(scenario: &'static str, fs_name: &str, path: &Path, make: impl FnOnce()) -> Vec<Row> {
    let agent = Agent::start(&config(path, MODES));
    assert!(agent.wait_up("t"), "{}", agent.log_tail(20));
    let tids = lane_tids(&agent);
    assert_eq!(tids.len(), MODES.len(), "lane threads: {tids:?}");
    let tracer = Tracer::start(&tids.values().copied().collect::<Vec<_>>());
    // A cycle or two before the load, so every lane has a call in flight.
    std::thread::sleep(Duration::from_millis(1200));
    make();
    // Every stall ends (the load is gone); bounded.
    let ended = wait_until(Duration::from_secs(60), Duration::from_millis(250), || {
        stalls(&agent).iter().all(|e| e["ongoing"] == false)
    });
    std::thread::sleep(Duration::from_millis(300));
    tracer.stop();
    let trace = tracer.read();
    drop(tracer);
    if let Ok(dir) = std::env::var("STALLWATCH_MATRIX_TRACES") {
        let name = format!("{scenario}-{fs_name}.trace").replace([' ', '/', '(', ')'], "_");
        let _ = std::fs::write(Path::new(&dir).join(name), &trace);
    }
    let events = stalls(&agent);
    let all = sleeps(&trace, &tids.values().copied().collect::<Vec<_>>());
    let mut rows = Vec::new();
    for e in &events {
        let seconds = e["duration_seconds"].as_f64().unwrap_or(0.0);
        if seconds < MIN_STALL || e["ongoing"] == true {
            continue;
        }
        let mode = e["mode"].as_str().unwrap().to_owned();
        let started = humantime::parse_rfc3339(e["started_at"].as_str().unwrap()).unwrap();
        let from = mono_of(started);
        let kernel = tids
            .get(&mode)
            .and_then(|&tid| kernel_view(&all, tid, from, from + seconds));
        let symbol = e["wchan"]
            .as_array()
            .and_then(|w| w.first())
            .and_then(|w| w["symbol"].as_str())
            .unwrap_or("")
            .to_owned();
        rows.push(Row {
            scenario,
            fs: fs_name.to_owned(),
            mode,
            op: e["op"].as_str().unwrap().to_owned(),
            seconds,
            cause: e["cause"].as_str().unwrap().to_owned(),
            symbol,
            verdict: e["verdict"].as_str().unwrap_or("").to_owned(),
            kernel,
        });
    }
    assert!(
        ended,
        "stalls still ongoing 60 s after the load: {events:?}"
    );
    rows
}

fn cell(s: Scenario, fstype: &str, secs: u64) -> Vec<Row> {
    let size = if fstype == "xfs" { 320 } else { 256 };
    let mut fs = LoopFs::new(fstype, size);
    let path = fs.path().to_owned();
    observe(s.name(), fstype, &path, || load(s, &mut fs, secs))
}

fn fuse_cell(secs: u64) -> Vec<Row> {
    let fuse = FuseMount::new();
    let hang = Arc::clone(&fuse.hang);
    let mnt = fuse.mnt.clone();
    let rows = observe("FUSE server stops answering", "fuse", &mnt, || {
        std::thread::sleep(Duration::from_secs(1));
        hang.store(true, Ordering::Relaxed);
        std::thread::sleep(Duration::from_secs(secs));
        hang.store(false, Ordering::Relaxed);
    });
    drop(fuse);
    rows
}

/// The matrix as text: scenario × filesystem → stalls, causes, agreement; then one line
/// per stall.
fn render(rows: &[Row], cells: &[(&'static str, String)]) -> String {
    let mut s = String::new();
    let fss: Vec<&str> = ["ext4", "xfs", "btrfs", "fuse"]
        .into_iter()
        .filter(|f| cells.iter().any(|(_, c)| c == f))
        .collect();
    let _ = write!(s, "| scenario |");
    for f in &fss {
        let _ = write!(s, " {f} |");
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "|---|{}", "---|".repeat(fss.len()));
    let mut scenarios: Vec<&str> = Vec::new();
    for (sc, _) in cells {
        if !scenarios.contains(sc) {
            scenarios.push(sc);
        }
    }
    for sc in scenarios {
        let _ = write!(s, "| {sc} |");
        for f in &fss {
            if !cells.iter().any(|(a, b)| a == &sc && b == f) {
                let _ = write!(s, " – |");
                continue;
            }
            let mine: Vec<&Row> = rows
                .iter()
                .filter(|r| r.scenario == sc && r.fs == *f)
                .collect();
            if mine.is_empty() {
                let _ = write!(s, " no stall ≥ 2 s |");
                continue;
            }
            let mut causes: BTreeMap<String, usize> = BTreeMap::new();
            for r in &mine {
                *causes
                    .entry(format!("{}:{} {}", r.mode, r.op, r.cause))
                    .or_default() += 1;
            }
            let agree = mine.iter().filter(|r| r.agrees()).count();
            let mixed = mine
                .iter()
                .filter(|r| !r.agrees() && r.partly_agrees())
                .count();
            let mixed = if mixed > 0 {
                format!(" ({mixed} mixed)")
            } else {
                String::new()
            };
            let list: Vec<String> = causes
                .iter()
                .map(|(k, n)| {
                    if *n > 1 {
                        format!("{k} ×{n}")
                    } else {
                        k.clone()
                    }
                })
                .collect();
            let _ = write!(
                s,
                " {} stalls: {}; agree {agree}/{}{mixed} |",
                mine.len(),
                list.join(", "),
                mine.len()
            );
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(s);
    for r in rows {
        let k = r.kernel.as_ref();
        let _ = writeln!(
            s,
            "{} {} | {}:{} {:.1} s | agent {} at {} | kernel {} at {} ({:.1} s asleep; {:?}) | {}\n    verdict: {}\n    stack: {}",
            r.scenario,
            r.fs,
            r.mode,
            r.op,
            r.seconds,
            r.cause,
            r.symbol,
            k.map_or("-", |k| k.class.as_str()),
            k.map_or("-", |k| k.frame.as_str()),
            k.map_or(0.0, |k| k.seconds),
            k.map(|k| k.shares.iter().map(|(c, v)| format!("{c} {v:.1} s")).collect::<Vec<_>>()).unwrap_or_default(),
            r.verdict_word(),
            r.verdict,
            k.map(|k| k.stack.join(" < ")).unwrap_or_default(),
        );
    }
    s
}

fn run_matrix(plan: &[(Scenario, &[&str], u64)], fuse: Option<u64>) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut cells = Vec::new();
    for &(s, fss, secs) in plan {
        for &f in fss {
            if !wanted(s.name(), f) {
                continue;
            }
            let t0 = Instant::now();
            let r = cell(s, f, secs);
            eprintln!(
                "[matrix] {} on {f}: {} stalls >= 2 s in {:.0} s",
                s.name(),
                r.len(),
                t0.elapsed().as_secs_f64()
            );
            rows.extend(r);
            cells.push((s.name(), f.to_owned()));
        }
    }
    if let Some(secs) = fuse.filter(|_| wanted("FUSE", "fuse")) {
        rows.extend(fuse_cell(secs));
        cells.push(("FUSE server stops answering", "fuse".to_owned()));
    }
    println!("\n{}", render(&rows, &cells));
    if let Ok(path) = std::env::var("STALLWATCH_MATRIX_JSON") {
        std::fs::write(&path, as_json(&rows, &cells).to_string())
            .unwrap_or_else(|e| panic!("STALLWATCH_MATRIX_JSON={path}: {e}"));
    }
    rows
}

/// The cells run and every row, for the bench's `matrix` section
/// (`STALLWATCH_MATRIX_JSON=FILE`).
fn as_json(rows: &[Row], cells: &[(&str, String)]) -> Value {
    let rows: Vec<Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "scenario": r.scenario,
                "fs": r.fs,
                "mode": r.mode,
                "op": r.op,
                "seconds": r.seconds,
                "cause": r.cause,
                "symbol": r.symbol,
                "verdict": r.verdict,
                "named": r.named(),
                "agrees": r.agrees(),
                "mixed": !r.agrees() && r.partly_agrees(),
                "kernel": r.kernel.as_ref().map(|k| serde_json::json!({
                    "class": k.class,
                    "frame": k.frame,
                    "seconds": k.seconds,
                    "shares": k.shares,
                    "stack": k.stack,
                })),
            })
        })
        .collect();
    let cells: Vec<Value> = cells
        .iter()
        .map(|(s, f)| serde_json::json!({"scenario": s, "fs": f}))
        .collect();
    serde_json::json!({"cells": cells, "rows": rows})
}

/// `STALLWATCH_MATRIX_ONLY=WORD[,WORD…]` runs only the cells whose scenario name
/// contains a WORD or whose filesystem is one (a rerun of a cell while looking into it).
fn wanted(scenario: &str, fs: &str) -> bool {
    match std::env::var("STALLWATCH_MATRIX_ONLY") {
        Ok(w) if !w.is_empty() => w.split(',').any(|w| scenario.contains(w) || fs == w),
        _ => true,
    }
}

const ALL_FS: &[&str] = &["ext4", "xfs", "btrfs"];

#[test]
fn bounded() {
    if !require_root("matrix::bounded") {
        return;
    }
    let _machine = machine::exclusive();
    let rows = run_matrix(
        &[
            (Scenario::Freeze, ALL_FS, 4),
            (Scenario::Stream, ALL_FS, 10),
            (Scenario::DirtyDrop, &["ext4"], 6),
        ],
        None,
    );
    for f in ALL_FS {
        assert!(
            rows.iter().any(|r| r.fs == *f && r.scenario == "freeze"),
            "a 4 s freeze of {f} made no stall of 2 s or more"
        );
    }
    assert!(
        rows.iter().any(|r| r.scenario == Scenario::Stream.name()),
        "a streaming writer on a 4 MB/s device made no stall of 2 s or more anywhere"
    );
    let unnamed: Vec<&Row> = rows.iter().filter(|r| !r.named()).collect();
    assert!(
        unnamed.is_empty(),
        "stalls without a named cause: {unnamed:#?}"
    );
    // The exceptions allowed: a mixed stall, where the kernel's stacks show the agent's
    // cause for at least a third of the time asleep (printed above as MIXED, with the
    // seconds per class), e.g. an fsync that waited for writeback and then for the log.
    let disagree: Vec<&Row> = rows
        .iter()
        .filter(|r| !r.agrees() && !r.partly_agrees())
        .collect();
    assert!(
        disagree.is_empty(),
        "the agent's cause is not the kernel stack's class: {disagree:#?}"
    );
}

/// The whole matrix (the bench section): `cargo test --release --test it matrix::full --
/// --ignored --nocapture`.
#[test]
#[ignore = "the full matrix: about 5 minutes, changes vm.dirty_* for seconds"]
fn full() {
    if !require_root("matrix::full") {
        return;
    }
    let _machine = machine::exclusive();
    let rows = run_matrix(
        &[
            (Scenario::Stream, ALL_FS, 12),
            (Scenario::Random, ALL_FS, 12),
            (Scenario::DirtyDrop, ALL_FS, 6),
            (Scenario::Direct, ALL_FS, 12),
            (Scenario::MetaStorm, ALL_FS, 12),
            (Scenario::ColdRead, ALL_FS, 10),
            (Scenario::Freeze, ALL_FS, 5),
        ],
        Some(5),
    );
    let unnamed: Vec<&Row> = rows.iter().filter(|r| !r.named()).collect();
    let agree = rows.iter().filter(|r| r.agrees()).count();
    println!(
        "[matrix] {} stalls >= 2 s, {} without a named cause, {agree} agree with the kernel's stack",
        rows.len(),
        unnamed.len()
    );
    assert!(
        unnamed.is_empty(),
        "stalls without a named cause: {unnamed:#?}"
    );
    assert!(
        agree as f64 >= 0.95 * rows.len() as f64,
        "agreement {agree}/{} below 95 %",
        rows.len()
    );
}
