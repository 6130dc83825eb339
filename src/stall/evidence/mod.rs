//! The evidence of a stall beyond the VM counters: who was dirtying (per cgroup and per
//! process), what the backing devices did (per-second figures over the window) and the
//! ext4 journal's commit times; and the phrases a verdict is built from.
//!
//! One [`Reading`] is a pass over cgroupfs, `/proc/PID/io`, the devices' `stat` and the
//! journals, shared by every ongoing stall; each stall folds the readings of its window
//! into its own [`Window`], whose [`Window::evidence`] is what the event shows. The
//! window starts at the crossing (the first reading), since nothing is read before a
//! stall is seen, and ends with the first reading after the call returned.

//! `reading` is the pass, `window` the fold and the evidence it gives, `phrases` the
//! words for the verdict.

mod phrases;
mod reading;
mod window;

pub use phrases::{binary_bytes, decimal_bytes, duration, phrases};
pub use reading::{read, DeviceSample, Reading, Scope};
pub use window::{
    DeviceFigures, DeviceInterval, Dirtier, Evidence, JournalFigures, Window, Writer, TOP,
};

#[cfg(test)]
mod tests {
    use super::phrases::percent;
    use super::*;
    use crate::kernel::cgroups::{CgroupReading, CgroupStat};
    use crate::kernel::devstat::DiskStat;
    use crate::kernel::jbd2::JournalInfo;
    use crate::kernel::procio::ProcReading;
    use std::collections::HashMap;
    use std::path::Path;
    use std::time::Duration;
    use std::time::Instant;

    fn stat(write_ios: u64, write_sectors: u64, write_ticks: u64, io_ticks: u64) -> DiskStat {
        DiskStat {
            write_ios,
            write_sectors,
            write_ticks_ms: write_ticks,
            io_ticks_ms: io_ticks,
            flush_ios: Some(write_ios / 10),
            flush_ticks_ms: Some(write_ticks / 5),
            ..DiskStat::default()
        }
    }

    fn reading(
        at: Instant,
        cg: &[(&str, u64, u64, u64)],
        procs: &[(u32, u64)],
        s: DiskStat,
    ) -> Reading {
        let cgroups = CgroupReading {
            cgroups: cg
                .iter()
                .map(|&(p, dirty, writeback, written)| {
                    (
                        p.to_owned(),
                        CgroupStat {
                            dirty,
                            writeback,
                            written,
                        },
                    )
                })
                .collect(),
            walked: cg.len(),
            capped: cg.len() > 3,
            errors: 0,
        };
        Reading {
            at,
            cgroup_version: Some(1),
            memory_root: None,
            cgroups,
            procs: ProcReading {
                written: procs.iter().copied().collect(),
                unreadable: 2,
                capped: false,
            },
            devices: HashMap::from([(
                "loop3".to_owned(),
                DeviceSample {
                    stat: s,
                    inflight: Some((0, 128)),
                    nr_requests: Some(128),
                },
            )]),
            dev_nums: HashMap::new(),
            journals: HashMap::new(),
        }
    }

    fn scope() -> Scope {
        Scope {
            disk: Some("loop3".into()),
            device: Some("loop3".into()),
            members: vec![],
        }
    }

    #[test]
    fn a_window_ranks_dirtiers_and_keeps_device_peaks_and_minima() {
        let t0 = Instant::now();
        let s = |secs: f64| t0 + Duration::from_secs_f64(secs);
        let mut w = Window::new(scope());
        // 2 MB/s, 100 % busy, then 1 MB/s at 50 %; a 0.2 s slice merged into the next.
        w.fold(&reading(
            s(0.0),
            &[
                ("/", 0, 0, 100),
                ("/writer", 10 << 20, 0, 0),
                ("/idle", 0, 0, 0),
                ("/elsewhere", 100 << 20, 0, 0),
            ],
            &[(7, 1000)],
            stat(0, 0, 0, 0),
        ));
        w.fold(&reading(
            s(1.0),
            &[
                ("/", 0, 0, 2_000_100),
                ("/writer", 30 << 20, 2 << 20, 512 << 10),
                ("/idle", 0, 0, 0),
                ("/late", 4096, 0, 0),
                ("/elsewhere", 100 << 20, 0, 0),
                ("/flushing", 0, 1 << 20, 0),
            ],
            &[(7, 5_001_000), (8, 9)],
            stat(100, 3906, 10_000, 1000),
        ));
        w.fold(&reading(
            s(1.2),
            &[("/writer", 20 << 20, 0, 512 << 10)],
            &[(7, 6_001_000)],
            stat(110, 4000, 11_000, 1100),
        ));
        w.fold(&reading(
            s(2.0),
            &[("/writer", 25 << 20, 0, 1 << 20)],
            &[(7, 7_001_000)],
            stat(150, 5859, 15_000, 1500),
        ));
        let e = w.evidence(Path::new("/nonexistent"));
        assert_eq!(e.reads, 4);
        assert_eq!(e.cgroup_version, Some(1));
        assert_eq!(e.cgroup_reads_capped, 2);
        assert_eq!(e.cgroups_walked, 6);
        assert_eq!(
            e.dirtiers,
            vec![
                Dirtier {
                    cgroup: "/writer".into(),
                    dirty_bytes: 30 << 20,
                    writeback_bytes: 2 << 20,
                    written_bytes: 1 << 20
                },
                Dirtier {
                    cgroup: "/flushing".into(),
                    dirty_bytes: 0,
                    writeback_bytes: 1 << 20,
                    written_bytes: 0
                },
                Dirtier {
                    cgroup: "/elsewhere".into(),
                    dirty_bytes: 100 << 20,
                    writeback_bytes: 0,
                    written_bytes: 0
                },
                Dirtier {
                    cgroup: "/late".into(),
                    dirty_bytes: 4096,
                    writeback_bytes: 0,
                    written_bytes: 0
                },
                Dirtier {
                    cgroup: "/".into(),
                    dirty_bytes: 0,
                    writeback_bytes: 0,
                    written_bytes: 2_000_000
                },
            ],
            "the one that wrote to the disk, then by writeback; the idle cgroup not named"
        );
        assert_eq!(
            e.writers,
            vec![Writer {
                pid: 7,
                comm: "?".into(),
                cgroup: None,
                written_bytes: 7_000_000
            }],
            "pid 8 appeared with 9 bytes and wrote nothing since"
        );
        assert_eq!(e.processes_unreadable, 2);
        let d = &e.block_devices[0];
        assert_eq!((d.device.as_str(), d.role), ("loop3", "disk"));
        assert_eq!(d.window_seconds, 2.0);
        assert_eq!(d.written_bytes, 5859 * 512);
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-6 * b.max(1.0);
        assert!(close(d.write_bytes_per_second_max, 3906.0 * 512.0), "{d:?}");
        assert!(
            close(d.write_bytes_per_second_min, 1953.0 * 512.0 / 1.0),
            "{d:?}"
        );
        assert!(close(d.write_iops_max, 100.0) && close(d.write_iops_min, 50.0));
        assert!(close(d.utilisation_max, 1.0) && close(d.utilisation_min, 0.5));
        assert!(close(d.utilisation_avg, 0.75));
        assert!(
            close(d.write_latency_seconds_avg, 0.1),
            "15 s of ticks over 150 writes"
        );
        assert_eq!(d.flushes, Some(15));
        assert!(close(d.flush_seconds_avg, 0.2));
        assert_eq!((d.inflight_writes_max, d.nr_requests), (128, Some(128)));
        // The chart's intervals: 0-1 s, then 1-2 s (the 0.2 s slice merged into it).
        assert_eq!(d.intervals.len(), 2, "{:?}", d.intervals);
        assert!(close(Some(d.intervals[1].start_seconds), 1.0));
        assert!(close(
            Some(d.intervals[0].write_bytes_per_second),
            3906.0 * 512.0
        ));
        assert!(close(Some(d.intervals[1].utilisation), 0.5));
        assert!(close(d.intervals[0].write_latency_seconds, 0.1));
        assert_eq!(
            (d.intervals[0].flushes, d.intervals[1].flushes),
            (Some(10), Some(5))
        );

        let (p, idle) = phrases(&e);
        assert_eq!(idle, Some(false));
        assert_eq!(
            p,
            vec![
                "top dirtier /writer 32.0 MiB",
                "top writing process ? (pid 7) 7.0 MB written",
                "loop3 writing 1.5 MB/s at 75 % busy, 100 ms per write",
                "loop3 queue full (128 of 128 requests in flight)",
                "loop3 15 flushes at 200 ms each",
            ]
        );
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["dirtiers"][0]["cgroup"], "/writer");
        assert_eq!(json["block_devices"][0]["utilisation_max"], 1.0);
        assert!(json["block_devices"][0].get("intervals").is_none());
        assert_eq!(json["journal"], serde_json::Value::Null);
    }

    #[test]
    fn writers_are_the_named_cgroups_processes() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("writer")).unwrap();
        std::fs::write(root.path().join("writer/cgroup.procs"), "7\n").unwrap();
        std::fs::create_dir(root.path().join("second")).unwrap();
        std::fs::write(root.path().join("second/cgroup.procs"), "11\n").unwrap();
        let t0 = Instant::now();
        let mut w = Window::new(scope());
        let mut r = reading(
            t0,
            &[
                ("/writer", 1 << 20, 0, 0),
                ("/second", 4096, 0, 0),
                ("/build", 0, 0, 0),
            ],
            &[(7, 0), (9, 0), (11, 0)],
            stat(0, 0, 0, 0),
        );
        r.memory_root = Some(root.path().to_owned());
        w.fold(&r);
        r.procs.written = HashMap::from([(7, 4096), (9, 500 << 20), (11, 90 << 20)]);
        w.fold(&r);
        let e = w.evidence(Path::new("/nonexistent"));
        let pids: Vec<(u32, Option<&str>)> = e
            .writers
            .iter()
            .map(|w| (w.pid, w.cgroup.as_deref()))
            .collect();
        assert_eq!(
            pids,
            [(7, Some("/writer")), (11, Some("/second"))],
            "the first dirtier's process first; pid 9 wrote most, outside the named cgroups"
        );
        assert_eq!(
            phrases(&e).0[1],
            "top writing process ? (pid 7 in /writer) 4.1 kB written"
        );
    }

    #[test]
    fn a_long_window_keeps_its_whole_span_in_at_most_60_intervals() {
        let t0 = Instant::now();
        let mut w = Window::new(scope());
        // 61 one-second intervals, 10 writes in each.
        for k in 0..62u64 {
            let at = t0 + Duration::from_secs(k);
            w.fold(&reading(
                at,
                &[],
                &[],
                stat(10 * k, 80 * k, 10 * k, 500 * k),
            ));
        }
        let d = &w.evidence(Path::new("/nonexistent")).block_devices[0];
        let iv = &d.intervals;
        assert_eq!(iv.len(), 31, "60 merged into 30 pairs, then the 61st");
        assert_eq!((iv[0].start_seconds, iv[0].seconds), (0.0, 2.0));
        assert_eq!((iv[1].start_seconds, iv[30].start_seconds), (2.0, 60.0));
        for i in iv {
            assert!(
                (i.write_bytes_per_second - 80.0 * 512.0).abs() < 1e-6,
                "{i:?}"
            );
            assert!((i.utilisation - 0.5).abs() < 1e-9, "{i:?}");
            assert_eq!(i.write_latency_seconds, Some(0.001));
        }
        assert_eq!(iv[0].flushes, Some(2), "a pair's flushes add up");
    }

    #[test]
    fn an_idle_device_and_a_short_window() {
        let t0 = Instant::now();
        let mut w = Window::new(scope());
        let s = stat(10, 80, 5, 40);
        w.fold(&reading(t0, &[], &[], s));
        let e = w.evidence(Path::new("/nonexistent"));
        assert!(
            e.block_devices[0].utilisation_max.is_none(),
            "one reading: no rate"
        );
        assert_eq!(phrases(&e), (vec![], None));
        // 0.3 s later: shorter than an interval, no rate yet.
        w.fold(&reading(t0 + Duration::from_millis(300), &[], &[], s));
        let e = w.evidence(Path::new("/nonexistent"));
        assert_eq!(e.block_devices[0].utilisation_avg, None);
        assert_eq!(phrases(&e), (vec![], None));
        // 0.6 s, nothing moved: one interval, its rate is peak and minimum.
        w.fold(&reading(t0 + Duration::from_millis(600), &[], &[], s));
        let e = w.evidence(Path::new("/nonexistent"));
        let d = &e.block_devices[0];
        assert_eq!(
            (d.utilisation_max, d.write_bytes_per_second_min),
            (Some(0.0), Some(0.0))
        );
        assert_eq!(d.write_latency_seconds_avg, None, "no write completed");
        assert_eq!(
            phrases(&e),
            (vec!["loop3 idle (0 % busy)".to_owned()], Some(true))
        );
    }

    #[test]
    fn journal_figures_from_start_to_end() {
        let t0 = Instant::now();
        let mut w = Window::new(scope());
        let info = |n, c| JournalInfo {
            transactions: n,
            commit_seconds_avg: Some(c),
            ..JournalInfo::default()
        };
        let mut r = reading(t0, &[], &[], stat(0, 0, 0, 0));
        r.journals
            .insert("loop3".into(), ("loop3-8".into(), info(20, 0.0016)));
        w.fold(&r);
        r.journals
            .insert("loop3".into(), ("loop3-8".into(), info(23, 2.5)));
        w.fold(&r);
        let e = w.evidence(Path::new("/nonexistent"));
        let j = e.journal.as_ref().unwrap();
        assert_eq!((j.journal.as_str(), j.transactions), ("loop3-8", 3));
        assert_eq!(j.start.commit_seconds_avg, Some(0.0016));
        assert!(phrases(&e).0.contains(
            &"ext4 journal loop3-8: 3 commits in the window, average commit 2.5 s".to_owned()
        ));
    }

    #[test]
    fn units() {
        assert_eq!(binary_bytes(0), "0 B");
        assert_eq!(binary_bytes(1_181_116_006), "1.1 GiB");
        assert_eq!(binary_bytes(512 << 10), "512.0 KiB");
        assert_eq!(binary_bytes(1023), "1023 B");
        assert_eq!(binary_bytes(1536), "1.5 KiB");
        assert_eq!(binary_bytes(3 << 50), "3.0 PiB");
        assert_eq!(decimal_bytes(2_000_000.0), "2.0 MB");
        assert_eq!(decimal_bytes(999.0), "999 B");
        assert_eq!(duration(9.24), "9.2 s");
        assert_eq!(duration(0.85), "850 ms");
        assert_eq!(duration(0.00031), "310 µs");
        assert_eq!(percent(1.2), "100");
    }
}
