//! The verdict: one sentence that says why a stall happened, built only from the
//! evidence in its event. A pure function over literal facts, so every phrase is tested
//! on literal input.
//!
//! The sentence is a base phrase — `<op> blocked <d> s in <symbol> (<cause>)`, or for a
//! call held in two waits of about equal length `... in <symbol> (<cause>) <d> s and in
//! <symbol> (<cause>) <d> s` — then,
//! after a colon, phrases separated by `; `: the dirty-memory state when it bears on the
//! cause, md arrays that were syncing, the evidence phrases of other readers (`extra`:
//! top dirtiers, device figures), and where the device was idle, that the hold was
//! above the block layer.

use crate::base::labels::Cause;
use crate::stall::evidence::binary_bytes;
use crate::stall::waits::WaitTime;

/// The facts of one stall the verdict is built from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts<'a> {
    pub op: &'a str,
    pub seconds: f64,
    /// Still blocked: the duration is "so far".
    pub ongoing: bool,
    pub cause: Option<Cause>,
    /// The wait point that decided the cause.
    pub symbol: Option<&'a str>,
    /// A second wait that held the call a good part of the time
    /// ([`crate::stall::waits::second_wait`]), with the seconds of the deciding cause.
    pub second: Option<(f64, WaitTime)>,
    pub dirty_bytes_max: u64,
    pub writeback_bytes_max: u64,
    /// At the latest reading; 0 when never sampled.
    pub dirty_threshold_bytes: u64,
    /// The lowest of the window; 0 when never sampled.
    pub dirty_threshold_bytes_min: u64,
    /// md arrays and the sync action seen (`check`, `resync`, `idle`, ...).
    pub md: Vec<(&'a str, &'a str)>,
}

/// Dirty memory this close to the threshold reads "at the threshold".
const AT_THRESHOLD: f64 = 0.9;

/// A threshold at the end this much above the window's lowest is said beside it.
const THRESHOLD_MOVED: f64 = 1.1;

/// The sentence. `extra` are evidence phrases appended as they are; `device_idle` says
/// whether the backing device was idle while the call was held (None: not known).
pub fn verdict(f: &Facts<'_>, extra: &[String], device_idle: Option<bool>) -> String {
    let cause = f.cause.unwrap_or(Cause::Unknown);
    let so_far = if f.ongoing { " so far" } else { "" };
    let mut s = format!("{} blocked {:.1} s{so_far}", f.op, f.seconds);
    match f.symbol {
        Some(sym) if cause != Cause::Unknown => s += &format!(" in {sym} ({})", cause.text()),
        _ => s += &format!(" ({})", cause.text()),
    }
    if let (Some(_), Some((first, w))) = (f.symbol, &f.second) {
        if cause != Cause::Unknown {
            s += &format!(
                " {first:.1} s and in {} ({}) {:.1} s",
                w.symbol,
                w.cause.text(),
                w.seconds
            );
        }
    }
    let mut phrases: Vec<String> = Vec::new();
    if let Some(p) = vm_phrase(f, cause) {
        phrases.push(p);
    }
    phrases.extend(
        f.md.iter()
            .filter(|(_, a)| !matches!(*a, "idle" | "unknown" | "frozen"))
            .map(|(d, a)| format!("{d} running {a}")),
    );
    phrases.extend(extra.iter().cloned());
    if device_idle == Some(true) {
        phrases.push("the device was idle: the call was held above the block layer".into());
    }
    if !phrases.is_empty() {
        s += ": ";
        s += &phrases.join("; ");
    }
    s
}

/// The dirty-memory phrase: always when dirty memory was at the threshold, else only for
/// the causes that dirty memory feeds (throttling, writeback, journal, device queue).
/// The threshold compared with is the window's lowest: writers are held at the limit of
/// the moment, and one lowered during the stall (an operator's `vm.dirty_bytes`) may be
/// back up by its end, which is then said beside it.
fn vm_phrase(f: &Facts<'_>, cause: Cause) -> Option<String> {
    let threshold = match f.dirty_threshold_bytes_min {
        0 => f.dirty_threshold_bytes,
        m => m,
    };
    if threshold == 0 {
        return None;
    }
    let ratio = f.dirty_bytes_max as f64 / threshold as f64;
    let at = ratio >= AT_THRESHOLD;
    let related = matches!(
        cause,
        Cause::DirtyThrottle | Cause::WritebackWait | Cause::Journal | Cause::DeviceQueue
    );
    if !at && !related {
        return None;
    }
    let how = if at { "at" } else { "below" };
    let mut p = format!(
        "dirty {} {how} the {} threshold",
        binary_bytes(f.dirty_bytes_max),
        binary_bytes(threshold)
    );
    if f.dirty_threshold_bytes as f64 > THRESHOLD_MOVED * threshold as f64 {
        p += &format!(" ({} at the end)", binary_bytes(f.dirty_threshold_bytes));
    }
    if f.writeback_bytes_max > 0 {
        p += &format!(", {} under writeback", binary_bytes(f.writeback_bytes_max));
    }
    Some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn facts(cause: Cause, symbol: &'static str) -> Facts<'static> {
        Facts {
            op: "fsync",
            seconds: 9.24,
            cause: Some(cause),
            symbol: Some(symbol),
            dirty_bytes_max: 1_503_238_553, // 1.4 GiB
            writeback_bytes_max: 0,
            dirty_threshold_bytes: GIB * 3 / 2,
            ..Facts::default()
        }
    }

    #[test]
    fn the_issue_example_reads_as_written() {
        let extra = [
            "top dirtier /system.slice/backup.service 1.1 GiB".to_owned(),
            "loop3 writing 2.0 MB/s at 100 % busy".to_owned(),
        ];
        let v = verdict(
            &facts(Cause::DirtyThrottle, "balance_dirty_pages"),
            &extra,
            Some(false),
        );
        assert_eq!(
            v,
            "fsync blocked 9.2 s in balance_dirty_pages (dirty throttling): dirty 1.4 GiB \
             at the 1.5 GiB threshold; top dirtier /system.slice/backup.service 1.1 GiB; \
             loop3 writing 2.0 MB/s at 100 % busy"
        );
    }

    #[test]
    fn a_frozen_filesystem_with_little_dirty_is_the_base_phrase_alone() {
        let f = Facts {
            op: "create",
            seconds: 3.0,
            ongoing: true,
            dirty_bytes_max: 4096,
            ..facts(Cause::Frozen, "percpu_rwsem_wait")
        };
        assert_eq!(
            verdict(&f, &[], None),
            "create blocked 3.0 s so far in percpu_rwsem_wait (filesystem frozen)"
        );
    }

    #[test]
    fn dirty_below_the_threshold_is_said_for_writeback_causes_with_writeback() {
        let f = Facts {
            dirty_bytes_max: 20 << 20,
            writeback_bytes_max: 3 << 20,
            ..facts(Cause::WritebackWait, "folio_wait_writeback")
        };
        assert_eq!(
            verdict(&f, &[], None),
            "fsync blocked 9.2 s in folio_wait_writeback (waiting for writeback): dirty \
             20.0 MiB below the 1.5 GiB threshold, 3.0 MiB under writeback"
        );
    }

    #[test]
    fn md_sync_and_an_idle_device_are_phrases() {
        let f = Facts {
            md: vec![("md0", "resync"), ("md1", "idle")],
            dirty_threshold_bytes: 0,
            ..facts(Cause::Md, "raid5_get_active_stripe")
        };
        assert_eq!(
            verdict(&f, &[], Some(true)),
            "fsync blocked 9.2 s in raid5_get_active_stripe (md RAID barrier, stripe cache \
             or resync): md0 running resync; the device was idle: the call was held above \
             the block layer"
        );
    }

    #[test]
    fn a_create_behind_a_metadata_read_says_so() {
        // The stall matrix's ext4 create reading its inode bitmap behind a busy device.
        let f = Facts {
            op: "create",
            seconds: 3.12,
            dirty_bytes_max: 20 << 20,
            ..facts(Cause::MetadataBuffer, "ext4_read_bh")
        };
        assert_eq!(
            verdict(&f, &[], Some(false)),
            "create blocked 3.1 s in ext4_read_bh (waiting for a metadata block under I/O)"
        );
    }

    #[test]
    fn a_threshold_lowered_during_the_stall_is_the_one_compared_with() {
        // The stall matrix's dirty-limit drop: vm.dirty_bytes 16 MiB for 6 s, then
        // the default again before the write returned.
        let f = Facts {
            op: "write",
            dirty_bytes_max: 18 << 20,
            dirty_threshold_bytes: GIB * 3 / 2,
            dirty_threshold_bytes_min: 16 << 20,
            ..facts(Cause::DirtyThrottle, "balance_dirty_pages")
        };
        assert_eq!(
            verdict(&f, &[], None),
            "write blocked 9.2 s in balance_dirty_pages (dirty throttling): dirty 18.0 MiB \
             at the 16.0 MiB threshold (1.5 GiB at the end)"
        );
        let steady = Facts {
            dirty_threshold_bytes_min: GIB * 3 / 2 - (1 << 20),
            ..facts(Cause::DirtyThrottle, "balance_dirty_pages")
        };
        assert!(
            !verdict(&steady, &[], None).contains("at the end"),
            "a threshold that moved less than 10 % is said once"
        );
    }

    #[test]
    fn a_call_held_in_two_waits_names_both() {
        // The stall matrix's metadata-storm fsync: its data's writeback, then the
        // device's cache flush, about 2 s each.
        let f = Facts {
            seconds: 3.94,
            dirty_threshold_bytes: 0,
            second: Some((
                2.04,
                WaitTime {
                    cause: Cause::DeviceQueue,
                    symbol: "submit_bio_wait".into(),
                    seconds: 1.9,
                },
            )),
            ..facts(Cause::WritebackWait, "folio_wait_writeback")
        };
        assert_eq!(
            verdict(&f, &[], Some(false)),
            "fsync blocked 3.9 s in folio_wait_writeback (waiting for writeback) 2.0 s and \
             in submit_bio_wait (block device queue or writeback throttling) 1.9 s"
        );
    }

    #[test]
    fn unknown_and_other_causes() {
        let f = Facts {
            cause: Some(Cause::Unknown),
            symbol: None,
            dirty_threshold_bytes: 0,
            ..facts(Cause::Unknown, "")
        };
        assert_eq!(
            verdict(&f, &[], None),
            "fsync blocked 9.2 s (no wait point sampled)"
        );
        let f = Facts { cause: None, ..f };
        assert_eq!(
            verdict(&f, &[], None),
            "fsync blocked 9.2 s (no wait point sampled)"
        );
        let f = Facts {
            dirty_threshold_bytes: 0,
            ..facts(Cause::Other, "mystery_wait")
        };
        assert_eq!(
            verdict(&f, &[], None),
            "fsync blocked 9.2 s in mystery_wait (wait point not in the cause table)"
        );
    }
}
