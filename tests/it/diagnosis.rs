//! Where the kernel held the call, on real kernels and real filesystems: a freeze, a
//! throttled device under a random writer, an ext4 fsync behind a streaming writer, a
//! FUSE server that stops answering. Each test reads the agent's lane thread's wait point
//! itself, from outside the agent (`/proc/PID/task/TID/wchan`, and the stack as root),
//! derives the cause it expects from what it read with its own small table, and checks
//! that the agent's event, counter and live gauge name that cause. The agent's mapping
//! (`src/stall/causes.rs`) is not used here.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use crate::support::agent::Agent;
use crate::support::cmd::run_cmd;
use crate::support::loopfs::LoopFs;
use crate::support::machine;
use crate::support::metrics::Metrics;
use crate::support::mounts::mounted_at;
use crate::support::root::require_root;
use crate::support::wait::wait_until;
use crate::support::writer::{random_writer, Kick};

/// The agent names each lane thread `p<target index>-<mode>` (supervisor.rs).
fn lane_tid(agent: &Agent, mode: &str) -> u32 {
    let want = format!("p0-{mode}");
    let dir = format!("/proc/{}/task", agent.pid());
    let mut names = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let e = e.unwrap();
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if comm.trim() == want {
            return e.file_name().to_str().unwrap().parse().unwrap();
        }
        names.push(comm.trim().to_owned());
    }
    panic!("no thread {want} in {dir}: {names:?}");
}

/// What the test itself read of the lane thread while its call was blocked.
#[derive(Debug, Clone)]
struct Reading {
    op: String,
    wchan: String,
    /// Innermost first; empty where unreadable.
    stack: Vec<String>,
}

fn read_wait(pid: u32, tid: u32) -> (String, Vec<String>) {
    let dir = format!("/proc/{pid}/task/{tid}");
    let wchan = std::fs::read_to_string(format!("{dir}/wchan")).unwrap_or_default();
    let stack = std::fs::read_to_string(format!("{dir}/stack"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once("] ").map(|(_, r)| r))
        .filter_map(|r| r.split('+').next())
        .map(str::to_owned)
        .collect();
    (wchan.trim().to_owned(), stack)
}

fn inflight_of(m: &Metrics, mode: &str, op: &str) -> f64 {
    m.get(
        "stallwatch_probe_inflight_seconds",
        &[("target", "t"), ("mode", mode), ("op", op)],
    )
    .unwrap_or(0.0)
}

/// Reads lane `mode`'s wait point whenever a scrape shows one of `ops` blocked at least
/// `min_age`, and the same call still blocked on the scrape after the read (its age
/// grew); until `done` says so or `timeout`.
fn watch(
    agent: &Agent,
    mode: &str,
    ops: &[&str],
    min_age: f64,
    timeout: Duration,
    mut done: impl FnMut(&[Reading]) -> bool,
) -> Vec<Reading> {
    let tid = lane_tid(agent, mode);
    let mut readings = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < timeout && !done(&readings) {
        let before = agent.scrape();
        for op in ops {
            let age = inflight_of(&before, mode, op);
            if age < min_age {
                continue;
            }
            let (wchan, stack) = read_wait(agent.pid(), tid);
            let after = inflight_of(&agent.scrape(), mode, op);
            if after > age {
                readings.push(Reading {
                    op: op.to_string(),
                    wchan,
                    stack,
                });
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    readings
}

/// The causes the test derives from its readings, with counts: `table` maps a symbol
/// (wchan first, then the stack's frames, innermost first) to a cause.
fn derive(readings: &[Reading], op: &str, table: &[(&str, &str)]) -> BTreeMap<String, usize> {
    let find = |sym: &str| {
        table
            .iter()
            .find(|(s, _)| sym == *s || (s.ends_with('*') && sym.starts_with(&s[..s.len() - 1])))
            .map(|(_, c)| c.to_string())
    };
    let mut out = BTreeMap::new();
    for r in readings.iter().filter(|r| r.op == op) {
        let cause = find(&r.wchan).or_else(|| r.stack.iter().find_map(|f| find(f)));
        if let Some(c) = cause {
            *out.entry(c).or_default() += 1;
        }
    }
    out
}

fn stalls(agent: &Agent) -> Vec<Value> {
    let (status, body, _) = agent.get("/api/stalls");
    assert_eq!(status, 200);
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("/api/stalls: {e}: {body}"))
}

fn event_of(agent: &Agent, mode: &str, op: &str, ongoing: Option<bool>) -> Option<Value> {
    stalls(agent)
        .into_iter()
        .find(|e| e["mode"] == mode && e["op"] == op && ongoing.is_none_or(|o| e["ongoing"] == o))
}

fn counted(agent: &Agent, mode: &str, op: &str, cause: &str) -> f64 {
    agent.scrape().sum(
        "stallwatch_stalls_total",
        &[
            ("target", "t"),
            ("mode", mode),
            ("op", op),
            ("cause", cause),
        ],
    )
}

fn config(path: &Path, mode: &str) -> String {
    format!(
        "vm_interval: 200ms\nstall_threshold: 1s\ntargets:\n  - path: {}\n    name: t\n    interval: 500ms\n    modes: [{mode}]\n",
        path.display()
    )
}

/// The event's samples and verdict are consistent with its cause.
fn check_event(ev: &Value, cause: &str) {
    let wchan = ev["wchan"].as_array().expect("wchan list");
    assert!(!wchan.is_empty(), "no samples: {ev}");
    assert!(wchan[0]["count"].as_u64().unwrap() >= 1, "{ev}");
    assert!(wchan[0]["symbol"].as_str().is_some(), "{ev}");
    let verdict = ev["verdict"].as_str().unwrap();
    let op = ev["op"].as_str().unwrap();
    assert!(verdict.starts_with(&format!("{op} blocked ")), "{verdict}");
    assert!(verdict.contains(" in "), "names the wait point: {verdict}");
    assert_eq!(ev["cause"], cause, "{ev}");
    // Root reads the stack; its frames are symbols without offsets.
    let stack = ev["stack"].as_array().expect("stack readable as root");
    assert!(
        stack.iter().all(|f| !f.as_str().unwrap().contains('+')),
        "{ev}"
    );
}

/// A create held in the kernel (the caller has blocked it): watches the create lane
/// until the test has read its wait 10 times, takes the live metrics and the ongoing
/// event, calls `release`, then checks that every reading of the test maps to `cause` by
/// `table` (else fails with `why`), that the live blocked-cause gauge and the event say
/// `cause`, and that the cause was counted once. Returns the event.
fn blocked_create(
    agent: &Agent,
    release: impl FnOnce(),
    table: &[(&str, &str)],
    cause: &str,
    why: &str,
) -> Value {
    let readings = watch(
        agent,
        "create",
        &["create"],
        0.3,
        Duration::from_secs(20),
        |r| r.len() >= 10,
    );
    let live = agent.scrape();
    let ev = event_of(agent, "create", "create", Some(true));
    release();
    let mine = derive(&readings, "create", table);
    assert_eq!(
        mine.get(cause).copied(),
        Some(readings.len()),
        "{why}: {readings:?}"
    );
    let blocked = live.series("stallwatch_probe_blocked_cause");
    assert!(
        blocked
            .iter()
            .any(|(l, v)| *v == 1.0 && l["op"] == "create" && l["cause"] == cause),
        "live cause of the blocked create: {blocked:?}"
    );
    let ev = ev.expect("an ongoing create stall");
    check_event(&ev, cause);
    assert_eq!(counted(agent, "create", "create", cause), 1.0);
    ev
}

#[test]
fn a_frozen_filesystem_is_diagnosed_frozen() {
    if !require_root("a_frozen_filesystem_is_diagnosed_frozen") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("ext4", 64);
    let agent = Agent::start(&config(fs.path(), "create"));
    assert!(agent.wait_up("t"));
    fs.freeze();
    let mut page = String::new();
    let ev = blocked_create(
        &agent,
        || {
            page = agent.get("/").1;
            fs.thaw();
        },
        &[("percpu_rwsem_wait", "frozen")],
        "frozen",
        "every reading of a frozen create waits on the freeze rwsem",
    );
    assert!(
        page.contains("in percpu_rwsem_wait (filesystem frozen)"),
        "the landing page's stall table shows the verdict: {page}"
    );
    assert!(
        ev["verdict"]
            .as_str()
            .unwrap()
            .contains("(filesystem frozen)"),
        "{ev}"
    );
    // The log line that ends the stall carries the verdict.
    assert!(
        agent.wait_log("stall ended", Duration::from_secs(10)),
        "{}",
        agent.log_tail(20)
    );
    let line = agent
        .logs()
        .into_iter()
        .find(|l| l.contains("stall ended") && l.contains("op=create"))
        .expect("stall ended line for create");
    assert!(line.contains("cause=frozen"), "{line}");
    assert!(line.contains("verdict="), "{line}");
}

/// The symbols that mean dirty throttling, writeback or journal waits, as the test
/// reads them (wchan or stack frames).
const WRITEBACK_TABLE: &[(&str, &str)] = &[
    ("balance_dirty_pages", "dirty_throttle"),
    ("folio_wait_writeback", "writeback_wait"),
    ("__filemap_fdatawait_range", "writeback_wait"),
    ("filemap_fdatawait*", "writeback_wait"),
    ("wb_wait_for_completion", "writeback_wait"),
    ("jbd2_*", "journal"),
    ("xlog_*", "journal"),
    ("xfs_log_force*", "journal"),
];

/// Sequential 1 MiB buffered writes into one file, up to 32 MiB or 50 s.
fn streaming_writer(path: &Path, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    let path = path.to_owned();
    std::thread::spawn(move || {
        use std::io::Write;
        let mut f = std::fs::File::create(&path).unwrap();
        let buf = vec![0xa5u8; 1 << 20];
        let t0 = Instant::now();
        for _ in 0..32 {
            if stop.load(Ordering::Relaxed) || t0.elapsed() > Duration::from_secs(50) {
                break;
            }
            f.write_all(&buf).unwrap();
        }
    })
}

/// Watches the overwrite lane under a load until a stall of one of `ops` has been
/// sampled by the agent and read by the test a few times, lifts the throttle, waits for
/// that stall to end, then checks the agent's cause against the test's own reading.
fn writeback_case(fs: &mut LoopFs, agent: &Agent, ops: &[&str], allowed: &[&str]) {
    let mut seen: Option<Value> = None;
    let readings = watch(agent, "overwrite", ops, 0.3, Duration::from_secs(40), |r| {
        seen = stalls(agent).into_iter().find(|e| {
            ops.contains(&e["op"].as_str().unwrap())
                && e["wchan"].as_array().is_some_and(|w| {
                    w.iter().map(|c| c["count"].as_u64().unwrap()).sum::<u64>() >= 5
                })
                && r.iter().filter(|x| x.op == e["op"]).count() >= 5
        });
        seen.is_some()
    });
    fs.unthrottle();
    let seen = seen.unwrap_or_else(|| {
        panic!(
            "no stall of {ops:?} sampled by the agent and the test; test readings: {readings:?}\n{:?}",
            stalls(agent)
        )
    });
    let started = seen["started_at"].clone();
    let mut ev = None;
    assert!(
        wait_until(Duration::from_secs(40), Duration::from_millis(200), || {
            ev = stalls(agent).into_iter().find(|e| {
                e["started_at"] == started && e["op"] == seen["op"] && e["ongoing"] == false
            });
            ev.is_some()
        }),
        "the stall did not end within 40 s of lifting the throttle: {seen}"
    );
    let ev = ev.unwrap();
    let op = ev["op"].as_str().unwrap();
    let mine = derive(&readings, op, WRITEBACK_TABLE);
    let cause = ev["cause"].as_str().unwrap();
    assert!(
        allowed.contains(&cause),
        "agent's cause {cause} not among {allowed:?}: {ev}"
    );
    assert!(
        mine.contains_key(cause),
        "the agent says {cause}; the test read {mine:?} from {readings:?}\n{ev}"
    );
    check_event(&ev, cause);
    assert!(
        ev["verdict"].as_str().unwrap().contains("dirty "),
        "writeback verdicts give the dirty state: {ev}"
    );
    let counted_cause = ev["counted_cause"].as_str().unwrap();
    assert!(
        counted(agent, "overwrite", op, counted_cause) >= 1.0,
        "{ev}"
    );
}

#[test]
fn a_throttled_device_under_a_random_writer_is_dirty_throttling_or_writeback() {
    if !require_root("a_throttled_device_under_a_random_writer_is_dirty_throttling_or_writeback") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("xfs", 320);
    let agent = Agent::start(&config(fs.path(), "overwrite"));
    assert!(agent.wait_up("t"));
    fs.throttle_write_bps(1 << 20);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = random_writer(
        &fs.path().join("big"),
        Arc::clone(&stop),
        12288,
        Duration::from_secs(50),
        Kick::FadviseDontneed,
    );
    writeback_case(
        &mut fs,
        &agent,
        &["write", "fsync"],
        &["dirty_throttle", "writeback_wait"],
    );
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
}

#[test]
fn an_ext4_fsync_behind_a_streaming_writer_waits_for_the_journal_or_writeback() {
    if !require_root("an_ext4_fsync_behind_a_streaming_writer_waits_for_the_journal_or_writeback") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("ext4", 256);
    let agent = Agent::start(&config(fs.path(), "overwrite"));
    assert!(agent.wait_up("t"));
    fs.throttle_write_bps(4 << 20);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = streaming_writer(&fs.path().join("stream"), Arc::clone(&stop));
    writeback_case(&mut fs, &agent, &["fsync"], &["journal", "writeback_wait"]);
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
}

// ---------------------------------------------------------------------------------------
// A FUSE filesystem whose server stops answering (an NFS server gone away)

const TTL: Duration = Duration::from_secs(0);

struct Node {
    parent: u64,
    name: OsString,
    dir: bool,
}

/// An in-memory filesystem whose create, mkdir, unlink, write and fsync handlers wait
/// while `hang` is set (bounded to 60 s), like a hard NFS mount whose server is gone.
/// Served by several threads, so lookups and getattr keep being answered.
struct HangFs {
    nodes: Mutex<HashMap<u64, Node>>,
    next: AtomicU64,
    hang: Arc<AtomicBool>,
    uid: u32,
    gid: u32,
}

impl HangFs {
    fn hold(&self) {
        let t0 = Instant::now();
        while self.hang.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn attr(&self, ino: u64, dir: bool) -> fuser::FileAttr {
        fuser::FileAttr {
            ino: fuser::INodeNo(ino),
            size: 0,
            blocks: 0,
            atime: SystemTime::now(),
            mtime: SystemTime::now(),
            ctime: SystemTime::now(),
            crtime: SystemTime::now(),
            kind: if dir {
                fuser::FileType::Directory
            } else {
                fuser::FileType::RegularFile
            },
            perm: match (ino, dir) {
                (1, _) => 0o755,
                (_, true) => 0o700,
                _ => 0o600,
            },
            nlink: if dir { 2 } else { 1 },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        }
    }

    fn child(&self, parent: u64, name: &OsStr) -> Option<(u64, bool)> {
        let nodes = self.nodes.lock().unwrap();
        nodes
            .iter()
            .find(|(_, n)| n.parent == parent && n.name == name)
            .map(|(&i, n)| (i, n.dir))
    }

    fn add(&self, parent: u64, name: &OsStr, dir: bool) -> u64 {
        let ino = self.next.fetch_add(1, Ordering::Relaxed);
        self.nodes.lock().unwrap().insert(
            ino,
            Node {
                parent,
                name: name.to_owned(),
                dir,
            },
        );
        ino
    }
}

impl fuser::Filesystem for HangFs {
    fn lookup(
        &self,
        _req: &fuser::Request,
        parent: fuser::INodeNo,
        name: &OsStr,
        reply: fuser::ReplyEntry,
    ) {
        match self.child(parent.0, name) {
            Some((ino, dir)) => reply.entry(&TTL, &self.attr(ino, dir), fuser::Generation(0)),
            None => reply.error(fuser::Errno::ENOENT),
        }
    }

    fn getattr(
        &self,
        _req: &fuser::Request,
        ino: fuser::INodeNo,
        _fh: Option<fuser::FileHandle>,
        reply: fuser::ReplyAttr,
    ) {
        let dir = self.nodes.lock().unwrap().get(&ino.0).map(|n| n.dir);
        match dir {
            Some(dir) => reply.attr(&TTL, &self.attr(ino.0, dir)),
            None => reply.error(fuser::Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &fuser::Request,
        ino: fuser::INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<fuser::FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: fuser::ReplyAttr,
    ) {
        let dir = self.nodes.lock().unwrap().get(&ino.0).map(|n| n.dir);
        match dir {
            Some(dir) => reply.attr(&TTL, &self.attr(ino.0, dir)),
            None => reply.error(fuser::Errno::ENOENT),
        }
    }

    fn mkdir(
        &self,
        _req: &fuser::Request,
        parent: fuser::INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: fuser::ReplyEntry,
    ) {
        self.hold();
        if self.child(parent.0, name).is_some() {
            return reply.error(fuser::Errno::EEXIST);
        }
        let ino = self.add(parent.0, name, true);
        reply.entry(&TTL, &self.attr(ino, true), fuser::Generation(0));
    }

    fn create(
        &self,
        _req: &fuser::Request,
        parent: fuser::INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: fuser::ReplyCreate,
    ) {
        self.hold();
        if self.child(parent.0, name).is_some() {
            return reply.error(fuser::Errno::EEXIST);
        }
        let ino = self.add(parent.0, name, false);
        reply.created(
            &TTL,
            &self.attr(ino, false),
            fuser::Generation(0),
            fuser::FileHandle(ino),
            fuser::FopenFlags::empty(),
        );
    }

    fn unlink(
        &self,
        _req: &fuser::Request,
        parent: fuser::INodeNo,
        name: &OsStr,
        reply: fuser::ReplyEmpty,
    ) {
        self.hold();
        match self.child(parent.0, name) {
            Some((ino, _)) => {
                self.nodes.lock().unwrap().remove(&ino);
                reply.ok()
            }
            None => reply.error(fuser::Errno::ENOENT),
        }
    }

    fn write(
        &self,
        _req: &fuser::Request,
        _ino: fuser::INodeNo,
        _fh: fuser::FileHandle,
        _offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: fuser::ReplyWrite,
    ) {
        self.hold();
        reply.written(data.len() as u32);
    }

    fn flush(
        &self,
        _req: &fuser::Request,
        _ino: fuser::INodeNo,
        _fh: fuser::FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: fuser::ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &fuser::Request,
        _ino: fuser::INodeNo,
        _fh: fuser::FileHandle,
        _datasync: bool,
        reply: fuser::ReplyEmpty,
    ) {
        self.hold();
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &fuser::Request,
        ino: fuser::INodeNo,
        _fh: fuser::FileHandle,
        offset: u64,
        mut reply: fuser::ReplyDirectory,
    ) {
        let mut entries = vec![
            (ino.0, fuser::FileType::Directory, OsString::from(".")),
            (ino.0, fuser::FileType::Directory, OsString::from("..")),
        ];
        {
            let nodes = self.nodes.lock().unwrap();
            let mut children: Vec<_> = nodes.iter().filter(|(_, n)| n.parent == ino.0).collect();
            children.sort_by_key(|(i, _)| **i);
            for (&i, n) in children {
                let kind = if n.dir {
                    fuser::FileType::Directory
                } else {
                    fuser::FileType::RegularFile
                };
                entries.push((i, kind, n.name.clone()));
            }
        }
        for (k, (i, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(fuser::INodeNo(i), (k + 1) as u64, kind, &name) {
                break;
            }
        }
        reply.ok();
    }
}

/// A mounted [`HangFs`] in a temporary directory. Drop lets held calls go first, then
/// unmounts (lazily if still busy).
pub(crate) struct FuseMount {
    pub(crate) hang: Arc<AtomicBool>,
    session: Option<fuser::BackgroundSession>,
    pub(crate) mnt: PathBuf,
    _dir: tempfile::TempDir,
}

impl FuseMount {
    pub(crate) fn new() -> FuseMount {
        if !Path::new("/dev/fuse").exists() {
            let _ = run_cmd("modprobe", &["fuse"]);
        }
        assert!(
            Path::new("/dev/fuse").exists(),
            "/dev/fuse missing: this kernel has no FUSE (modprobe fuse failed)"
        );
        let dir = tempfile::Builder::new()
            .prefix("stallwatch-fuse-")
            .tempdir()
            .unwrap();
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let hang = Arc::new(AtomicBool::new(false));
        let mut nodes = HashMap::new();
        nodes.insert(
            1,
            Node {
                parent: 1,
                name: OsString::new(),
                dir: true,
            },
        );
        let fs = HangFs {
            nodes: Mutex::new(nodes),
            next: AtomicU64::new(2),
            hang: Arc::clone(&hang),
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("stallwatch-hang".into()),
            fuser::MountOption::Subtype("hang".into()),
        ];
        config.n_threads = Some(4);
        let session = fuser::spawn_mount(fs, &mnt, &config).expect("FUSE mount");
        assert!(
            wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
                mounted_at(&mnt).is_some()
            }),
            "FUSE filesystem not mounted at {}",
            mnt.display()
        );
        FuseMount {
            hang,
            session: Some(session),
            mnt,
            _dir: dir,
        }
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        self.hang.store(false, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(100));
        if let Some(s) = self.session.take() {
            if s.umount_and_join().is_err() {
                let _ = run_cmd("umount", &["-l", self.mnt.to_str().unwrap()]);
            }
        }
    }
}

#[test]
fn a_fuse_server_that_stops_answering_is_diagnosed_remote() {
    if !require_root("a_fuse_server_that_stops_answering_is_diagnosed_remote") {
        return;
    }
    let _machine = machine::shared();
    let fuse = FuseMount::new();
    let agent = Agent::start(&config(&fuse.mnt, "create"));
    assert!(agent.wait_up("t"), "{}", agent.log_tail(20));
    fuse.hang.store(true, Ordering::Relaxed);
    blocked_create(
        &agent,
        || fuse.hang.store(false, Ordering::Relaxed),
        &[("request_wait_answer", "remote"), ("fuse_*", "remote")],
        "remote",
        "a create on an unanswered FUSE server waits for the answer",
    );
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(100), || {
            event_of(&agent, "create", "create", Some(false)).is_some()
        }),
        "the stall ends once the server answers"
    );
    let done = event_of(&agent, "create", "create", Some(false)).unwrap();
    assert_eq!(done["cause"], "remote", "{done}");
    assert!(
        done["verdict"]
            .as_str()
            .unwrap()
            .contains("(network or FUSE filesystem)"),
        "{done}"
    );
    drop(agent);
    drop(fuse);
}
