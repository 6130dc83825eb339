//! Stall event ids (`id` in `/api/stalls`, `GET /api/stalls/{id}`): unique across
//! restarts of the agent and across agents on one host, short and URL-safe.
//!
//! `PREFIX-RANDOM-SEQ`, e.g. `019ae3f2c1b0-7f3a09c2-42`: the wall clock when the process
//! took its first id (milliseconds since the Unix epoch, 12 hex digits: fixed width until
//! the year 10889, so runs sort by their start), 32 random bits from the operating
//! system (`ring::rand::SystemRandom`, i.e. getrandom) drawn once per process, and the
//! process's sequence number in decimal, from 1. Within a process the sequence number
//! alone makes every id unique; across processes the prefix and the random part do: two
//! runs collide only when they start in the same millisecond of wall clock (a restart,
//! or a clock stepped back) **and** draw the same 32 random bits, 1 in 4.3 billion.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::SystemTime;

use ring::rand::{SecureRandom, SystemRandom};

/// Where a process's ids come from: its prefix and random part, and the next number.
#[derive(Debug)]
pub struct Ids {
    /// `PREFIX-RANDOM-`, fixed for the process.
    head: String,
    next: AtomicU64,
}

impl Ids {
    /// Ids of a run that started at `millis` (Unix milliseconds) and drew `random`.
    pub fn new(millis: u64, random: u32) -> Ids {
        Ids {
            head: format!("{millis:012x}-{random:08x}-"),
            next: AtomicU64::new(1),
        }
    }

    /// The next id: never one this generator gave before.
    pub fn next(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut s = String::with_capacity(self.head.len() + 4);
        s.push_str(&self.head);
        s.push_str(itoa::Buffer::new().format(n));
        s
    }

    /// Makes sure `id`, taken by an earlier run and restored from disk, is never given
    /// again: only an id of this generator's own prefix (same millisecond, same random
    /// draw) could be, and then the sequence moves past it.
    pub fn reserve(&self, id: &str) {
        let Some(n) = id
            .strip_prefix(&self.head)
            .and_then(|n| n.parse::<u64>().ok())
        else {
            return;
        };
        self.next.fetch_max(n.saturating_add(1), Ordering::Relaxed);
    }
}

/// The process's generator: the wall clock and the random draw at its first use.
static PROCESS: LazyLock<Ids> = LazyLock::new(|| {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    Ids::new(now.as_millis() as u64, random_u32(now.subsec_nanos()))
});

/// 32 bits from the operating system's generator. Should it fail (getrandom has nothing
/// to give only on a kernel older than 3.17 without /dev/urandom), the process id and the
/// clock's nanoseconds still set two agents started in the same millisecond apart.
fn random_u32(nanos: u32) -> u32 {
    let mut b = [0u8; 4];
    match SystemRandom::new().fill(&mut b) {
        Ok(()) => u32::from_le_bytes(b),
        Err(_) => std::process::id().rotate_left(16) ^ nanos,
    }
}

/// Fixes the process's prefix now (the agent calls it at start, through the stall log),
/// so that the prefix is the run's start rather than its first stall.
pub fn init() {
    LazyLock::force(&PROCESS);
}

/// The next id of this process.
pub fn next() -> String {
    PROCESS.next()
}

/// Keeps a restored event's id out of this process's ids ([`Ids::reserve`]).
pub fn reserve(id: &str) {
    PROCESS.reserve(id);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::process::{Command, Stdio};

    /// `PREFIX-RANDOM-SEQ`: 12 hex digits, 8 hex digits, a decimal number.
    fn parse(id: &str) -> (u64, u32, u64) {
        let parts: Vec<&str> = id.split('-').collect();
        assert_eq!(parts.len(), 3, "{id}");
        assert_eq!(parts[0].len(), 12, "{id}");
        assert_eq!(parts[1].len(), 8, "{id}");
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b) || b == b'-'),
            "not lowercase hex, digits and dashes: {id}"
        );
        (
            u64::from_str_radix(parts[0], 16).unwrap(),
            u32::from_str_radix(parts[1], 16).unwrap(),
            parts[2].parse().unwrap(),
        )
    }

    #[test]
    fn ids_have_the_run_start_the_random_part_and_a_sequence() {
        let ids = Ids::new(0x19a_e3f2_c1b0, 0x7f3a);
        assert_eq!(ids.next(), "019ae3f2c1b0-00007f3a-1");
        assert_eq!(ids.next(), "019ae3f2c1b0-00007f3a-2");
        let process = next();
        let (millis, _, seq) = parse(&process);
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(millis <= now && millis > now - 3_600_000, "{process}");
        assert!(seq >= 1);
        let later = parse(&next());
        assert_eq!(later.0, millis, "one prefix per process");
        assert!(later.2 > seq, "numbered in the order taken");
    }

    #[test]
    fn a_restored_id_of_the_same_prefix_is_never_given_again() {
        let ids = Ids::new(0x19a_e3f2_c1b0, 0x7f3a);
        ids.reserve("019ae3f2c1b0-00007f3a-41");
        ids.reserve("019ae3f2c1b0-00007f3b-900");
        ids.reserve("garbage");
        assert_eq!(ids.next(), "019ae3f2c1b0-00007f3a-42");
        ids.reserve("019ae3f2c1b0-00007f3a-3");
        assert_eq!(ids.next(), "019ae3f2c1b0-00007f3a-43");
    }

    #[test]
    fn ids_are_unique_across_threads_and_within_one_millisecond_across_runs() {
        let threads: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(|| (0..10_000).map(|_| next()).collect::<Vec<_>>()))
            .collect();
        let mut seen = HashSet::new();
        for t in threads {
            for id in t.join().unwrap() {
                assert!(seen.insert(id.clone()), "{id} twice");
            }
        }
        // Two runs started in the same millisecond: the random part sets them apart.
        let millis = 0x19a_e3f2_c1b0;
        let (a, b) = (
            Ids::new(millis, random_u32(0)),
            Ids::new(millis, random_u32(0)),
        );
        let a: HashSet<String> = (0..1000).map(|_| a.next()).collect();
        assert!((0..1000).map(|_| b.next()).all(|id| !a.contains(&id)));
    }

    /// Child mode of the test below: prints ids taken in this process.
    #[test]
    fn print_ids_for_another_process() {
        if std::env::var_os("STALLWATCH_PRINT_IDS").is_none() {
            return;
        }
        init();
        let ids: Vec<String> = (0..100).map(|_| next()).collect();
        // On a line of its own: the harness has written "test NAME ... " before.
        println!("\nids {}", ids.join(" "));
    }

    /// The test binary itself, run again: processes one after the other, then several
    /// at once, as restarts of one agent and as agents on one host.
    #[test]
    fn separate_processes_never_give_the_same_id() {
        let exe = std::env::current_exe().unwrap();
        let run = || {
            let mut c = Command::new(&exe);
            c.args([
                "--exact",
                "stall::id::tests::print_ids_for_another_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("STALLWATCH_PRINT_IDS", "1")
            .stdout(Stdio::piped());
            c
        };
        let ids = |out: std::process::Output| -> Vec<String> {
            assert!(out.status.success(), "{out:?}");
            let out = String::from_utf8(out.stdout).unwrap();
            let line = out.lines().find_map(|l| l.strip_prefix("ids "));
            let ids: Vec<String> = line
                .unwrap_or_default()
                .split(' ')
                .map(str::to_owned)
                .collect();
            assert_eq!(ids.len(), 100);
            ids
        };
        let mut seen: HashSet<String> = (0..100).map(|_| next()).collect();
        let mut prefixes = HashSet::new();
        let one_after_another: Vec<_> = (0..4).map(|_| ids(run().output().unwrap())).collect();
        let at_once: Vec<_> = (0..4).map(|_| run().spawn().unwrap()).collect();
        let at_once = at_once
            .into_iter()
            .map(|c| ids(c.wait_with_output().unwrap()));
        for (i, run) in one_after_another.into_iter().chain(at_once).enumerate() {
            let (millis, random, _) = parse(&run[0]);
            assert!(prefixes.insert((millis, random)), "run {i}: {}", run[0]);
            for id in run {
                assert!(seen.insert(id.clone()), "run {i} gave {id} again");
            }
        }
        assert_eq!(seen.len(), 900);
    }
}
