//! Where the kernel holds a probe call: samples of the lane thread's wait point
//! (`wchan`, and the kernel stack where readable), timed per call and settled into a
//! [`Cause`].
//!
//! The watchdog takes the samples from its own thread while a call is blocked past
//! [`SAMPLE_FRACTION`] of its threshold; the lane's probe thread, the stall log and a
//! scrape read them. Nothing here runs while no call is blocked past that point.
//!
//! The files read are the agent's own threads', in the procfs of the agent's own pid
//! namespace ([`OWN_PROCFS`]), not under `--path.procfs`: that flag may point at a host's
//! /proc from a container, where the agent's thread ids (from `gettid`, in its own
//! namespace) name other tasks or none.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::base::labels::Cause;
use crate::base::sync::lock;
use crate::stall::causes;

/// The procfs of the agent's own pid namespace, where its own threads are.
pub const OWN_PROCFS: &str = "/proc";

/// Sampling starts once a call has been blocked this fraction of its stall threshold, so
/// that a cause is settled by the time the threshold is crossed and the stall counted.
pub const SAMPLE_FRACTION: f64 = 0.25;

/// The pause between two samples of a blocked call.
pub const SAMPLE_PERIOD: Duration = Duration::from_millis(100);

/// After this many samples of one call (30 s at [`SAMPLE_PERIOD`]) the pause grows to
/// [`SLOW_SAMPLE_PERIOD`]: a call stuck for hours costs one read a second, not ten.
pub const FAST_SAMPLES: u64 = 300;

/// The pause between two samples once [`FAST_SAMPLES`] were taken.
pub const SLOW_SAMPLE_PERIOD: Duration = Duration::from_secs(1);

/// Distinct (cause, symbol) pairs and distinct wchan symbols kept per call; further
/// new symbols are counted in `dropped` only.
pub const MAX_SYMBOLS: usize = 16;

/// Frames kept of a stack, innermost first.
pub const MAX_FRAMES: usize = 16;

/// The point after which a call with this threshold is sampled.
pub fn sampling_point(threshold: Duration) -> Duration {
    threshold.mul_f64(SAMPLE_FRACTION)
}

/// One look at a blocked thread.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// The `wchan` symbol; None when the thread was running (the kernel writes `0`).
    pub wchan: Option<String>,
    /// The kernel stack, innermost frame first, symbols without offsets; None when
    /// unreadable (not root) or empty.
    pub stack: Option<Vec<String>>,
}

impl Sample {
    /// The cause and the symbol that decided it: a known stack frame first (the stack
    /// names the precise wait), else the wchan symbol. None for a running thread (no
    /// wchan): it is not waiting, and its stack is only what it runs through.
    pub fn classify(&self) -> Option<(Cause, String)> {
        let w = self.wchan.as_ref()?;
        if let Some((c, f)) = self.stack.as_deref().and_then(causes::of_stack) {
            return Some((c, f.to_owned()));
        }
        Some((causes::of_symbol(w).unwrap_or(Cause::Other), w.clone()))
    }
}

/// Parses `wchan`: a symbol, or `0` for a running task.
pub fn parse_wchan(text: &str) -> Option<String> {
    let s = text.trim();
    (!s.is_empty() && s != "0").then(|| s.to_owned())
}

/// Parses `/proc/PID/task/TID/stack`: lines `[<0>] symbol+0x15f/0x1d0`, innermost
/// first. Module suffixes (` [ext4]`) and offsets are dropped; a line that is not in
/// that shape is skipped.
pub fn parse_stack(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let rest = l.trim().split_once("] ")?.1;
            let sym = rest.split(['+', ' ']).next()?.trim();
            (!sym.is_empty()).then(|| sym.to_owned())
        })
        .take(MAX_FRAMES)
        .collect()
}

/// Reads the wait point of thread `tid` of this process.
pub struct Reader {
    /// Cleared at the first refusal: without CAP_SYS_ADMIN every read of a stack is
    /// refused, so it is not tried again.
    stack_readable: AtomicBool,
}

impl Default for Reader {
    fn default() -> Reader {
        Reader {
            stack_readable: AtomicBool::new(true),
        }
    }
}

/// Reads a small procfs file in one `read` (open, read, close: no size probe, no read
/// of the end): `wchan` is a symbol, `stack` a few hundred bytes, and the kernel's
/// seq_file hands all of it to the first read of a buffer this size.
fn read_small(path: &Path) -> std::io::Result<String> {
    let mut buf = [0u8; 8192];
    let n = std::fs::File::open(path)?.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

impl Reader {
    /// One sample of thread `tid`; None when its files cannot be read (it exited).
    pub fn sample(&self, tid: u32) -> Option<Sample> {
        let dir = PathBuf::from(OWN_PROCFS).join(format!("self/task/{tid}"));
        let wchan = read_small(&dir.join("wchan")).ok()?;
        let stack = if self.stack_readable.load(Ordering::Relaxed) {
            match read_small(&dir.join("stack")) {
                Ok(t) => Some(parse_stack(&t)).filter(|s| !s.is_empty()),
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    self.stack_readable.store(false, Ordering::Relaxed);
                    None
                }
                Err(_) => None,
            }
        } else {
            None
        };
        Some(Sample {
            wchan: parse_wchan(&wchan),
            stack,
        })
    }
}

/// The share of the time held that a second wait point needs for the verdict to name it
/// beside the deciding one: a call held about half in each of two waits is both.
pub const SECOND_WAIT_SHARE: f64 = 0.35;

/// A wchan symbol and how many samples showed it (event field `wchan`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SymbolCount {
    pub symbol: String,
    pub count: u64,
}

/// A wait point and the time the call was held there (event field `waits`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaitTime {
    pub cause: Cause,
    pub symbol: String,
    pub seconds: f64,
}

#[derive(Debug, Clone, PartialEq)]
struct Classified {
    cause: Cause,
    symbol: String,
    /// The time credited to this pair: see [`WaitSamples::add`].
    held: Duration,
    /// The latest stack that gave this pair.
    stack: Option<Vec<String>>,
}

/// The samples of one call, bounded: counts per wchan symbol, and the time held per
/// (cause, symbol).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WaitSamples {
    /// In the order first seen.
    wchan: Vec<SymbolCount>,
    classified: Vec<Classified>,
    /// The pair the latest sample with a wait point gave (an index into `classified`).
    latest: Option<usize>,
    /// Time before the first sample with a wait point, credited to that one.
    unplaced: Duration,
    /// Samples taken, including those of a running thread.
    pub total: u64,
    /// Samples whose new symbol did not fit in [`MAX_SYMBOLS`].
    pub dropped: u64,
}

impl WaitSamples {
    /// Folds one sample in; `since` is the time since the sample before it, or since the
    /// call started for the first one.
    ///
    /// The cause is settled by time, not by count of samples: each sample's wait point is
    /// credited with the time since the sample before, so the part of the call before the
    /// first sample (a quarter of the threshold, where sampling starts, or up to a whole
    /// threshold when the watchdog first sees the call late) counts for the wait point
    /// the first sample found, and a sample a second apart (after
    /// [`FAST_SAMPLES`]) weighs ten of those 100 ms apart. A sample of the thread running
    /// credits the wait point of the latest sample that had one: a thread woken for an
    /// instant between two waits of a call is still held by it.
    pub fn add(&mut self, s: &Sample, since: Duration) {
        self.total += 1;
        if let Some(w) = &s.wchan {
            if let Some(c) = self.wchan.iter_mut().find(|c| &c.symbol == w) {
                c.count += 1;
            } else if self.wchan.len() < MAX_SYMBOLS {
                self.wchan.push(SymbolCount {
                    symbol: w.clone(),
                    count: 1,
                });
            } else {
                self.dropped += 1;
            }
        }
        let Some((cause, symbol)) = s.classify() else {
            match self.latest {
                Some(i) => self.classified[i].held += since,
                None => self.unplaced += since,
            }
            return;
        };
        let held = since + std::mem::take(&mut self.unplaced);
        if let Some(i) = self
            .classified
            .iter()
            .position(|c| c.cause == cause && c.symbol == symbol)
        {
            let c = &mut self.classified[i];
            c.held += held;
            if s.stack.is_some() {
                c.stack.clone_from(&s.stack);
            }
            self.latest = Some(i);
        } else if self.classified.len() < MAX_SYMBOLS {
            self.classified.push(Classified {
                cause,
                symbol,
                held,
                stack: s.stack.clone(),
            });
            self.latest = Some(self.classified.len() - 1);
        } else {
            self.dropped += 1;
        }
    }

    /// The wait points and the time credited to each, longest first (first seen first
    /// among equals).
    pub fn waits(&self) -> Vec<WaitTime> {
        let mut v: Vec<WaitTime> = self
            .classified
            .iter()
            .map(|c| WaitTime {
                cause: c.cause,
                symbol: c.symbol.clone(),
                seconds: c.held.as_secs_f64(),
            })
            .collect();
        v.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        v
    }

    /// The wchan symbols, most frequent first (first seen first among equals).
    pub fn wchan(&self) -> Vec<SymbolCount> {
        let mut v = self.wchan.clone();
        v.sort_by_key(|c| std::cmp::Reverse(c.count));
        v
    }

    /// The cause of the call. The rule: the cause held longest among the mapped ones
    /// (every cause but `other`), the one seen first among equals; `other` when samples
    /// exist but none maps; `unknown` without a sample that named a wait point.
    pub fn cause(&self) -> Cause {
        self.decided().map_or(Cause::Unknown, |c| c.cause)
    }

    /// The symbol that decided the cause: the one of that cause held longest.
    pub fn symbol(&self) -> Option<&str> {
        self.decided().map(|c| c.symbol.as_str())
    }

    /// The latest stack of the deciding symbol, when stacks were readable.
    pub fn stack(&self) -> Option<&[String]> {
        self.decided()?.stack.as_deref()
    }

    fn decided(&self) -> Option<&Classified> {
        let mut totals: Vec<(Cause, Duration)> = Vec::new();
        for c in &self.classified {
            match totals.iter_mut().find(|(k, _)| *k == c.cause) {
                Some((_, n)) => *n += c.held,
                None => totals.push((c.cause, c.held)),
            }
        }
        let best = |mapped: bool| {
            totals
                .iter()
                .filter(|(k, _)| (*k != Cause::Other) == mapped)
                // max_by_key keeps the last of equals: reverse to keep the first seen.
                .rev()
                .max_by_key(|(_, n)| *n)
                .map(|&(k, _)| k)
        };
        let cause = best(true).or_else(|| best(false))?;
        self.classified
            .iter()
            .filter(|c| c.cause == cause)
            .rev()
            .max_by_key(|c| c.held)
    }
}

/// The wait of another cause than `cause` that held the call for at least
/// [`SECOND_WAIT_SHARE`] of the time credited to all its waits: its cause, its longest
/// symbol and the seconds of all its symbols, with the seconds of `cause` beside it. None
/// when one cause held the call most of the time.
pub fn second_wait(waits: &[WaitTime], cause: Cause) -> Option<(f64, WaitTime)> {
    let total: f64 = waits.iter().map(|w| w.seconds).sum();
    let of = |c: Cause| -> f64 {
        waits
            .iter()
            .filter(|w| w.cause == c)
            .map(|w| w.seconds)
            .sum()
    };
    // `waits` is longest first: the first of another cause is its longest symbol.
    let mut seen: Vec<Cause> = Vec::new();
    let mut best: Option<WaitTime> = None;
    for w in waits.iter().filter(|w| w.cause != cause) {
        if seen.contains(&w.cause) {
            continue;
        }
        seen.push(w.cause);
        let seconds = of(w.cause);
        if best.as_ref().is_none_or(|b| seconds > b.seconds) {
            best = Some(WaitTime {
                seconds,
                ..w.clone()
            });
        }
    }
    let best = best.filter(|b| total > 0.0 && b.seconds >= SECOND_WAIT_SHARE * total)?;
    Some((of(cause), best))
}

struct Current {
    seq: u64,
    samples: WaitSamples,
    /// When the latest sample was taken; the call's start before the first.
    last: Instant,
    next: Instant,
}

/// A lane's thread id and the samples of its call in flight. Written by the lane (its
/// tid, once) and by the watchdog (samples); read by the lane, the stall log and a
/// scrape, under a lock held for a copy, never across a read of procfs.
#[derive(Default)]
pub struct LaneWaits {
    /// The lane thread's id, 0 until its thread started.
    tid: AtomicU32,
    current: Mutex<Option<Current>>,
}

impl LaneWaits {
    /// Records the calling thread as the lane's thread.
    pub fn set_tid_here(&self) {
        let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
        self.tid.store(tid, Ordering::Relaxed);
    }

    /// The lane thread's id, once its thread has started.
    pub fn tid(&self) -> Option<u32> {
        Some(self.tid.load(Ordering::Relaxed)).filter(|&t| t != 0)
    }

    /// Samples call `seq`, which started at `started`, when a sample is due; returns when
    /// the next one is.
    pub fn sample_if_due(
        &self,
        reader: &Reader,
        seq: u64,
        started: Instant,
        now: Instant,
    ) -> Instant {
        let due = match &*lock(&self.current) {
            Some(c) if c.seq == seq => c.next,
            _ => now,
        };
        if due > now {
            return due;
        }
        // Read outside the lock: a scrape must not wait for procfs.
        let sample = self.tid().and_then(|t| reader.sample(t));
        let mut cur = lock(&self.current);
        if cur.as_ref().is_none_or(|c| c.seq != seq) {
            *cur = Some(Current {
                seq,
                samples: WaitSamples::default(),
                last: started,
                next: now,
            });
        }
        let c = cur.as_mut().expect("just set");
        if let Some(s) = &sample {
            c.samples.add(s, now.saturating_duration_since(c.last));
            c.last = now;
        }
        let period = if c.samples.total >= FAST_SAMPLES {
            SLOW_SAMPLE_PERIOD
        } else {
            SAMPLE_PERIOD
        };
        c.next = now + period;
        c.next
    }

    /// A copy of the samples of call `seq`, if it was sampled.
    pub fn of(&self, seq: u64) -> Option<WaitSamples> {
        match &*lock(&self.current) {
            Some(c) if c.seq == seq => Some(c.samples.clone()),
            _ => None,
        }
    }

    /// The cause of call `seq` as sampled so far.
    pub fn cause_of(&self, seq: u64) -> Cause {
        match &*lock(&self.current) {
            Some(c) if c.seq == seq => c.samples.cause(),
            _ => Cause::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FROZEN_STACK: &str = "[<0>] percpu_rwsem_wait+0x15f/0x1d0
[<0>] mnt_want_write+0x96/0xc0
[<0>] path_openat+0x9b3/0x12d0
[<0>] do_filp_open+0xc3/0x180
[<0>] ext4_file_write_iter+0x1a/0x30 [ext4]
[<0>] entry_SYSCALL_64_after_hwframe+0x76/0x7e
";

    /// The fast sampling period, as the time a sample stands for.
    const P: Duration = SAMPLE_PERIOD;

    fn sample(wchan: &str, stack: Option<&[&str]>) -> Sample {
        Sample {
            wchan: parse_wchan(wchan),
            stack: stack.map(|s| s.iter().map(|f| f.to_string()).collect()),
        }
    }

    #[test]
    fn stack_lines_lose_offsets_and_modules() {
        let frames = parse_stack(FROZEN_STACK);
        assert_eq!(frames[0], "percpu_rwsem_wait");
        assert_eq!(frames[4], "ext4_file_write_iter");
        assert_eq!(frames.len(), 6);
        assert!(parse_stack("").is_empty());
        assert_eq!(parse_stack("garbage\n[<0>] ok+0x1/0x2\n"), ["ok"]);
        let long: String = (0..40).map(|i| format!("[<0>] f{i}+0x1/0x2\n")).collect();
        assert_eq!(parse_stack(&long).len(), MAX_FRAMES);
    }

    #[test]
    fn a_running_thread_has_no_wchan() {
        assert_eq!(parse_wchan("0"), None);
        assert_eq!(parse_wchan(""), None);
        assert_eq!(
            parse_wchan("percpu_rwsem_wait"),
            Some("percpu_rwsem_wait".into())
        );
    }

    #[test]
    fn a_known_frame_beats_the_wchan_symbol() {
        // wchan names the outermost non-scheduler caller; the stack is more precise.
        let s = sample(
            "folio_wait_bit",
            Some(&["folio_wait_bit", "folio_wait_writeback", "ext4_sync_file"]),
        );
        assert_eq!(
            s.classify(),
            Some((Cause::WritebackWait, "folio_wait_writeback".into()))
        );
        let s = sample("request_wait_answer", None);
        assert_eq!(
            s.classify(),
            Some((Cause::Remote, "request_wait_answer".into()))
        );
        let s = sample("some_new_wait", Some(&["some_new_wait", "do_syscall_64"]));
        assert_eq!(s.classify(), Some((Cause::Other, "some_new_wait".into())));
        assert_eq!(sample("0", None).classify(), None);
    }

    #[test]
    fn a_mapped_cause_wins_over_unmapped_ones_and_equals_go_to_the_first_seen() {
        let mut w = WaitSamples::default();
        assert_eq!(w.cause(), Cause::Unknown);
        for _ in 0..5 {
            w.add(&sample("mystery_wait", None), P);
        }
        assert_eq!(w.cause(), Cause::Other);
        assert_eq!(w.symbol(), Some("mystery_wait"));
        w.add(&sample("jbd2_log_wait_commit", None), P);
        w.add(&sample("folio_wait_writeback", None), P);
        w.add(&sample("folio_wait_writeback", None), P);
        assert_eq!(
            w.cause(),
            Cause::WritebackWait,
            "mapped beats more frequent other"
        );
        w.add(&sample("jbd2_log_wait_commit", None), P);
        assert_eq!(w.cause(), Cause::Journal, "equals: the first seen");
        w.add(&sample("0", None), P);
        assert_eq!(w.total, 10);
        let top = &w.wchan()[0];
        assert_eq!((top.symbol.as_str(), top.count), ("mystery_wait", 5));
        let json = serde_json::to_value(w.wchan()).unwrap();
        assert_eq!(json[0]["symbol"], "mystery_wait");
        assert_eq!(json[0]["count"], 5);
    }

    #[test]
    fn the_time_before_the_first_sample_counts_for_its_wait_point() {
        // The stall matrix's mixed fsync: 2.0 s waiting for its data's writeback, then
        // 1.9 s in the cache flush; sampling starts at 0.25 s. By count the flush has
        // more samples (19 against 18); by time the writeback held the call longer.
        let mut w = WaitSamples::default();
        let wb = sample("folio_wait_bit", Some(&["folio_wait_writeback"]));
        let flush = sample("submit_bio_wait", None);
        w.add(&wb, Duration::from_millis(250));
        for _ in 0..17 {
            w.add(&wb, P);
        }
        for _ in 0..19 {
            w.add(&flush, P);
        }
        assert_eq!(w.cause(), Cause::WritebackWait);
        assert_eq!(w.symbol(), Some("folio_wait_writeback"));
        let waits = w.waits();
        assert_eq!(waits.len(), 2);
        assert!((waits[0].seconds - 1.95).abs() < 1e-9, "{waits:?}");
        assert!((waits[1].seconds - 1.9).abs() < 1e-9, "{waits:?}");
        let (first, second) = second_wait(&waits, w.cause()).expect("both waits named");
        assert!((first - 1.95).abs() < 1e-9);
        assert_eq!(second.cause, Cause::DeviceQueue);
        assert_eq!(second.symbol, "submit_bio_wait");
        let json = serde_json::to_value(&waits).unwrap();
        assert_eq!(json[1]["cause"], "device_queue");
        assert_eq!(json[1]["symbol"], "submit_bio_wait");
    }

    #[test]
    fn a_running_thread_credits_the_latest_wait_point() {
        let mut w = WaitSamples::default();
        // Running before any wait point was seen: carried to the first one.
        w.add(&sample("0", None), Duration::from_millis(300));
        w.add(&sample("jbd2_log_wait_commit", None), P);
        for _ in 0..3 {
            w.add(&sample("folio_wait_writeback", None), P);
        }
        assert_eq!(w.cause(), Cause::Journal, "0.4 s against 0.3 s");
        w.add(&sample("folio_wait_writeback", None), P);
        assert_eq!(w.cause(), Cause::Journal, "equals: the first seen");
        w.add(&sample("0", None), P);
        assert_eq!(
            w.cause(),
            Cause::WritebackWait,
            "the running sample is the latest wait point's"
        );
        assert_eq!(w.total, 7);
    }

    #[test]
    fn a_slow_sample_weighs_its_whole_period() {
        let mut w = WaitSamples::default();
        for _ in 0..5 {
            w.add(&sample("folio_wait_writeback", None), P);
        }
        w.add(&sample("percpu_rwsem_wait", None), SLOW_SAMPLE_PERIOD);
        assert_eq!(w.cause(), Cause::Frozen, "1 s against 0.5 s");
    }

    #[test]
    fn a_second_wait_is_named_from_35_percent_of_the_time() {
        let wait = |cause, symbol: &str, seconds| WaitTime {
            cause,
            symbol: symbol.into(),
            seconds,
        };
        let waits = [
            wait(Cause::DeviceQueue, "submit_bio_wait", 5.0),
            wait(Cause::WritebackWait, "folio_wait_writeback", 2.0),
            wait(Cause::WritebackWait, "folio_wait_bit", 1.0),
            wait(Cause::Journal, "jbd2_log_wait_commit", 0.5),
        ];
        // Writeback: 3.0 s of 8.5 s, 35.3 %: named, with its longest symbol.
        let (first, second) = second_wait(&waits, Cause::DeviceQueue).unwrap();
        assert_eq!(first, 5.0);
        assert_eq!(
            second,
            wait(Cause::WritebackWait, "folio_wait_writeback", 3.0)
        );
        assert_eq!(second_wait(&waits[..1], Cause::DeviceQueue), None);
        let few = [waits[0].clone(), waits[3].clone()];
        assert_eq!(second_wait(&few, Cause::DeviceQueue), None, "0.5 of 5.5 s");
        assert_eq!(second_wait(&[], Cause::Unknown), None);
    }

    #[test]
    fn the_stack_of_the_deciding_symbol_is_kept() {
        let mut w = WaitSamples::default();
        w.add(
            &sample(
                "percpu_rwsem_wait",
                Some(&["percpu_rwsem_wait", "mnt_want_write"]),
            ),
            P,
        );
        assert_eq!(w.cause(), Cause::Frozen);
        assert_eq!(w.stack().unwrap()[1], "mnt_want_write");
    }

    #[test]
    fn symbols_are_bounded() {
        let mut w = WaitSamples::default();
        for i in 0..(MAX_SYMBOLS + 5) {
            w.add(&sample(&format!("wait_{i}"), None), P);
        }
        assert_eq!(w.wchan().len(), MAX_SYMBOLS);
        assert_eq!(w.dropped, 10, "5 wchan and 5 classified pairs did not fit");
    }

    #[test]
    fn samples_follow_the_call_and_the_period() {
        let lane = LaneWaits::default();
        lane.set_tid_here();
        let reader = Reader::default();
        let now = Instant::now();
        let next = lane.sample_if_due(&reader, 7, now, now);
        assert_eq!(next, now + SAMPLE_PERIOD);
        assert_eq!(
            lane.sample_if_due(&reader, 7, now, now),
            next,
            "not due again yet"
        );
        assert_eq!(lane.of(7).unwrap().total, 1);
        // This thread is running while it reads itself: no wait point.
        assert_eq!(lane.cause_of(7), Cause::Unknown);
        lane.sample_if_due(&reader, 8, now, now);
        assert!(lane.of(7).is_none(), "a new call starts afresh");
        assert_eq!(lane.of(8).unwrap().total, 1);
    }

    #[test]
    fn the_first_sample_stands_for_the_time_since_the_call_started() {
        // A thread asleep in the kernel (a futex wait: `other`, not in the table).
        let lane = std::sync::Arc::new(LaneWaits::default());
        let (stop, asleep) = std::sync::mpsc::channel::<()>();
        let sleeper = {
            let lane = lane.clone();
            std::thread::spawn(move || {
                lane.set_tid_here();
                let _ = asleep.recv_timeout(Duration::from_secs(20));
            })
        };
        let reader = Reader::default();
        let deadline = Instant::now() + Duration::from_secs(5);
        while lane
            .tid()
            .and_then(|t| reader.sample(t))
            .and_then(|s| s.classify())
            .is_none()
        {
            assert!(Instant::now() < deadline, "the thread never went to sleep");
            std::thread::sleep(Duration::from_millis(5));
        }
        let now = Instant::now();
        let started = now - Duration::from_millis(700);
        lane.sample_if_due(&reader, 1, started, now);
        let first = lane.of(1).unwrap().waits();
        assert_eq!(first.len(), 1, "{first:?}");
        assert_eq!(first[0].seconds, 0.7, "the lead from the call's start");
        lane.sample_if_due(&reader, 1, started, now + SAMPLE_PERIOD);
        let both = lane.of(1).unwrap().waits();
        assert_eq!(both.len(), 1, "{both:?}");
        assert!((both[0].seconds - 0.8).abs() < 1e-9, "{both:?}");
        stop.send(()).unwrap();
        sleeper.join().unwrap();
    }
}
