//! Self-tests of the shared harness in `support/`.

use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::agent::{parse_listening, Agent, AGENT_BIN};
use crate::support::cmd::run;
use crate::support::loopfs::LoopFs;
use crate::support::machine;
use crate::support::metrics::Metrics;
use crate::support::mounts::{mounted_at, mountinfo};
use crate::support::root::{euid, require_root, SKIP_ROOT_ENV};
use crate::support::wait::wait_until;

// ---------------------------------------------------------------------------------------
// Metrics: lookups over what nom-openmetrics parsed
// ---------------------------------------------------------------------------------------

// What `prometheus::TextEncoder` writes: HELP (escaped), TYPE, one sample per line.
const EXPOSITION: &str = r#"# HELP stallwatch_probe_duration_seconds Latency of each completed op.\nCached; never waits.
# TYPE stallwatch_probe_duration_seconds histogram
stallwatch_probe_duration_seconds_bucket{target="raid0",mode="overwrite",op="write",le="0.001"} 3
stallwatch_probe_duration_seconds_bucket{target="raid0",mode="overwrite",op="write",le="+Inf"} 5
stallwatch_probe_duration_seconds_sum{target="raid0",mode="overwrite",op="write"} 1.25e-2
stallwatch_probe_duration_seconds_count{target="raid0",mode="overwrite",op="write"} 5
stallwatch_probe_duration_seconds_count{target="raid0",mode="overwrite",op="fsync"} 4
stallwatch_probe_duration_seconds_count{target="db",mode="overwrite",op="fsync"} 7
# TYPE stallwatch_target_up gauge
stallwatch_target_up{target="raid0"} 1
stallwatch_target_up{target="db"} 0
stallwatch_build_info{version="0.1.0"} 1
process_open_fds 12
odd_values{kind="nan"} NaN
odd_values{kind="pinf"} +Inf
odd_values{kind="ninf"} -Inf
stallwatch_target_info{target="weird",path="/srv/a \"quoted\" dir",mountpoint="C:\\mnt\\x",device="line\nbreak",fstype="xfs",options="rw,relatime"} 1
"#;

#[test]
fn metrics_parse_values_and_lookups() {
    let m = Metrics::parse(EXPOSITION).expect("parse");
    let w = [("target", "raid0"), ("op", "write")];
    assert_eq!(
        m.get("stallwatch_probe_duration_seconds_count", &w),
        Some(5.0)
    );
    assert_eq!(
        m.get("stallwatch_probe_duration_seconds_sum", &w),
        Some(0.0125)
    );
    assert_eq!(
        m.get(
            "stallwatch_probe_duration_seconds_bucket",
            &[("op", "write"), ("le", "+Inf")]
        ),
        Some(5.0)
    );
    // Exact name match: the family name alone is not a sample.
    assert_eq!(m.get("stallwatch_probe_duration_seconds", &[]), None);
    assert!(m.has("stallwatch_probe_duration_seconds"));
    assert!(m.has("stallwatch_probe_duration_seconds_count"));
    assert!(!m.has("stallwatch_probe_duration"));
    assert!(!m.has("stallwatch_nonexistent"));
    assert_eq!(
        m.sum(
            "stallwatch_probe_duration_seconds_count",
            &[("op", "fsync")]
        ),
        11.0
    );
    assert_eq!(m.sum("stallwatch_probe_duration_seconds_count", &[]), 16.0);
    assert_eq!(m.sum("stallwatch_nonexistent", &[]), 0.0);
    assert_eq!(
        m.count(
            "stallwatch_probe_duration_seconds_count",
            &[("mode", "overwrite")]
        ),
        3
    );
    assert_eq!(
        m.get("stallwatch_target_up", &[("target", "db")]),
        Some(0.0)
    );
    assert_eq!(m.get("stallwatch_target_up", &[("target", "nope")]), None);
    assert_eq!(m.get("process_open_fds", &[]), Some(12.0));
    assert_eq!(m.get("process_open_fds", &[("x", "y")]), None);

    let up = m.series("stallwatch_target_up");
    assert_eq!(up.len(), 2);
    assert_eq!(up[0].0.get("target").map(String::as_str), Some("raid0"));
    assert_eq!(up[0].1, 1.0);

    assert!(m.get("odd_values", &[("kind", "nan")]).unwrap().is_nan());
    assert_eq!(
        m.get("odd_values", &[("kind", "pinf")]),
        Some(f64::INFINITY)
    );
    assert_eq!(
        m.get("odd_values", &[("kind", "ninf")]),
        Some(f64::NEG_INFINITY)
    );

    assert_eq!(
        m.type_of("stallwatch_probe_duration_seconds"),
        Some("histogram")
    );
    assert_eq!(m.type_of("stallwatch_target_up"), Some("gauge"));
    assert_eq!(
        m.help("stallwatch_probe_duration_seconds"),
        Some("Latency of each completed op.\nCached; never waits.")
    );
    assert!(m.names().contains(&"stallwatch_build_info".to_string()));
}

#[test]
fn metrics_parse_escaped_label_values() {
    let m = Metrics::parse(EXPOSITION).expect("parse");
    let info = m.series("stallwatch_target_info");
    assert_eq!(info.len(), 1);
    let l = &info[0].0;
    assert_eq!(l["path"], r#"/srv/a "quoted" dir"#);
    assert_eq!(l["mountpoint"], r"C:\mnt\x");
    assert_eq!(l["device"], "line\nbreak");
    assert_eq!(l["options"], "rw,relatime");
    // Lookup by an unescaped value.
    assert_eq!(
        m.get(
            "stallwatch_target_info",
            &[("path", "/srv/a \"quoted\" dir"), ("fstype", "xfs")]
        ),
        Some(1.0)
    );
    // A '}' or ',' inside a quoted value is part of the value.
    let m = Metrics::parse("x{a=\"}{,\\\\\",b=\"2\"} 1\n").expect("parse");
    assert_eq!(m.get("x", &[("a", "}{,\\"), ("b", "2")]), Some(1.0));
}

#[test]
fn metrics_parse_rejects_malformed_lines() {
    for bad in [
        "x{a=\"1\" 1",          // unterminated label set
        "x{a=1} 1",             // unquoted value
        "x{a=\"1} 1",           // unterminated value
        "x{a=\"1\",a=\"2\"} 1", // duplicate label
        "x",                    // no value
        "x one",                // bad value
        "x 1 2 3",              // trailing garbage
        "1x 1",                 // bad name
        "x 1 notatimestamp",    // bad timestamp
    ] {
        let err = Metrics::parse(&format!("ok 1\n{bad}\n"));
        assert!(err.is_err(), "accepted {bad:?}");
        assert!(err.unwrap_err().contains("line 2"), "no line number");
    }
}

#[test]
#[should_panic(expected = "ambiguous")]
fn metrics_get_panics_when_ambiguous() {
    let m = Metrics::parse(EXPOSITION).unwrap();
    m.get("stallwatch_target_up", &[]);
}

// ---------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------

#[test]
fn listening_address_is_found_in_plain_logfmt_and_json_logs() {
    assert_eq!(
        parse_listening("2026-11-30T23:14:02Z  INFO stallwatch: listening on 127.0.0.1:40111")
            .as_deref(),
        Some("127.0.0.1:40111")
    );
    assert_eq!(
        parse_listening(
            r#"ts=2026-11-30T23:14:02Z level=info msg="listening on 127.0.0.1:40111" x=1"#
        )
        .as_deref(),
        Some("127.0.0.1:40111")
    );
    assert_eq!(
        parse_listening(r#"{"level":"INFO","fields":{"message":"listening on [::1]:5"}}"#)
            .as_deref(),
        Some("[::1]:5")
    );
    assert_eq!(
        parse_listening(r#"msg=\"listening on 127.0.0.1:9\""#).as_deref(),
        Some("127.0.0.1:9")
    );
    assert_eq!(
        parse_listening("listening on http://127.0.0.1:7/ now").as_deref(),
        Some("127.0.0.1:7")
    );
    assert_eq!(parse_listening("not listening yet"), None);
}

#[test]
fn wait_until_is_bounded() {
    let _machine = machine::shared();
    let t = Instant::now();
    assert!(!wait_until(
        Duration::from_millis(200),
        Duration::from_millis(20),
        || false
    ));
    let e = t.elapsed();
    assert!(
        e >= Duration::from_millis(200) && e < Duration::from_secs(2),
        "{e:?}"
    );

    let mut n = 0;
    assert!(wait_until(
        Duration::from_secs(5),
        Duration::from_millis(1),
        || {
            n += 1;
            n == 3
        }
    ));
    assert_eq!(n, 3);
}

#[test]
fn agent_api_compiles() {
    // The binary is not exercised here; just make sure the harness API type-checks and
    // the binary path is known.
    let _start: fn(&str) -> Agent = Agent::start;
    let _start_with: fn(&str, &[&str]) -> Agent = Agent::start_with_args;
    let _get: fn(&Agent, &str) -> (u16, String, Duration) = Agent::get;
    let _scrape: fn(&Agent) -> Metrics = Agent::scrape;
    assert!(AGENT_BIN.ends_with("stallwatch"));
}

#[test]
fn require_root_as_root() {
    if euid() == 0 {
        assert!(require_root("require_root_as_root"));
    } else if std::env::var(SKIP_ROOT_ENV).as_deref() == Ok("1") {
        assert!(!require_root("require_root_as_root"));
    } else {
        let r = catch_unwind(|| require_root("require_root_as_root"));
        assert!(
            r.is_err(),
            "must panic without root and without the skip variable"
        );
    }
}

// ---------------------------------------------------------------------------------------
// LoopFs (root)
// ---------------------------------------------------------------------------------------

/// Output of `losetup -a` (one line per attached loop device, naming its backing file).
fn losetup_list() -> String {
    run("losetup", &["-a"])
}

/// True when anything is mounted at `path` or below it.
fn any_mount_under(path: &Path) -> bool {
    mountinfo().iter().any(|m| m.mount_point.starts_with(path))
}

/// What identifies a guard after it is gone.
struct Traces {
    image: PathBuf,
    root: PathBuf,
    mnt: PathBuf,
    maj_min: String,
}

impl Traces {
    fn of(fs: &LoopFs) -> Traces {
        Traces {
            image: fs.image().to_path_buf(),
            root: fs.root().to_path_buf(),
            mnt: fs.path().to_path_buf(),
            maj_min: fs.maj_min(),
        }
    }

    /// No loop device on our image, nothing mounted under our tempdir, tempdir gone, no
    /// throttle rule left. (By image path, not by device name: a concurrent test may
    /// already have been given the same /dev/loopN.)
    fn assert_gone(&self) {
        let list = losetup_list();
        assert!(
            !list.contains(self.image.to_str().unwrap()),
            "loop device still attached to {}:\n{list}",
            self.image.display()
        );
        assert!(
            !any_mount_under(&self.root),
            "mount left under {}",
            self.root.display()
        );
        let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mi.contains(self.mnt.to_str().unwrap()), "{mi}");
        assert!(!self.root.exists(), "{} still exists", self.root.display());
        let rules = std::fs::read_to_string("/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device")
            .unwrap();
        assert!(
            !rules
                .lines()
                .any(|l| l.split_whitespace().next() == Some(self.maj_min.as_str())),
            "throttle rule left: {rules}"
        );
    }
}

fn assert_mounted_ours(fs: &LoopFs) {
    let m = mounted_at(fs.path()).expect("mounted");
    assert_eq!(m.mount_source.as_deref(), Some(fs.dev()));
    assert_eq!(m.fs_type, fs.fstype());
}

fn errno_of(r: std::io::Result<()>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

#[test]
fn loopfs_xfs_lifecycle() {
    if !require_root("loopfs_xfs_lifecycle") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("xfs", 320);
    let traces = Traces::of(&fs);
    assert!(fs.dev().starts_with("/dev/loop"));
    assert!(fs.maj_min().contains(':'));
    assert!(fs.path().starts_with(fs.root()));
    assert_mounted_ours(&fs);

    write_file(&fs.path().join("a"), b"hello").unwrap();
    assert_eq!(std::fs::read(fs.path().join("a")).unwrap(), b"hello");

    // Freeze: a create+write in another thread blocks until the thaw.
    fs.freeze();
    assert!(fs.is_frozen());
    let (tx, rx) = mpsc::channel();
    let target = fs.path().join("during-freeze");
    let writer = thread::spawn(move || {
        let r = std::fs::write(&target, b"x");
        let _ = tx.send(r.is_ok());
    });
    assert_eq!(
        rx.recv_timeout(Duration::from_millis(800)),
        Err(mpsc::RecvTimeoutError::Timeout),
        "write completed on a frozen filesystem"
    );
    fs.thaw();
    assert_eq!(rx.recv_timeout(Duration::from_secs(20)), Ok(true));
    writer.join().unwrap();
    assert!(fs.path().join("during-freeze").exists());

    // Throttle: the rule appears, and a 2 MiB synced write at 1 MiB/s takes > 1 s.
    fs.throttle_write_bps(1 << 20);
    let rules =
        std::fs::read_to_string("/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device").unwrap();
    assert!(
        rules.contains(&format!("{} {}", fs.maj_min(), 1 << 20)),
        "{rules}"
    );
    let t = Instant::now();
    write_file(&fs.path().join("slow"), &vec![7u8; 2 << 20]).unwrap();
    let e = t.elapsed();
    assert!(
        e >= Duration::from_millis(900),
        "throttled write took {e:?}"
    );
    fs.unthrottle();
    let rules =
        std::fs::read_to_string("/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device").unwrap();
    assert!(!rules.contains(&format!("{} ", fs.maj_min())), "{rules}");

    // Read-only and back.
    fs.remount_ro();
    assert_eq!(
        errno_of(std::fs::write(fs.path().join("ro"), b"x")),
        Some(30)
    ); // EROFS
    assert!(mounted_at(fs.path())
        .unwrap()
        .mount_options
        .contains_key("ro"));
    fs.remount_rw();
    std::fs::write(fs.path().join("rw"), b"x").unwrap();

    // Unmount: the mount point is a plain empty directory; dangerous ops refuse.
    fs.umount();
    assert!(!fs.is_mounted());
    assert!(mounted_at(fs.path()).is_none());
    assert!(!fs.path().join("a").exists());
    for (what, r) in [
        ("freeze", catch_unwind(AssertUnwindSafe(|| fs.freeze()))),
        ("fill", catch_unwind(AssertUnwindSafe(|| fs.fill()))),
        ("shutdown", catch_unwind(AssertUnwindSafe(|| fs.shutdown()))),
    ] {
        assert!(r.is_err(), "{what} on an unmounted LoopFs must refuse");
    }
    assert!(!fs.is_frozen());

    fs.mount_again();
    assert_mounted_ours(&fs);
    assert_eq!(std::fs::read(fs.path().join("a")).unwrap(), b"hello");

    // Shutdown: EIO from now on.
    fs.shutdown();
    assert_eq!(
        errno_of(std::fs::write(fs.path().join("after-shutdown"), b"x")),
        Some(5)
    ); // EIO

    drop(fs);
    traces.assert_gone();
}

#[test]
fn loopfs_fill_and_free() {
    if !require_root("loopfs_fill_and_free") {
        return;
    }
    let _machine = machine::shared();
    let mut fs = LoopFs::new("ext4", 16);
    let traces = Traces::of(&fs);
    fs.fill();
    assert!(fs.fill_path().metadata().unwrap().len() > 8 << 20);
    let r = write_file(&fs.path().join("more"), &vec![1u8; 1 << 20]);
    assert_eq!(errno_of(r), Some(28), "expected ENOSPC");
    fs.free_fill();
    assert!(!fs.fill_path().exists());
    write_file(&fs.path().join("more"), &vec![1u8; 1 << 20]).unwrap();
    drop(fs);
    traces.assert_gone();
}

#[test]
fn loopfs_ext4_create_drop() {
    if !require_root("loopfs_ext4_create_drop") {
        return;
    }
    let _machine = machine::shared();
    let fs = LoopFs::new("ext4", 64);
    let traces = Traces::of(&fs);
    assert_mounted_ours(&fs);
    write_file(&fs.path().join("f"), b"ext4").unwrap();
    drop(fs);
    traces.assert_gone();
}

#[test]
fn loopfs_btrfs_create_drop() {
    if !require_root("loopfs_btrfs_create_drop") {
        return;
    }
    let _machine = machine::shared();
    let fs = LoopFs::new("btrfs", 256);
    let traces = Traces::of(&fs);
    assert_mounted_ours(&fs);
    write_file(&fs.path().join("f"), b"btrfs").unwrap();
    drop(fs);
    traces.assert_gone();
}

#[test]
fn loopfs_cleans_up_after_a_panic_while_frozen_and_throttled() {
    if !require_root("loopfs_cleans_up_after_a_panic_while_frozen_and_throttled") {
        return;
    }
    let _machine = machine::shared();
    let mut traces = None;
    let r = catch_unwind(AssertUnwindSafe(|| {
        let mut fs = LoopFs::new("ext4", 64);
        traces = Some(Traces::of(&fs));
        // An open descriptor (EBUSY on the first umount) and a writer blocked in the freeze.
        let _open = std::fs::File::create(fs.path().join("held")).unwrap();
        fs.throttle_write_bps(1 << 20);
        fs.freeze();
        let target = fs.path().join("blocked");
        thread::spawn(move || {
            let _ = std::fs::write(target, b"x");
        });
        thread::sleep(Duration::from_millis(200));
        panic!("test failure while frozen");
    }));
    assert!(r.is_err());
    traces.expect("guard was created").assert_gone();
}

#[test]
fn loopfs_on_tmpfs_backing_gives_eio_on_writeback() {
    if !require_root("loopfs_on_tmpfs_backing_gives_eio_on_writeback") {
        return;
    }
    let _machine = machine::shared();
    let fs = LoopFs::on_tmpfs_backing("ext4", 40, 24);
    let traces = Traces::of(&fs);
    let backing = fs.image().parent().unwrap().to_path_buf();
    let m = mounted_at(&backing).expect("backing tmpfs mounted");
    assert_eq!(m.fs_type, "tmpfs");
    assert_mounted_ours(&fs);
    // More than the tmpfs can hold, less than the filesystem: the page cache takes it,
    // writeback to the loop device fails.
    let r = write_file(&fs.path().join("big"), &vec![3u8; 30 << 20]);
    let errno = errno_of(r);
    assert!(
        matches!(errno, Some(5) | Some(28) | Some(30)),
        "expected EIO/ENOSPC/EROFS, got {errno:?}"
    );
    drop(fs);
    traces.assert_gone();
    assert!(mounted_at(&backing).is_none());
}

#[test]
fn loopfs_drop_with_a_busy_mount_falls_back_to_lazy_umount() {
    if !require_root("loopfs_drop_with_a_busy_mount_falls_back_to_lazy_umount") {
        return;
    }
    let _machine = machine::shared();
    // Declared before the guard, so it is still open when the guard drops: EBUSY.
    let held;
    let fs = LoopFs::new("ext4", 64);
    let traces = Traces::of(&fs);
    held = std::fs::File::create(fs.path().join("held")).unwrap();
    drop(fs);
    assert!(!any_mount_under(&traces.root), "lazy umount expected");
    assert!(!traces.root.exists());
    // The loop device auto-clears once the last reference is gone.
    drop(held);
    let image = traces.image.to_str().unwrap().to_string();
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(50), || {
            !losetup_list().contains(&image)
        }),
        "loop device not auto-cleared:\n{}",
        losetup_list()
    );
    traces.assert_gone();
}
