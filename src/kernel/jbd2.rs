//! The ext4 journal's figures: `PROC/fs/jbd2/DEV-INO/info`, one directory per mounted
//! journal (ext3/ext4; `DEV` the filesystem's device, `INO` the journal inode, 8 unless
//! the journal is external).
//!
//! The averages are jbd2's own: the phase times are means over the transactions since the
//! mount, the commit time (`j_average_commit_time`) a moving average weighted towards
//! the recent commits, so its value at the end of a stall speaks for the stall.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::kernel::kernfs::{self, read_parse, ParseError, ReadError};

/// The parsed `info` file; times in seconds (the kernel prints ms, and µs for the
/// commit time). A journal without a transaction yet prints only the first line: the
/// averages are then None.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct JournalInfo {
    pub transactions: u64,
    /// Commits asked for (fsync, sync) rather than started by the commit timer.
    pub transactions_requested: u64,
    pub max_transaction_blocks: u64,
    pub waiting_seconds_avg: Option<f64>,
    pub request_delay_seconds_avg: Option<f64>,
    pub running_seconds_avg: Option<f64>,
    pub locked_seconds_avg: Option<f64>,
    pub flushing_seconds_avg: Option<f64>,
    pub logging_seconds_avg: Option<f64>,
    pub commit_seconds_avg: Option<f64>,
    pub handles_per_transaction: Option<u64>,
    pub blocks_per_transaction: Option<u64>,
    pub logged_blocks_per_transaction: Option<u64>,
}

const WHAT: &str = "jbd2 info";

/// Parses `info` as `jbd2_seq_info_show` writes it.
pub fn parse_info(text: &str) -> Result<JournalInfo, ParseError> {
    let mut lines = text.lines();
    let first = lines
        .next()
        .ok_or_else(|| ParseError::new(WHAT, "empty", text))?;
    // "20 transactions (20 requested), each up to 1365 blocks"
    let words: Vec<&str> = first.split_ascii_whitespace().collect();
    let ["transactions", req, "requested),", "each", "up", "to", blocks, "blocks"] =
        words.get(1..).unwrap_or_default()
    else {
        return Err(ParseError::new(WHAT, "unexpected first line", first));
    };
    let req = req
        .strip_prefix('(')
        .ok_or_else(|| ParseError::new(WHAT, "unexpected first line", first))?;
    let mut info = JournalInfo {
        transactions: kernfs::parse_uint(WHAT, words[0], first)?,
        transactions_requested: kernfs::parse_uint(WHAT, req, first)?,
        max_transaction_blocks: kernfs::parse_uint(WHAT, blocks, first)?,
        ..JournalInfo::default()
    };
    let Some(avg) = lines.next() else {
        return Ok(info);
    };
    if avg.trim() != "average:" {
        return Err(ParseError::new(WHAT, "expected average:", avg));
    }
    let mut seen = 0;
    for line in lines {
        let line_t = line.trim();
        if line_t.is_empty() {
            continue;
        }
        let (num, rest) = line_t
            .split_once(' ')
            .ok_or_else(|| ParseError::new(WHAT, "expected VALUE TEXT", line))?;
        let (digits, scale) = if let Some(d) = num.strip_suffix("us") {
            (d, 1e-6)
        } else if let Some(d) = num.strip_suffix("ms") {
            (d, 1e-3)
        } else {
            (num, 0.0)
        };
        let value: u64 = kernfs::parse_uint(WHAT, digits, line)?;
        let secs = Some(value as f64 * scale);
        let timed = scale > 0.0;
        match (rest, timed) {
            ("waiting for transaction", true) => info.waiting_seconds_avg = secs,
            ("request delay", true) => info.request_delay_seconds_avg = secs,
            ("running transaction", true) => info.running_seconds_avg = secs,
            ("transaction was being locked", true) => info.locked_seconds_avg = secs,
            ("flushing data (in ordered mode)", true) => info.flushing_seconds_avg = secs,
            ("logging transaction", true) => info.logging_seconds_avg = secs,
            ("average transaction commit time", true) => info.commit_seconds_avg = secs,
            ("handles per transaction", false) => info.handles_per_transaction = Some(value),
            ("blocks per transaction", false) => info.blocks_per_transaction = Some(value),
            ("logged blocks per transaction", false) => {
                info.logged_blocks_per_transaction = Some(value)
            }
            _ => return Err(ParseError::new(WHAT, "unknown line", line)),
        }
        seen += 1;
    }
    if info.commit_seconds_avg.is_none() || seen < 7 {
        return Err(ParseError::new(WHAT, "incomplete averages", text));
    }
    Ok(info)
}

/// The journal directory of the filesystem on `device` (`loop0`, `sda1`): the
/// `DEV-INO` entry of `PROC/fs/jbd2`, None when there is none (not ext4, or no journal).
pub fn find(proc_root: &Path, device: &str) -> Option<PathBuf> {
    let prefix = format!("{device}-");
    let mut found: Vec<PathBuf> = std::fs::read_dir(proc_root.join("fs/jbd2"))
        .ok()?
        .flatten()
        .filter(|e| {
            e.file_name().to_str().is_some_and(|n| {
                n.strip_prefix(&prefix)
                    .is_some_and(|ino| !ino.is_empty() && ino.bytes().all(|b| b.is_ascii_digit()))
            })
        })
        .map(|e| e.path())
        .collect();
    found.sort();
    found.into_iter().next()
}

/// Reads a journal's `info`.
pub fn read(dir: &Path) -> Result<JournalInfo, ReadError> {
    read_parse(&dir.join("info"), parse_info)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Read on this project's development VM from an ext4 loop device after 20 fsyncs.
    const INFO: &str = "20 transactions (20 requested), each up to 1365 blocks\naverage: \n  0ms waiting for transaction\n  0ms request delay\n  3ms running transaction\n  0ms transaction was being locked\n  12ms flushing data (in ordered mode)\n  1ms logging transaction\n  1656us average transaction commit time\n  3 handles per transaction\n  6 blocks per transaction\n  8 logged blocks per transaction\n";

    #[test]
    fn info_with_and_without_transactions() {
        let i = parse_info(INFO).unwrap();
        assert_eq!((i.transactions, i.transactions_requested), (20, 20));
        assert_eq!(i.max_transaction_blocks, 1365);
        assert_eq!(i.commit_seconds_avg, Some(0.001656));
        assert_eq!(i.flushing_seconds_avg, Some(0.012));
        assert_eq!(i.running_seconds_avg, Some(0.003));
        assert_eq!(i.handles_per_transaction, Some(3));
        assert_eq!(i.logged_blocks_per_transaction, Some(8));
        let empty = parse_info("0 transactions (0 requested), each up to 2730 blocks\n").unwrap();
        assert_eq!(empty.transactions, 0);
        assert_eq!(empty.commit_seconds_avg, None);
    }

    #[test]
    fn info_refuses_broken_text() {
        for bad in [
            "",
            "20 transactions, each up to 1365 blocks\n",
            "x transactions (20 requested), each up to 1365 blocks\n",
            &INFO.replace("1656us", "1656s"),
            &INFO.replace("1656us", "-1us"),
            &INFO.replace("average: ", "averages"),
            &INFO.replace("3 handles", "3ms handles"),
            &INFO.replace("  1656us average transaction commit time\n", ""),
        ] {
            assert!(parse_info(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn finds_the_journal_of_a_device() {
        let dir = tempfile::tempdir().unwrap();
        let j = dir.path().join("fs/jbd2");
        for d in ["loop0-8", "loop01-8", "loop1-x", "sda1-8"] {
            std::fs::create_dir_all(j.join(d)).unwrap();
        }
        std::fs::write(j.join("loop0-8/info"), INFO).unwrap();
        let found = find(dir.path(), "loop0").unwrap();
        assert_eq!(found, j.join("loop0-8"));
        assert_eq!(read(&found).unwrap().transactions, 20);
        assert_eq!(find(dir.path(), "loop1"), None);
        assert_eq!(find(dir.path(), "sdb"), None);
        assert_eq!(find(Path::new("/nonexistent"), "sda1"), None);
    }
}
