//! The stall record on disk (`--storage.path DIR`): the stall log's events, with their
//! evidence, kept across restarts, upgrades and crashes.
//!
//! One thread of its own (`stall-store`) loads `DIR/stalls.jsonl` at start, hands the
//! events to the log as restored, then writes the log again when it changed: within a
//! second of an event's start, its end, its first wait point and evidence reading and
//! its completed evidence; an ongoing event's progress (its duration so far) every
//! [`PROGRESS_PERIOD`], so the record adds little to a disk that may be the stalled one.
//! No probe lane, no watchdog and no HTTP request ever waits on it: it takes the log's
//! lock only to copy the events out, as a page load does. A state disk that hangs holds
//! up this thread alone; the agent's shutdown waits for it [`SHUTDOWN_WAIT`], not more,
//! though the process, like one with a blocked probe, ends only when the kernel lets
//! that write return.
//!
//! The format is JSON lines: a header line (`{"format":"stallwatch-stalls","version":1,
//! "events":N,...}`), then one line per event, newest first, each
//! `{"event":{..as /api/stalls..},"symbol":..,"intervals":[[..]..]}` (what the API does
//! not serve but the verdict and the stall page need). Each write goes to
//! `stalls.jsonl.tmp`, is fsynced, renamed over `stalls.jsonl`, and the directory is
//! fsynced: at any instant the file is the previous complete record or the new one. A
//! file cut short anyway (a filesystem that does not keep that order, a copy) loads
//! what is whole; the header's count says how many events the cut cost. A file that is
//! not a record at all is renamed `stalls.jsonl.corrupt-UNIXTIME`, never deleted.
//!
//! Every failure (missing directory that cannot be created, read-only, full, garbage)
//! counts `stallwatch_storage_errors_total`, is logged once until a write succeeds
//! again, and the next change is tried again a second later.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::exposition::registry::Registry;
use crate::stall::event::StallEvent;
use crate::stall::evidence::DeviceInterval;
use crate::stall::log::StallLog;

/// The record's file name in the state directory.
pub const FILE: &str = "stalls.jsonl";
/// Where a write goes before it is renamed over [`FILE`].
pub const TMP_FILE: &str = "stalls.jsonl.tmp";
/// Held (`flock`) by the agent that keeps the record in the directory.
pub const LOCK_FILE: &str = ".lock";
/// The header's `format`.
const FORMAT: &str = "stallwatch-stalls";
const VERSION: u32 = 1;
/// The most a record may take on disk: older events are left out past it. Also the
/// most read at start (a larger file is not a record this agent wrote).
pub const MAX_BYTES: usize = 16 << 20;
/// The pause between two looks at the log.
pub const PERIOD: Duration = Duration::from_secs(1);
/// How often an ongoing event's progress (its duration so far, a new reading of its
/// evidence) is written when nothing else changed. An event that starts or ends, its
/// first wait point and evidence reading, its completed evidence are written at the next
/// look, within [`PERIOD`].
pub const PROGRESS_PERIOD: Duration = Duration::from_secs(5);
/// How long shutdown waits for the last write.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);

/// A failure of the stall record, with the path it concerns.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path} is not a stall record ({why}); moved aside to {aside}")]
    Garbage {
        path: PathBuf,
        why: String,
        aside: PathBuf,
    },
    #[error("{path} is not a stall record ({why}), and could not be moved aside: {source}")]
    GarbageStays {
        path: PathBuf,
        why: String,
        source: io::Error,
    },
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_owned(),
        source,
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    format: String,
    version: u32,
    /// Event lines that follow.
    events: usize,
}

/// One event line as written.
#[derive(Serialize)]
struct RecordOut<'a> {
    event: &'a StallEvent,
    symbol: Option<&'a str>,
    intervals: Vec<&'a [DeviceInterval]>,
}

/// One event line as read.
#[derive(Deserialize)]
struct RecordIn {
    event: StallEvent,
    #[serde(default)]
    symbol: Option<String>,
    #[serde(default)]
    intervals: Vec<Vec<DeviceInterval>>,
}

/// The bytes of a record of `events` (newest first), the oldest left out past
/// `max_bytes`.
pub fn encode(events: &[StallEvent], max_bytes: usize) -> Vec<u8> {
    let mut lines: Vec<Vec<u8>> = Vec::with_capacity(events.len());
    let mut size = 0;
    for ev in events {
        let rec = RecordOut {
            event: ev,
            symbol: ev.symbol.as_deref(),
            intervals: ev
                .evidence
                .block_devices
                .iter()
                .map(|d| d.intervals.as_slice())
                .collect(),
        };
        let Ok(mut line) = serde_json::to_vec(&rec) else {
            continue;
        };
        line.push(b'\n');
        if size + line.len() > max_bytes.saturating_sub(128) {
            break;
        }
        size += line.len();
        lines.push(line);
    }
    let header = Header {
        format: FORMAT.into(),
        version: VERSION,
        events: lines.len(),
    };
    let mut out = serde_json::to_vec(&header).expect("a header serializes");
    out.push(b'\n');
    out.reserve(size);
    for l in lines {
        out.extend_from_slice(&l);
    }
    out
}

/// What a record file held.
#[derive(Debug)]
pub enum Decoded {
    /// The events that loaded, newest first, and how many the header announced that
    /// did not (a torn or damaged tail).
    Record {
        events: Vec<StallEvent>,
        lost: usize,
    },
    /// Not a record: why.
    Garbage(String),
}

/// Reads a record's bytes.
pub fn decode(bytes: &[u8]) -> Decoded {
    let mut lines = bytes.split(|&b| b == b'\n');
    let first = lines.next().unwrap_or_default();
    let header: Header = match serde_json::from_slice(first) {
        Ok(h) => h,
        Err(e) => return Decoded::Garbage(format!("no header line: {e}")),
    };
    if header.format != FORMAT {
        return Decoded::Garbage(format!("format {:?}", header.format));
    }
    if header.version != VERSION {
        return Decoded::Garbage(format!(
            "version {} (this agent reads {VERSION})",
            header.version
        ));
    }
    let mut events = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        // A line that does not parse is a torn or damaged one: it costs its event only.
        if let Ok(rec) = serde_json::from_slice::<RecordIn>(line) {
            let mut ev = rec.event;
            ev.symbol = rec.symbol;
            for (d, iv) in ev.evidence.block_devices.iter_mut().zip(rec.intervals) {
                d.intervals = iv;
            }
            events.push(ev);
        }
    }
    let lost = header.events.saturating_sub(events.len());
    Decoded::Record { events, lost }
}

/// Writes `bytes` as the record in `dir`: to the temporary file, fsynced, renamed over
/// the record, the directory fsynced. The temporary file is removed on failure (on a
/// full disk it holds the space a later write needs).
pub fn write(dir: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    if !dir.is_dir() {
        fs::create_dir_all(dir).map_err(io_at(dir))?;
    }
    let tmp = dir.join(TMP_FILE);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_at(&tmp))?;
        f.write_all(bytes).map_err(io_at(&tmp))?;
        f.sync_all().map_err(io_at(&tmp))?;
        drop(f);
        let file = dir.join(FILE);
        fs::rename(&tmp, &file).map_err(io_at(&file))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_at(dir))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// What [`load`] found in `dir`.
#[derive(Debug, Default)]
pub struct Loaded {
    pub events: Vec<StallEvent>,
    /// Events the header announced that did not load.
    pub lost: usize,
}

/// Reads the record in `dir`: nothing when there is none; a file that is not a record
/// is moved aside (`stalls.jsonl.corrupt-UNIXTIME`) and reported as an error, after
/// which the directory starts a new record.
pub fn load(dir: &Path) -> Result<Loaded, StoreError> {
    let path = dir.join(FILE);
    let mut bytes = Vec::new();
    match File::open(&path) {
        Ok(f) => {
            f.take(MAX_BYTES as u64 + 1)
                .read_to_end(&mut bytes)
                .map_err(io_at(&path))?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Loaded::default()),
        Err(e) => return Err(io_at(&path)(e)),
    }
    let decoded = if bytes.len() > MAX_BYTES {
        Decoded::Garbage(format!("larger than {MAX_BYTES} bytes"))
    } else {
        decode(&bytes)
    };
    match decoded {
        Decoded::Record { events, lost } => Ok(Loaded { events, lost }),
        Decoded::Garbage(why) => match move_aside(dir) {
            Ok(aside) => Err(StoreError::Garbage { path, why, aside }),
            Err(source) => Err(StoreError::GarbageStays { path, why, source }),
        },
    }
}

/// Why the directory's lock was not taken.
enum LockError {
    /// Another agent holds it.
    Held,
    /// The lock file could not be made (a missing, read-only or full directory).
    Io(StoreError),
}

/// Takes `dir`'s lock for as long as the returned file is open, creating `dir` when it
/// is missing.
fn take_lock(dir: &Path) -> Result<File, LockError> {
    let path = dir.join(LOCK_FILE);
    if !dir.is_dir() {
        fs::create_dir_all(dir).map_err(|e| LockError::Io(io_at(dir)(e)))?;
    }
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(|e| LockError::Io(io_at(&path)(e)))?;
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(f),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(LockError::Held),
        Err(e) => Err(LockError::Io(io_at(&path)(e.into()))),
    }
}

/// Renames the record in `dir` to `stalls.jsonl.corrupt-UNIXTIME` beside it.
fn move_aside(dir: &Path) -> io::Result<PathBuf> {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let aside = dir.join(format!("{FILE}.corrupt-{secs}"));
    fs::rename(dir.join(FILE), &aside)?;
    Ok(aside)
}

/// `stallwatch_storage_errors_total`, registered whether or not a directory is given
/// (0 without one), so an alert on it needs no `absent()`.
pub fn register(registry: &Registry) -> Arc<prometheus::IntCounter> {
    let c = prometheus::IntCounter::new(
        "stallwatch_storage_errors_total",
        "Failures of the stall record in --storage.path: a read, a write (read-only, full, missing directory) or a file that was not a record (moved aside).",
    )
    .expect("valid metric definition");
    registry
        .register(Box::new(c.clone()))
        .expect("registered once");
    Arc::new(c)
}

/// The running store thread.
pub struct Store {
    stop: mpsc::Sender<()>,
    done: mpsc::Receiver<()>,
}

impl Store {
    /// Starts the thread that loads `dir`'s record into `log` and keeps it written.
    pub fn start(
        dir: PathBuf,
        log: Arc<StallLog>,
        errors: Arc<prometheus::IntCounter>,
    ) -> io::Result<Store> {
        let (stop, stopped) = mpsc::channel();
        let (finished, done) = mpsc::channel();
        std::thread::Builder::new()
            .name("stall-store".into())
            .spawn(move || {
                run(&dir, &log, &errors, &stopped);
                let _ = finished.send(());
            })?;
        Ok(Store { stop, done })
    }

    /// Asks for a last write and waits for it up to `wait`; a thread held by a hung
    /// disk is left behind (the process exits without it).
    pub fn stop(self, wait: Duration) {
        let _ = self.stop.send(());
        if self.done.recv_timeout(wait).is_err() {
            warn!(
                wait_seconds = wait.as_secs_f64(),
                "stall record: the last write did not finish in time; exiting without it"
            );
        }
    }
}

/// Logs a failure once until a write succeeds again; counts every one.
struct Failing {
    errors: Arc<prometheus::IntCounter>,
    since: Option<SystemTime>,
}

impl Failing {
    fn failed(&mut self, e: &StoreError) {
        self.errors.inc();
        if self.since.is_none() {
            self.since = Some(SystemTime::now());
            warn!(error = %e, "stall record not written; the agent runs on and tries again every second (logged once until it succeeds)");
        }
    }

    fn succeeded(&mut self, dir: &Path) {
        if let Some(since) = self.since.take() {
            let secs = since.elapsed().unwrap_or_default().as_secs_f64();
            info!(dir = %dir.display(), failing_seconds = secs, "stall record written again");
        }
    }
}

/// What of each event decides whether a write waits for [`PROGRESS_PERIOD`]: an event
/// that appeared or ended, its first wait point or evidence, its evidence completed.
type Shape = Vec<(String, bool, bool, bool, bool)>;

fn shape(events: &[StallEvent]) -> Shape {
    events
        .iter()
        .map(|e| {
            (
                e.id.clone(),
                e.ongoing,
                e.evidence.complete,
                e.evidence.reads > 0,
                !e.wchan.is_empty(),
            )
        })
        .collect()
}

/// How the record in the directory stands before this run's first write.
enum Found {
    /// Loaded, absent, or moved aside: it may be written over.
    Free,
    /// Not a record, and it could not be moved aside: moved before the first write.
    GarbageStays,
    /// It could not be read (EIO, EACCES…): read again before the first write, never
    /// written over unread.
    Unread,
}

/// Loads the record into `log`; what is left to do before writing over it.
fn load_into(dir: &Path, log: &StallLog, errors: &prometheus::IntCounter) -> Found {
    match load(dir) {
        Ok(loaded) => {
            let read = loaded.events.len();
            let kept = log.restore(loaded.events);
            if loaded.lost > 0 {
                warn!(file = %dir.join(FILE).display(), lost = loaded.lost, restored = kept,
                    "stall record cut short: {} event(s) lost, the others restored", loaded.lost);
            }
            info!(dir = %dir.display(), read, restored = kept, "stall record loaded");
            Found::Free
        }
        Err(e) => {
            errors.inc();
            warn!(error = %e, "stall record not loaded");
            match e {
                StoreError::Garbage { .. } => Found::Free,
                StoreError::GarbageStays { .. } => Found::GarbageStays,
                StoreError::Io { .. } => Found::Unread,
            }
        }
    }
}

fn run(
    dir: &Path,
    log: &StallLog,
    errors: &Arc<prometheus::IntCounter>,
    stop: &mpsc::Receiver<()>,
) {
    let mut failing = Failing {
        errors: Arc::clone(errors),
        since: None,
    };
    let held = || {
        errors.inc();
        warn!(dir = %dir.display(), "stall record: {} is in use by another agent; this one keeps no record", dir.display());
    };
    // Taken before the record is read; where the directory cannot hold the lock file yet
    // (missing and not creatable, read-only), taken again before the first write.
    let mut lock = match take_lock(dir) {
        Ok(f) => Some(f),
        Err(LockError::Held) => return held(),
        Err(LockError::Io(_)) => None,
    };
    // A record that could not be read, or a file that is not a record but could not be
    // moved aside (a read-only directory), is dealt with before anything is written
    // over it: it is never deleted.
    let mut found = load_into(dir, log, errors);
    // The record just loaded is not written back until the log changes.
    let mut written = log.changes();
    let mut written_shape: Option<Shape> = None;
    let mut last_write = Instant::now();
    loop {
        let last = match stop.recv_timeout(PERIOD) {
            Ok(()) | Err(RecvTimeoutError::Disconnected) => true,
            Err(RecvTimeoutError::Timeout) => false,
        };
        // After a failure, the next look writes whether or not the log changed since.
        let known = failing.since.is_none().then_some(written);
        if let (changes, Some(mut events)) = log.events_if_changed(known) {
            let mut now_shape = shape(&events);
            // An ongoing event's duration and evidence move every second; written every
            // PROGRESS_PERIOD only, so the record does not load the disk it may share
            // with the stall being diagnosed.
            let progress_only = failing.since.is_none()
                && written_shape.as_ref() == Some(&now_shape)
                && events.iter().any(|e| e.ongoing);
            if progress_only && !last && last_write.elapsed() < PROGRESS_PERIOD {
                continue;
            }
            let locked = match lock {
                Some(_) => Ok(()),
                None => match take_lock(dir) {
                    Ok(f) => {
                        lock = Some(f);
                        Ok(())
                    }
                    Err(LockError::Held) => return held(),
                    Err(LockError::Io(e)) => Err(e),
                },
            };
            let ready = locked.and_then(|()| match found {
                Found::Free => Ok(()),
                Found::GarbageStays => match move_aside(dir) {
                    Ok(aside) => {
                        warn!(aside = %aside.display(), "the file that was not a stall record is moved aside");
                        found = Found::Free;
                        Ok(())
                    }
                    // Someone removed it meanwhile: nothing is left to keep.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        found = Found::Free;
                        Ok(())
                    }
                    Err(e) => Err(io_at(&dir.join(FILE))(e)),
                },
                Found::Unread => {
                    found = load_into(dir, log, errors);
                    match found {
                        Found::Free => {
                            // The record read just now joined the log: write them all.
                            events = log.events();
                            now_shape = shape(&events);
                            Ok(())
                        }
                        _ => Err(io_at(&dir.join(FILE))(io::Error::other(
                            "the record there could not be read yet; not written over",
                        ))),
                    }
                }
            });
            match ready.and_then(|()| write(dir, &encode(&events, MAX_BYTES))) {
                Ok(()) => {
                    written = changes;
                    written_shape = Some(now_shape);
                    last_write = Instant::now();
                    failing.succeeded(dir);
                }
                Err(e) => failing.failed(&e),
            }
        }
        if last {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stall::evidence::DeviceFigures;

    fn event(id: &str, ongoing: bool) -> StallEvent {
        let json = serde_json::json!({
            "id": id, "target": "t", "mode": "overwrite", "op": "fsync",
            "started_at": "2026-12-04T17:00:00.123Z", "duration_seconds": 2.5,
            "ongoing": ongoing, "error": null,
            "vm": {"dirty_bytes_start": 1, "dirty_bytes_max": 2, "writeback_bytes_max": 3,
                   "dirty_threshold_bytes": 4, "dirty_background_threshold_bytes": 5,
                   "io_pressure_some_seconds": null, "io_pressure_full_seconds": 0.5},
            "md": [{"device": "md0", "sync_action": "check"}, {"device": "md1", "sync_action": "unknown"}],
            "device": {"device": "sdb", "inflight_requests_max": 7},
            "also_blocked": [{"mode": "create", "op": "create", "blocked_seconds": 1.5}],
            "wchan": [{"symbol": "percpu_rwsem_wait", "count": 9}],
            "stack": null, "cause": "frozen", "counted_cause": "frozen",
            "verdict": "fsync blocked", "evidence": {"reads": 3, "complete": false,
              "cgroup_version": 2, "cgroups_walked": 4, "cgroup_reads_capped": 0,
              "dirtiers": [], "writers": [], "processes_unreadable": 0,
              "block_devices": [], "journal": null}
        });
        let mut ev: StallEvent = serde_json::from_value(json).unwrap();
        ev.symbol = Some("percpu_rwsem_wait".into());
        ev.evidence.block_devices.push(DeviceFigures {
            device: "sdb".into(),
            role: "disk",
            intervals: vec![DeviceInterval {
                start_seconds: 0.0,
                seconds: 1.0,
                write_bytes_per_second: 4096.0,
                write_latency_seconds: None,
                utilisation: 0.5,
                flushes: Some(1),
            }],
            ..DeviceFigures::default()
        });
        ev
    }

    /// A record written by the agent at format version 1 (a 3.4 s freeze of an ext4
    /// loop filesystem: the create and the overwrite lanes' events). Every later agent
    /// reads it whole: a field added to an event must come with `#[serde(default)]`, or
    /// an upgrade would lose every stored event.
    #[test]
    fn a_version_1_record_written_by_the_agent_still_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/stalls.v1.jsonl");
        let Decoded::Record { events, lost } = decode(&fs::read(path).unwrap()) else {
            panic!("not a record");
        };
        assert_eq!((events.len(), lost), (2, 0));
        for e in &events {
            assert_eq!(e.target, "data");
            assert!(!e.ongoing && e.evidence.complete, "{}", e.id);
            assert!(e.duration_seconds > 1.0, "{}", e.id);
            assert!(!e.wchan.is_empty() && e.symbol.is_some(), "{}", e.id);
            assert!(
                e.evidence
                    .block_devices
                    .iter()
                    .any(|d| !d.intervals.is_empty()),
                "{}: the device window",
                e.id
            );
        }
    }

    #[test]
    fn a_record_round_trips_with_what_the_api_does_not_serve() {
        let events = vec![event("a-1-2", true), event("a-1-1", false)];
        let bytes = encode(&events, MAX_BYTES);
        let Decoded::Record { events: back, lost } = decode(&bytes) else {
            panic!("not read back");
        };
        assert_eq!(lost, 0);
        assert_eq!(back.len(), 2);
        for (a, b) in events.iter().zip(&back) {
            assert_eq!(
                serde_json::to_value(a).unwrap(),
                serde_json::to_value(b).unwrap()
            );
            assert_eq!(a.symbol, b.symbol);
            assert_eq!(
                a.evidence.block_devices[0].intervals,
                b.evidence.block_devices[0].intervals
            );
        }
        assert_eq!(back[0].md[1].sync_action, None);
    }

    #[test]
    fn a_cut_record_loads_what_is_whole_and_counts_the_rest() {
        let events: Vec<_> = (0..5).map(|i| event(&format!("a-1-{i}"), false)).collect();
        let bytes = encode(&events, MAX_BYTES);
        let lines: Vec<usize> = bytes
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n')
            .map(|(i, _)| i)
            .collect();
        // Cut in the middle of the fourth event: three whole, two lost.
        let cut = (lines[3] + lines[4]) / 2;
        match decode(&bytes[..cut]) {
            Decoded::Record { events, lost } => assert_eq!((events.len(), lost), (3, 2)),
            d => panic!("{d:?}"),
        }
        // Cut right after a line: the header's count still tells.
        match decode(&bytes[..=lines[2]]) {
            Decoded::Record { events, lost } => assert_eq!((events.len(), lost), (2, 3)),
            d => panic!("{d:?}"),
        }
        assert!(matches!(decode(b"\x00\x01garbage"), Decoded::Garbage(_)));
        assert!(matches!(decode(b""), Decoded::Garbage(_)));
        assert!(matches!(
            decode(b"{\"format\":\"other\",\"version\":1,\"events\":0}\n"),
            Decoded::Garbage(_)
        ));
    }

    #[test]
    fn the_byte_cap_leaves_out_the_oldest() {
        let events: Vec<_> = (0..50).map(|i| event(&format!("a-1-{i}"), false)).collect();
        let one = encode(&events[..1], MAX_BYTES).len();
        let bytes = encode(&events, one * 10);
        assert!(bytes.len() <= one * 10);
        let Decoded::Record { events: back, lost } = decode(&bytes) else {
            panic!()
        };
        assert_eq!(lost, 0);
        assert!(back.len() >= 5 && back.len() <= 10, "{}", back.len());
        assert_eq!(back[0].id, "a-1-0", "the newest kept");
    }

    #[test]
    fn garbage_is_moved_aside_with_its_bytes_and_a_new_record_written() {
        let dir = tempfile::tempdir().unwrap();
        let garbage = b"not json at all\n\xff\xfe".to_vec();
        fs::write(dir.path().join(FILE), &garbage).unwrap();
        let err = load(dir.path()).unwrap_err();
        let StoreError::Garbage { aside, .. } = err else {
            panic!("{err}")
        };
        assert_eq!(fs::read(&aside).unwrap(), garbage);
        assert!(!dir.path().join(FILE).exists());
        assert!(load(dir.path()).unwrap().events.is_empty());
        write(dir.path(), &encode(&[event("a-1-1", false)], MAX_BYTES)).unwrap();
        assert_eq!(load(dir.path()).unwrap().events.len(), 1);
        assert!(!dir.path().join(TMP_FILE).exists());
        // A missing directory is created.
        let deeper = dir.path().join("a/b");
        write(&deeper, &encode(&[], MAX_BYTES)).unwrap();
        assert!(load(&deeper).unwrap().events.is_empty());
    }
}
