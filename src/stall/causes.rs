//! Why a call is held in the kernel: the fixed set of causes and the one table that maps
//! kernel wait points (a `wchan` symbol, a frame of `/proc/PID/task/TID/stack`) to them.
//!
//! A new kernel that renames a wait point is one line in [`TABLE`] and one fixture in the
//! tests below. The names were checked against the kernel sources (torvalds/linux) and,
//! where this kernel has them, against `/proc/kallsyms` of 6.18; inline helpers such as
//! `sb_start_write` or `xlog_wait` never appear as frames, so the table names the
//! functions they call instead.

use crate::base::labels::Cause;

/// How a table entry matches a symbol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// The whole symbol.
    Exact(&'static str),
    /// A family of functions sharing a prefix (`jbd2_`, `fuse_`).
    Prefix(&'static str),
}

impl Pattern {
    fn matches(self, symbol: &str) -> bool {
        match self {
            Pattern::Exact(s) => symbol == s,
            Pattern::Prefix(p) => symbol.starts_with(p),
        }
    }
}

use Cause::*;
use Pattern::{Exact, Prefix};

/// Wait points and their causes, the whole mapping. Order matters only where two
/// patterns could match the same symbol: the first one wins.
pub const TABLE: &[(Pattern, Cause)] = &[
    // sb_start_write()/sb_start_intwrite() (inline) take the superblock's percpu
    // rwsem, which freeze_super() holds for writing until the thaw.
    (Exact("percpu_rwsem_wait"), Frozen),
    (Exact("__percpu_down_read"), Frozen),
    (Exact("__sb_start_write"), Frozen),
    (Exact("sb_start_write"), Frozen),
    (Exact("balance_dirty_pages"), DirtyThrottle),
    (
        Exact("balance_dirty_pages_ratelimited_flags"),
        DirtyThrottle,
    ),
    // ext4: jbd2_log_wait_commit, jbd2_journal_force_commit, start_this_handle →
    // wait_transaction_locked / add_transaction_credits (a commit holds the journal).
    (Prefix("jbd2_"), Journal),
    (Exact("wait_transaction_locked"), Journal),
    (Exact("add_transaction_credits"), Journal),
    (Exact("start_this_handle"), Journal),
    // XFS: xfs_log_force(_seq) → xlog_cil_force_seq → xlog_wait_on_iclog; log space.
    (Prefix("xlog_"), Journal),
    (Prefix("xfs_log_force"), Journal),
    // btrfs: a transaction commit; an fsync's log tree sync (btrfs_sync_log, its log
    // mutex held by another fsync's log sync: seen as `__mutex_lock` under it in the
    // stall matrix, tests/it/matrix.rs).
    (Exact("wait_current_trans"), Journal),
    (Exact("btrfs_commit_transaction"), Journal),
    (Exact("btrfs_sync_log"), Journal),
    // jbd2's get_write_access waits while the journal commit writes the buffer out
    // (BH_Shadow); wchan names this static function, the stack its jbd2_ caller.
    (Exact("do_get_write_access"), Journal),
    (Exact("folio_wait_writeback"), WritebackWait),
    // What wchan shows for folio_wait_writeback (its caller is skipped as a scheduling
    // frame on 6.x); it also waits for a folio lock, but in a probe's write or fsync the
    // folio waited on is under writeback. The stack, where readable, names the caller.
    (Exact("folio_wait_bit"), WritebackWait),
    (Exact("wait_on_page_writeback"), WritebackWait),
    (Exact("folio_wait_stable"), WritebackWait),
    (Prefix("filemap_fdatawait"), WritebackWait),
    (Exact("__filemap_fdatawait_range"), WritebackWait),
    (Exact("wb_wait_for_completion"), WritebackWait),
    (Exact("btrfs_wait_ordered_range"), WritebackWait),
    // Writeback throttling (wbt) and other rq-qos policies, a full tag set, a queue
    // frozen or entered while draining, a synchronous bio (blkdev_issue_flush).
    (Exact("rq_qos_wait"), DeviceQueue),
    (Exact("wbt_wait"), DeviceQueue),
    (Exact("__rq_qos_throttle"), DeviceQueue),
    (Exact("blk_mq_get_tag"), DeviceQueue),
    (Exact("__bio_queue_enter"), DeviceQueue),
    (Exact("blk_queue_enter"), DeviceQueue),
    (Exact("submit_bio_wait"), DeviceQueue),
    (Exact("blkdev_issue_flush"), DeviceQueue),
    // A metadata block locked or under I/O: buffer-head waits (wait_on_buffer and
    // lock_buffer are inline; their out-of-line parts are often tail calls, so the
    // frame seen is the filesystem function that waits), and the ext4 functions seen
    // waiting so in the stall matrix (tests/it/matrix.rs): a create reading the inode
    // bitmap (ext4_read_bh ← ext4_read_inode_bitmap) or the inode table block
    // (__ext4_get_inode_loc), a lookup reading a directory block (__ext4_find_entry).
    // `__ext4_new_inode` is the wchan of a create's wait on its allocation metadata (the
    // bitmap, the group's itable-init lock) when no inner frame says more; a journal
    // wait inside it shows start_this_handle or do_get_write_access first.
    (Exact("__wait_on_buffer"), MetadataBuffer),
    (Exact("__lock_buffer"), MetadataBuffer),
    (Exact("bh_uptodate_or_lock"), MetadataBuffer),
    (Exact("ext4_read_bh"), MetadataBuffer),
    (Exact("ext4_read_bh_lock"), MetadataBuffer),
    (Exact("ext4_read_inode_bitmap"), MetadataBuffer),
    (Exact("ext4_wait_block_bitmap"), MetadataBuffer),
    (Exact("__ext4_get_inode_loc"), MetadataBuffer),
    (Exact("__ext4_find_entry"), MetadataBuffer),
    (Exact("__ext4_new_inode"), MetadataBuffer),
    // A lookup whose name another thread is looking up already waits for that lookup to
    // finish (d_alloc_parallel → d_wait_lookup, static and usually inlined, so the wchan
    // and the frame seen are d_alloc_parallel): on a local filesystem, for the directory
    // block or inode that lookup is reading. Seen with the cold reads of the stall matrix.
    (Exact("d_alloc_parallel"), MetadataBuffer),
    (Exact("d_wait_lookup"), MetadataBuffer),
    // XFS: a metadata buffer being read (xfs_buf_read_map → xfs_buf_iowait, the AGF or
    // AGI of an allocation group, a btree block), seen under a create after drop_caches.
    (Exact("xfs_buf_iowait"), MetadataBuffer),
    // md: md_write_start (superblock update), md_flush_request, raid1/raid10
    // wait_barrier / _wait_barrier (resync barrier), raid5_get_active_stripe (cache).
    (Prefix("md_"), Md),
    (Exact("wait_barrier"), Md),
    (Exact("_wait_barrier"), Md),
    (Exact("raid5_get_active_stripe"), Md),
    (Prefix("raid1_"), Md),
    (Prefix("raid10_"), Md),
    (Prefix("raid5_"), Md),
    // FUSE: request_wait_answer ← __fuse_simple_request; NFS and SUNRPC waits.
    (Exact("request_wait_answer"), Remote),
    (Prefix("fuse_"), Remote),
    (Prefix("__fuse_"), Remote),
    (Prefix("nfs_"), Remote),
    (Prefix("nfs4_"), Remote),
    (Prefix("rpc_"), Remote),
    (Exact("__rpc_execute"), Remote),
];

/// The cause of one wait-point symbol, when the table knows it.
pub fn of_symbol(symbol: &str) -> Option<Cause> {
    TABLE
        .iter()
        .find(|(p, _)| p.matches(symbol))
        .map(|&(_, c)| c)
}

/// Wait points that say what kind of wait, not what is awaited: in a stack a known
/// caller further out decides; alone (a wchan) they decide by themselves.
pub const GENERIC: &[&str] = &["folio_wait_bit"];

/// The cause of a stack (innermost frame first) and the frame that decided it: the
/// innermost frame the table knows, generic ones ([`GENERIC`]) only when no other frame
/// is known. Scheduling frames (`io_schedule`) are not in the table at all, so the search
/// walks past them to the caller that says what is awaited.
pub fn of_stack<S: AsRef<str>>(frames: &[S]) -> Option<(Cause, &str)> {
    let known = |generic: bool| {
        frames
            .iter()
            .map(AsRef::as_ref)
            .filter(|f| generic || !GENERIC.contains(f))
            .find_map(|f| of_symbol(f).map(|c| (c, f)))
    };
    known(false).or_else(|| known(true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use strum::VariantArray;

    /// One fixture per table entry: a symbol as the kernel writes it, and its cause.
    const FIXTURES: &[(&str, Cause)] = &[
        ("percpu_rwsem_wait", Frozen),
        ("__percpu_down_read", Frozen),
        ("__sb_start_write", Frozen),
        ("sb_start_write", Frozen),
        ("balance_dirty_pages", DirtyThrottle),
        ("balance_dirty_pages_ratelimited_flags", DirtyThrottle),
        ("jbd2_log_wait_commit", Journal),
        ("wait_transaction_locked", Journal),
        ("add_transaction_credits", Journal),
        ("start_this_handle", Journal),
        ("xlog_wait_on_iclog", Journal),
        ("xfs_log_force_seq", Journal),
        ("wait_current_trans", Journal),
        ("btrfs_commit_transaction", Journal),
        ("btrfs_sync_log", Journal),
        ("folio_wait_writeback", WritebackWait),
        ("folio_wait_bit", WritebackWait),
        ("wait_on_page_writeback", WritebackWait),
        ("folio_wait_stable", WritebackWait),
        ("filemap_fdatawait_keep_errors", WritebackWait),
        ("__filemap_fdatawait_range", WritebackWait),
        ("wb_wait_for_completion", WritebackWait),
        ("btrfs_wait_ordered_range", WritebackWait),
        ("rq_qos_wait", DeviceQueue),
        ("wbt_wait", DeviceQueue),
        ("__rq_qos_throttle", DeviceQueue),
        ("blk_mq_get_tag", DeviceQueue),
        ("__bio_queue_enter", DeviceQueue),
        ("blk_queue_enter", DeviceQueue),
        ("submit_bio_wait", DeviceQueue),
        ("blkdev_issue_flush", DeviceQueue),
        ("do_get_write_access", Journal),
        ("__wait_on_buffer", MetadataBuffer),
        ("__lock_buffer", MetadataBuffer),
        ("bh_uptodate_or_lock", MetadataBuffer),
        ("ext4_read_bh", MetadataBuffer),
        ("ext4_read_bh_lock", MetadataBuffer),
        ("ext4_read_inode_bitmap", MetadataBuffer),
        ("ext4_wait_block_bitmap", MetadataBuffer),
        ("__ext4_get_inode_loc", MetadataBuffer),
        ("__ext4_find_entry", MetadataBuffer),
        ("__ext4_new_inode", MetadataBuffer),
        ("d_alloc_parallel", MetadataBuffer),
        ("d_wait_lookup", MetadataBuffer),
        ("xfs_buf_iowait", MetadataBuffer),
        ("md_write_start", Md),
        ("wait_barrier", Md),
        ("_wait_barrier", Md),
        ("raid5_get_active_stripe", Md),
        ("raid1_write_request", Md),
        ("raid10_write_request", Md),
        ("raid5_make_request", Md),
        ("request_wait_answer", Remote),
        ("fuse_wait_on_page_writeback", Remote),
        ("__fuse_simple_request", Remote),
        ("nfs_wait_bit_killable", Remote),
        ("nfs4_wait_clnt_recover", Remote),
        ("rpc_wait_bit_killable", Remote),
        ("__rpc_execute", Remote),
    ];

    #[test]
    fn every_fixture_maps_to_its_cause() {
        for &(symbol, cause) in FIXTURES {
            assert_eq!(of_symbol(symbol), Some(cause), "{symbol}");
        }
    }

    #[test]
    fn every_table_entry_has_a_fixture() {
        for &(pattern, cause) in TABLE {
            let covered = FIXTURES
                .iter()
                .any(|&(s, c)| c == cause && pattern.matches(s) && of_symbol(s) == Some(cause));
            assert!(covered, "no fixture for {pattern:?} -> {cause}");
        }
    }

    #[test]
    fn scheduling_and_unrelated_symbols_are_not_mapped() {
        for s in [
            "io_schedule",
            "schedule",
            "do_sys_openat2",
            "sigsuspend.isra.0",
            "hrtimer_nanosleep",
            "",
        ] {
            assert_eq!(of_symbol(s), None, "{s}");
        }
    }

    #[test]
    fn a_stack_is_decided_by_its_innermost_known_frame() {
        // ext4 fsync behind writeback, as /proc/PID/task/TID/stack lists it.
        let fsync = [
            "folio_wait_bit",
            "folio_wait_writeback",
            "__filemap_fdatawait_range",
            "file_write_and_wait_range",
            "ext4_sync_file",
            "__x64_sys_fsync",
        ];
        assert_eq!(
            of_stack(&fsync),
            Some((WritebackWait, "folio_wait_writeback"))
        );
        let frozen = ["percpu_rwsem_wait", "mnt_want_write", "path_openat"];
        assert_eq!(of_stack(&frozen), Some((Frozen, "percpu_rwsem_wait")));
        assert_eq!(of_stack(&["do_syscall_64"]), None);
        let generic_only = ["folio_wait_bit", "filemap_read", "vfs_read"];
        assert_eq!(
            of_stack(&generic_only),
            Some((WritebackWait, "folio_wait_bit"))
        );
        assert_eq!(of_stack::<&str>(&[]), None);
    }

    /// Stacks the stall matrix (tests/it/matrix.rs) read from the kernel, as tracefs and
    /// /proc/PID/task/TID/stack write them, and the cause each must get.
    #[test]
    fn stacks_seen_in_the_stall_matrix() {
        // btrfs, random 4 KiB writes on a throttled device: the probe's fsync waits for
        // the log mutex another fsync holds while it syncs the log tree.
        let btrfs_log = [
            "__schedule",
            "schedule",
            "schedule_preempt_disabled",
            "__mutex_lock.constprop.0",
            "btrfs_sync_log",
            "btrfs_sync_file",
            "do_fsync",
            "__x64_sys_fsync",
        ];
        assert_eq!(of_stack(&btrfs_log), Some((Journal, "btrfs_sync_log")));
        // ext4 creates, their inner frames after the scheduler's (tracefs stacks of the
        // create lane). A journal wait inside __ext4_new_inode stays a journal wait.
        let tail = [
            "__ext4_new_inode",
            "ext4_create",
            "path_openat",
            "do_filp_open",
        ];
        let bit_wait = [
            "io_schedule",
            "bit_wait_io",
            "__wait_on_bit",
            "out_of_line_wait_on_bit",
        ];
        let seen: [(&[&str], Cause, &str); 5] = [
            (
                &["ext4_read_bh", "ext4_read_inode_bitmap"],
                MetadataBuffer,
                "ext4_read_bh",
            ),
            (
                &[
                    "__ext4_get_inode_loc",
                    "ext4_get_inode_loc",
                    "ext4_reserve_inode_write",
                    "__ext4_mark_inode_dirty",
                ],
                MetadataBuffer,
                "__ext4_get_inode_loc",
            ),
            (
                &[
                    "do_get_write_access",
                    "jbd2_journal_get_write_access",
                    "__ext4_journal_get_write_access",
                ],
                Journal,
                "do_get_write_access",
            ),
            (
                &[
                    "wait_transaction_locked",
                    "add_transaction_credits",
                    "start_this_handle",
                    "jbd2__journal_start",
                ],
                Journal,
                "wait_transaction_locked",
            ),
            (&[], MetadataBuffer, "__ext4_new_inode"),
        ];
        for (inner, cause, frame) in seen {
            let stack: Vec<&str> = bit_wait.iter().chain(inner).chain(&tail).copied().collect();
            assert_eq!(of_stack(&stack), Some((cause, frame)), "{stack:?}");
        }
        // XFS: a create reading its allocation group's AGI.
        let xfs = [
            "__schedule",
            "schedule",
            "schedule_timeout",
            "wait_for_completion",
            "xfs_buf_iowait",
            "xfs_buf_read_map",
            "xfs_trans_read_buf_map",
            "xfs_read_agi",
            "xfs_ialloc_read_agi",
            "xfs_dialloc",
        ];
        assert_eq!(of_stack(&xfs), Some((MetadataBuffer, "xfs_buf_iowait")));
        // A lookup reading a directory block.
        let lookup = [
            "out_of_line_wait_on_bit",
            "__ext4_find_entry",
            "ext4_lookup",
            "__lookup_slow",
        ];
        assert_eq!(
            of_stack(&lookup),
            Some((MetadataBuffer, "__ext4_find_entry"))
        );
    }

    #[test]
    fn label_values_are_the_contract_set() {
        let names: Vec<&str> = Cause::VARIANTS.iter().map(|c| c.as_str()).collect();
        assert_eq!(
            names,
            [
                "frozen",
                "dirty_throttle",
                "journal",
                "writeback_wait",
                "device_queue",
                "metadata_buffer",
                "md",
                "remote",
                "other",
                "unknown"
            ]
        );
        assert_eq!(
            serde_json::to_value(DirtyThrottle).unwrap(),
            "dirty_throttle"
        );
    }

    /// The causes table of docs/stall-events.md says what `TABLE` does: every pattern in
    /// the row of its cause (a prefix as `prefix*`), and every wait point the docs name
    /// mapped to the cause of its row.
    #[test]
    fn the_documented_causes_table_is_this_table() {
        let docs = include_str!("../../docs/stall-events.md");
        let mut rows = std::collections::HashMap::new();
        for line in docs.lines().filter(|l| l.starts_with("| `")) {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let cause = cells[1].trim_matches('`');
            let mapped = Cause::VARIANTS
                .iter()
                .any(|&c| c.as_str() == cause && !matches!(c, Other | Unknown));
            if mapped {
                let points: Vec<&str> = cells[3].split('`').skip(1).step_by(2).collect();
                rows.insert(cause, points);
            }
        }
        for &(pattern, cause) in TABLE {
            let named = match pattern {
                Exact(s) => s.to_owned(),
                Prefix(p) => format!("{p}*"),
            };
            let row = rows
                .get(cause.as_str())
                .unwrap_or_else(|| panic!("no row for {cause}"));
            assert!(
                row.contains(&named.as_str()),
                "{named} -> {cause} is not in the docs' row"
            );
        }
        for (cause, points) in &rows {
            for point in points {
                let symbol = point.trim_end_matches('*');
                assert_eq!(
                    of_symbol(symbol).map(Cause::as_str),
                    Some(*cause),
                    "the docs put {point} under {cause}"
                );
            }
        }
    }
}
