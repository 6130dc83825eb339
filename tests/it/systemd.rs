//! The Debian package under a real systemd: Debian 12 booted with systemd as PID 1 in new
//! PID, mount, UTS, IPC and network namespaces (a root built with debootstrap from
//! Debian's packages, cached between runs; an overlay on it per run, so the cache stays
//! as built), `/` made shared as a real boot does. Then, inside: the `.deb` installed,
//! the service active and answering; docs/install.md's "Add your mount points" steps on a loop
//! filesystem; that filesystem unmounted on the host side (systemd's namespace) and the
//! target seen going down — in the agent's metrics and, independently, in the service's
//! own mount table — and back up after the remount; `systemctl reload`; the memory lock
//! as the unit allows it; `systemctl stop` timed; socket activation through the shipped
//! `stallwatch.socket` example; a stall recorded under `/var/lib/stallwatch` (the unit's
//! StateDirectory=) kept across an upgrade to a rebuilt package of a higher version;
//! `apt purge` leaving no `/etc/stallwatch` and no `/var/lib/stallwatch`.
//!
//! The network namespace has only a loopback: the service's 0.0.0.0:19858 never meets
//! the host's ports. systemd is powered off (SIGRTMIN+4) at the end, killed if it does
//! not go; the namespaces' mounts go with their last process.
//!
//! Needs root, debootstrap (first run: ~2 min to build the root, ~250 MB in
//! /var/cache/stallwatch-tests/, or STALLWATCH_SYSTEMD_ROOT_CACHE), cargo-deb, util-linux
//! (unshare, nsenter), iproute2.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::cmd::{repo, tool};
use crate::support::loopfs::LoopFs;
use crate::support::machine;
use crate::support::metrics::Metrics;
use crate::support::root::require_root;
use crate::support::wait::wait_until;

const CACHE_DEFAULT: &str = "/var/cache/stallwatch-tests/bookworm-systemd";
const CACHE_ENV: &str = "STALLWATCH_SYSTEMD_ROOT_CACHE";
const SUITE: &str = "bookworm";
const INCLUDE: &str = "systemd,systemd-sysv,dbus,curl,adduser";

/// `cmd` under `timeout`; (success, stdout, stderr).
fn exec(secs: u64, cmd: &mut Command) -> (bool, String, String) {
    let what = format!("{cmd:?}");
    let mut t = Command::new("timeout");
    t.arg("-k").arg("5").arg(secs.to_string());
    t.arg(cmd.get_program()).args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => t.env(k, v),
            None => t.env_remove(k),
        };
    }
    if let Some(d) = cmd.get_current_dir() {
        t.current_dir(d);
    }
    let out = t
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn exec_ok(secs: u64, cmd: &mut Command) -> String {
    let what = format!("{cmd:?}");
    let (ok, out, err) = exec(secs, cmd);
    assert!(ok, "{what} failed\n--- stdout\n{out}\n--- stderr\n{err}");
    out
}

// ---------------------------------------------------------------------------------------
// The root filesystem, built once

/// The Debian mirror apt uses here (deb822 `.sources` or the one-line format), else
/// Debian's own.
fn mirror() -> String {
    let mut texts = Vec::new();
    if let Ok(s) = std::fs::read_to_string("/etc/apt/sources.list") {
        texts.push(s);
    }
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        for e in dir.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "sources" || x == "list") {
                texts.push(std::fs::read_to_string(p).unwrap_or_default());
            }
        }
    }
    for text in &texts {
        // deb822: a stanza with `Suites: bookworm ...` and `URIs: ...`.
        for stanza in text.split("\n\n") {
            let field = |name: &str| {
                stanza
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.trim().to_string())
            };
            if let (Some(uris), Some(suites)) = (field("URIs:"), field("Suites:")) {
                if suites.split_whitespace().any(|s| s == SUITE) {
                    if let Some(u) = uris.split_whitespace().next() {
                        return u.to_string();
                    }
                }
            }
        }
        // deb URL SUITE COMPONENTS
        for l in text.lines() {
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.len() >= 3 && w[0] == "deb" && w[2] == SUITE && w[1].starts_with("http") {
                return w[1].to_string();
            }
        }
    }
    "http://deb.debian.org/debian".to_string()
}

/// The cached root; built with debootstrap into a temporary directory beside it and
/// renamed when complete, so a half-built root is never used.
fn cached_root() -> PathBuf {
    let cache = PathBuf::from(std::env::var(CACHE_ENV).unwrap_or_else(|_| CACHE_DEFAULT.into()));
    if cache.join("lib/systemd/systemd").is_file() {
        eprintln!("root: cached {}", cache.display());
        return cache;
    }
    tool("debootstrap", "apt-get install debootstrap");
    let parent = cache.parent().expect("cache path has a parent");
    std::fs::create_dir_all(parent).unwrap();
    let building = parent.join(format!(
        "{}.tmp-{}",
        cache.file_name().unwrap().to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&building);
    let url = mirror();
    eprintln!(
        "root: building {} with debootstrap from {url}",
        cache.display()
    );
    let t0 = Instant::now();
    let (ok, out, err) = exec(
        1200,
        Command::new("debootstrap")
            .arg("--variant=minbase")
            .arg(format!("--include={INCLUDE}"))
            .arg(SUITE)
            .arg(&building)
            .arg(&url),
    );
    if !ok {
        let _ = std::fs::remove_dir_all(&building);
        panic!("debootstrap failed\n--- stdout\n{out}\n--- stderr\n{err}");
    }
    match std::fs::rename(&building, &cache) {
        Ok(()) => {}
        // Another run finished first: use its root.
        Err(_) if cache.join("lib/systemd/systemd").is_file() => {
            let _ = std::fs::remove_dir_all(&building);
        }
        Err(e) => panic!("rename {} -> {}: {e}", building.display(), cache.display()),
    }
    eprintln!("root: built in {:.1} s", t0.elapsed().as_secs_f64());
    cache
}

// ---------------------------------------------------------------------------------------
// The package

/// Builds the `.deb` with cargo-deb in the target directory scripts/check-package.sh
/// uses (so a package check in the same run shares the release build; cargo's lock on
/// that directory serialises the two), into `out`.
fn build_deb(out: &Path) -> PathBuf {
    build_deb_with(out, &[])
}

/// [`build_deb`] with more `cargo deb` arguments (`--no-build --deb-version V`: the same
/// binary packaged again under another version, for an upgrade).
fn build_deb_with(out: &Path, extra: &[&str]) -> PathBuf {
    tool("cargo-deb", "cargo install cargo-deb --locked");
    let t0 = Instant::now();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    exec_ok(
        3000,
        Command::new(cargo)
            .args(["deb", "--locked"])
            .args(extra)
            .arg("--output")
            .arg(out)
            .current_dir(repo())
            .env("CARGO_TARGET_DIR", repo().join("target/deb-check")),
    );
    let deb = std::fs::read_dir(out)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .expect("cargo deb wrote no .deb");
    eprintln!(
        "package: {} built in {:.1} s",
        deb.display(),
        t0.elapsed().as_secs_f64()
    );
    deb
}

// ---------------------------------------------------------------------------------------
// systemd as PID 1

/// Debian booted with systemd as PID 1 in its own namespaces. Dropped: powered off
/// (SIGRTMIN+4), killed (the whole PID namespace with its init) if that does not end
/// it, reaped.
struct Booted {
    unshare: Child,
    /// systemd's pid as the host sees it.
    pid: u32,
    dir: tempfile::TempDir,
}

const BOOT_SCRIPT: &str = r#"set -e
R=$1
mount -t overlay overlay -o "lowerdir=$2,upperdir=$3,workdir=$4" "$R"
mount -t proc proc "$R/proc"
mount --rbind /sys "$R/sys"
mount --rbind /dev "$R/dev"
mount -t tmpfs -o mode=0755 tmpfs "$R/run"
mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
exec chroot "$R" /usr/bin/env container=other /lib/systemd/systemd --system
"#;

impl Booted {
    fn boot(lower: &Path) -> Booted {
        let dir = tempfile::Builder::new()
            .prefix("stallwatch-systemd-")
            .tempdir()
            .unwrap();
        let (root, upper, work) = (
            dir.path().join("root"),
            dir.path().join("upper"),
            dir.path().join("work"),
        );
        for d in [&root, &upper, &work] {
            std::fs::create_dir(d).unwrap();
        }
        let log = std::fs::File::create(dir.path().join("systemd.log")).unwrap();
        let mut cmd = Command::new("unshare");
        // If this test process dies without its guards (SIGKILL, a timeout), unshare gets
        // SIGKILL, and unshare's --kill-child takes systemd, the PID namespace's init,
        // and with it everything inside: no systemd is left running.
        // SAFETY: prctl only, async-signal-safe, between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt as _;
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let unshare = cmd
            .args([
                "--kill-child",
                "--pid",
                "--fork",
                "--mount",
                "--uts",
                "--ipc",
                "--net",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                BOOT_SCRIPT,
                "boot",
            ])
            .args([&root, &lower.to_path_buf(), &upper, &work])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start unshare");
        let mut booted = Booted {
            pid: 0,
            unshare,
            dir,
        };
        // The forked child of unshare becomes sh, then systemd (same pid, exec).
        let unshare_pid = booted.unshare.id();
        let found = wait_until(Duration::from_secs(20), Duration::from_millis(50), || {
            let children =
                std::fs::read_to_string(format!("/proc/{unshare_pid}/task/{unshare_pid}/children"))
                    .unwrap_or_default();
            let Some(pid) = children
                .split_whitespace()
                .next()
                .and_then(|p| p.parse().ok())
            else {
                return false;
            };
            booted.pid = pid;
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "systemd")
        });
        assert!(found, "systemd did not start; its log:\n{}", booted.log());
        booted
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("systemd.log")).unwrap_or_default()
    }

    /// `CMD` in all of systemd's namespaces, its root and working directory.
    fn cmd(&self, prog: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg("-t")
            .arg(self.pid.to_string())
            .args(["-m", "-p", "-u", "-i", "-n", "-r", "-w", "--", prog])
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("SYSTEMD_PAGER", "")
            .env("DEBIAN_FRONTEND", "noninteractive");
        c
    }

    /// `sh -c script` inside; (success, stdout, stderr).
    fn sh(&self, secs: u64, script: &str) -> (bool, String, String) {
        exec(secs, self.cmd("/bin/sh").arg("-c").arg(script))
    }

    /// `sh -c script` inside; stdout, or a panic with the output and the journal tail.
    fn sh_ok(&self, secs: u64, script: &str) -> String {
        let (ok, out, err) = self.sh(secs, script);
        if !ok {
            let (_, journal, _) = self.sh(30, "journalctl --no-pager -n 60");
            panic!("inside: `{script}` failed\n--- stdout\n{out}\n--- stderr\n{err}\n--- journal\n{journal}");
        }
        out
    }

    /// A path inside the booted system, as the host reaches it.
    fn path(&self, inside: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root{inside}", self.pid))
    }

    /// GET http://127.0.0.1:19858{path} inside, with curl.
    fn scrape(&self, path: &str) -> Result<String, String> {
        let (ok, out, err) = self.sh(
            15,
            &format!("curl -sS --fail --max-time 5 http://127.0.0.1:19858{path}"),
        );
        if ok {
            Ok(out)
        } else {
            Err(err)
        }
    }

    fn metrics(&self) -> Option<Metrics> {
        Metrics::parse(&self.scrape("/metrics").ok()?).ok()
    }

    fn journal(&self, unit: &str) -> String {
        self.sh(30, &format!("journalctl --no-pager -o cat -u {unit}"))
            .1
    }
}

impl Drop for Booted {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.unshare.try_wait() {
            return;
        }
        // SIGRTMIN+4: systemd's "poweroff"; in a container it exits when done.
        let t0 = Instant::now();
        // SAFETY: a signal to the systemd we started (its pid is our unreaped child's child).
        unsafe {
            libc::kill(self.pid as libc::pid_t, libc::SIGRTMIN() + 4);
        }
        let done = wait_until(Duration::from_secs(45), Duration::from_millis(100), || {
            matches!(self.unshare.try_wait(), Ok(Some(_)))
        });
        if done {
            eprintln!(
                "systemd: powered off in {:.1} s",
                t0.elapsed().as_secs_f64()
            );
            return;
        }
        eprintln!("systemd: still running after 45 s of poweroff; killing its PID namespace");
        // SAFETY: as above. SIGKILL to a PID namespace's init kills every process in it.
        unsafe {
            libc::kill(self.pid as libc::pid_t, libc::SIGKILL);
        }
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
    }
}

// ---------------------------------------------------------------------------------------

fn target_up(m: &Metrics, target: &str) -> Option<f64> {
    m.get("stallwatch_target_up", &[("target", target)])
}

#[test]
fn debian_package_under_real_systemd() {
    if !require_root("debian_package_under_real_systemd") {
        return;
    }
    // A release build and a booted systemd take both cores for minutes.
    let _machine = machine::exclusive();
    for (t, install) in [
        ("unshare", "apt-get install util-linux"),
        ("nsenter", "apt-get install util-linux"),
        ("ip", "apt-get install iproute2"),
    ] {
        tool(t, install);
    }
    let t_all = Instant::now();
    let lower = cached_root();
    let out = tempfile::tempdir().unwrap();
    let deb = build_deb(out.path());

    // The array: a loop filesystem, declared before the system that mounts it, so the
    // system is powered off (and its mounts of it gone) before the filesystem is torn down.
    let mut raid = LoopFs::new("ext4", 64);

    let t_boot = Instant::now();
    let sys = Booted::boot(&lower);
    // A real boot makes / shared; without it no unmount reaches a service's namespace.
    sys.sh_ok(10, "mount --make-rshared /");
    exec_ok(
        10,
        Command::new("nsenter").args([
            "-t",
            &sys.pid.to_string(),
            "-n",
            "ip",
            "link",
            "set",
            "lo",
            "up",
        ]),
    );
    // systemctl needs the manager's socket, which appears a moment after exec.
    let socket = sys.path("/run/systemd/private");
    assert!(
        wait_until(Duration::from_secs(30), Duration::from_millis(50), || {
            socket.exists()
        }),
        "systemd's socket did not appear; its log:\n{}",
        sys.log()
    );
    let (_, state, err) = sys.sh(120, "systemctl is-system-running --wait");
    eprintln!(
        "systemd: {} in {:.1} s",
        state.trim(),
        t_boot.elapsed().as_secs_f64()
    );
    assert!(
        matches!(state.trim(), "running" | "degraded"),
        "systemd did not finish booting: {state:?} {err}\n{}",
        sys.sh(
            30,
            "systemctl --failed --no-pager; journalctl --no-pager -n 40"
        )
        .1
    );

    // Install: the postinst creates the user, enables and starts the service.
    std::fs::copy(&deb, sys.path("/tmp/stallwatch.deb")).unwrap();
    let t0 = Instant::now();
    sys.sh_ok(300, "dpkg -i /tmp/stallwatch.deb");
    eprintln!("dpkg -i: {:.1} s", t0.elapsed().as_secs_f64());
    let active = wait_until(Duration::from_secs(30), Duration::from_millis(200), || {
        sys.sh(10, "systemctl is-active stallwatch.service")
            .1
            .trim()
            == "active"
    });
    assert!(
        active,
        "stallwatch.service is not active:\n{}",
        sys.sh(30, "systemctl status --no-pager stallwatch.service")
            .1
    );
    let answered = wait_until(Duration::from_secs(30), Duration::from_millis(200), || {
        sys.metrics()
            .is_some_and(|m| target_up(&m, "var_tmp").is_some())
    });
    assert!(
        answered,
        "no /metrics on 127.0.0.1:19858:\n{}",
        sys.journal("stallwatch")
    );

    // The memory lock as the unit allows it: LimitMEMLOCK= raises the soft and hard
    // limit, unless the host's hard limit is lower and systemd may not raise it (no
    // CAP_SYS_RESOURCE): systemd then sets the closest it can. Either way the agent
    // must say what it got.
    let main_pid = sys
        .sh_ok(10, "systemctl show -p MainPID --value stallwatch.service")
        .trim()
        .to_string();
    let limits = sys.sh_ok(
        10,
        &format!("grep 'Max locked memory' /proc/{main_pid}/limits"),
    );
    let vm_lck = sys.sh_ok(10, &format!("grep VmLck /proc/{main_pid}/status"));
    let locked = sys
        .metrics()
        .and_then(|m| m.get("stallwatch_memory_locked", &[]))
        .expect("stallwatch_memory_locked");
    let journal = sys.journal("stallwatch");
    eprintln!(
        "memory lock under systemd: stallwatch_memory_locked {locked}; {}; {}",
        limits.trim(),
        vm_lck.trim()
    );
    let vm_lck_kib: u64 = vm_lck
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap();
    if locked == 1.0 {
        assert!(vm_lck_kib > 0, "reports locked, but {vm_lck}");
        assert!(journal.contains("memory locked"), "{journal}");
    } else {
        assert_eq!(vm_lck_kib, 0, "reports not locked, but {vm_lck}");
        let line = journal
            .lines()
            .find(|l| l.contains("memory not locked"))
            .unwrap_or_else(|| panic!("not locked and no `memory not locked` line:\n{journal}"));
        assert!(
            line.contains("LimitMEMLOCK="),
            "the line does not say how to allow it: {line}"
        );
        eprintln!("(the host's hard RLIMIT_MEMLOCK is below the unit's LimitMEMLOCK=512M and systemd may not raise it here)");
    }

    // docs/install.md, "Add your mount points", on a loop filesystem mounted in systemd's
    // namespace (the host side for the service).
    sys.sh_ok(
        20,
        &format!("mkdir -p /srv/raid0 && mount {} /srv/raid0", raid.dev()),
    );
    let cfg = sys.path("/etc/stallwatch/config.yaml");
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    assert!(
        text.trim_end().ends_with("stall_threshold: 500ms"),
        "config.example.yaml no longer ends with the targets list"
    );
    text.push_str("  - path: /srv/raid0\n    name: raid0\n    interval: 1s\n");
    std::fs::write(&cfg, text).unwrap();
    sys.sh_ok(10, "stallwatch check-config /etc/stallwatch/config.yaml");
    sys.sh_ok(
        10,
        "install -d -o stallwatch -g stallwatch -m 0700 /srv/raid0/.stallwatch",
    );
    sys.sh_ok(
        10,
        "install -D -m 0644 /usr/share/doc/stallwatch/examples/mounts.conf.example \
         /etc/systemd/system/stallwatch.service.d/mounts.conf",
    );
    // The `sudoedit` step: this system has no /var/lib/postgresql.
    sys.sh_ok(
        10,
        "sed -i -e 's# /var/lib/postgresql##' -e '/^ReadWritePaths=\\/var\\/lib\\/postgresql/d' \
         /etc/systemd/system/stallwatch.service.d/mounts.conf",
    );
    sys.sh_ok(
        60,
        "systemctl daemon-reload && systemctl restart stallwatch.service",
    );
    let up = |want: f64| {
        wait_until(Duration::from_secs(20), Duration::from_millis(250), || {
            sys.metrics().and_then(|m| target_up(&m, "raid0")) == Some(want)
        })
    };
    assert!(up(1.0), "raid0 not up:\n{}", sys.journal("stallwatch"));
    let probe_files = sys.sh_ok(10, "ls -A /srv/raid0/.stallwatch");
    eprintln!(
        "raid0 up; probe files: {}",
        probe_files.split_whitespace().collect::<Vec<_>>().join(" ")
    );

    // In the service's own namespace (independent of the agent's report): its mount of
    // /srv/raid0, as the kernel lists it.
    let service_mounts = || {
        let pid = sys
            .sh_ok(10, "systemctl show -p MainPID --value stallwatch.service")
            .trim()
            .to_string();
        // The kernel's mount table of the service's namespace: "ID PARENT MAJ:MIN ROOT
        // MOUNTPOINT ... - FSTYPE SOURCE ...", the sources mounted at /srv/raid0.
        let table = sys.sh_ok(10, &format!("cat /proc/{pid}/mountinfo"));
        table
            .lines()
            .filter(|l| l.split_whitespace().nth(4) == Some("/srv/raid0"))
            .filter_map(|l| {
                l.split_once(" - ")?
                    .1
                    .split_whitespace()
                    .nth(1)
                    .map(String::from)
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert!(
        service_mounts().contains(raid.dev()),
        "the service does not see {} at /srv/raid0",
        raid.dev()
    );

    // Unmounted on the host side: the unmount reaches the service (ReadWritePaths= names
    // the mount point), the target goes down.
    let t0 = Instant::now();
    sys.sh_ok(30, "umount /srv/raid0");
    assert!(
        up(0.0),
        "raid0 still up after the host unmounted it:\n{}",
        sys.journal("stallwatch")
    );
    eprintln!(
        "raid0 down {:.1} s after the host's umount",
        t0.elapsed().as_secs_f64()
    );
    assert!(
        !service_mounts().contains(raid.dev()),
        "the host's unmount did not reach the service's namespace"
    );
    let skipped = sys
        .metrics()
        .unwrap()
        .get(
            "stallwatch_probes_skipped_total",
            &[("target", "raid0"), ("reason", "not_mounted")],
        )
        .unwrap_or(0.0);
    assert!(skipped > 0.0, "no not_mounted skips counted");
    // Remounted: the mount propagates into the service, the target recovers.
    let t0 = Instant::now();
    sys.sh_ok(20, &format!("mount {} /srv/raid0", raid.dev()));
    assert!(
        up(1.0),
        "raid0 did not recover after the remount:\n{}",
        sys.journal("stallwatch")
    );
    eprintln!(
        "raid0 up again {:.1} s after the remount",
        t0.elapsed().as_secs_f64()
    );
    assert!(service_mounts().contains(raid.dev()));

    // docs/install.md's warning, shown: a drop-in naming the probe directory instead of the
    // mount point makes systemd bind-mount it inside the service, and that bind mount
    // keeps the filesystem there after the host lets go of it.
    let dropin = "/etc/systemd/system/stallwatch.service.d/mounts.conf";
    sys.sh_ok(
        60,
        &format!(
            "sed -i 's#^ReadWritePaths=/srv/raid0$#ReadWritePaths=/srv/raid0/.stallwatch#' {dropin} && \
             grep -qx 'ReadWritePaths=/srv/raid0/.stallwatch' {dropin} && \
             systemctl daemon-reload && systemctl restart stallwatch.service"
        ),
    );
    assert!(up(1.0), "raid0 not up with the wrong drop-in");
    let (plain, _, why) = sys.sh(30, "umount /srv/raid0");
    if !plain {
        // The kernel refuses while a propagated copy has a mount on it: the host can only
        // detach it (umount -l), which leaves the service's copy in place.
        eprintln!(
            "wrong drop-in: host's `umount /srv/raid0` refused ({}); detaching it with umount -l",
            why.trim()
        );
        sys.sh_ok(30, "umount -l /srv/raid0");
    }
    let host_has = sys.sh_ok(10, "grep -c ' /srv/raid0 ' /proc/self/mountinfo || true");
    assert_eq!(
        host_has.trim(),
        "0",
        "the host still has /srv/raid0 mounted"
    );
    std::thread::sleep(Duration::from_secs(3));
    let pinned = service_mounts();
    let still_up = sys.metrics().and_then(|m| target_up(&m, "raid0"));
    eprintln!(
        "wrong drop-in (ReadWritePaths=/srv/raid0/.stallwatch): after the host's unmount the service still has [{pinned}] at /srv/raid0, target_up {still_up:?}"
    );
    assert!(
        pinned.contains(raid.dev()),
        "expected docs/install.md's pinned filesystem with the wrong drop-in; the service's /srv/raid0: [{pinned}]"
    );
    assert_eq!(
        still_up,
        Some(1.0),
        "the agent probes the pinned filesystem and reports it up"
    );
    // Back to the documented drop-in: the restart drops the service's namespace (and the
    // pinned mount with it); the filesystem is mounted again first (RequiresMountsFor=).
    sys.sh_ok(
        60,
        &format!(
            "sed -i 's#^ReadWritePaths=/srv/raid0/.stallwatch$#ReadWritePaths=/srv/raid0#' {dropin} && \
             mount {} /srv/raid0 && systemctl daemon-reload && systemctl restart stallwatch.service",
            raid.dev()
        ),
    );
    assert!(
        up(1.0),
        "raid0 not up after restoring the drop-in:\n{}",
        sys.journal("stallwatch")
    );
    assert_eq!(
        service_mounts(),
        raid.dev(),
        "one mount of the array in the service again"
    );

    // systemctl reload: ExecReload= sends SIGHUP, the configuration is re-read, the
    // process stays.
    let main_pid = || {
        sys.sh_ok(10, "systemctl show -p MainPID --value stallwatch.service")
            .trim()
            .to_string()
    };
    let pid_before = main_pid();
    // One reload, checked by the agent's own report of it: the success timestamp (whole
    // seconds, hence the pause) moves on, and the reload succeeded.
    let reload = |what: &str| {
        let at = |m: &Metrics| {
            m.get(
                "stallwatch_config_last_reload_success_timestamp_seconds",
                &[],
            )
        };
        let before = sys.metrics().as_ref().and_then(at).unwrap();
        std::thread::sleep(Duration::from_millis(1100));
        sys.sh_ok(30, "systemctl reload stallwatch.service");
        let reloaded = wait_until(Duration::from_secs(15), Duration::from_millis(200), || {
            sys.metrics().is_some_and(|m| {
                at(&m).is_some_and(|t| t > before)
                    && m.get("stallwatch_config_last_reload_successful", &[]) == Some(1.0)
            })
        });
        assert!(
            reloaded,
            "systemctl reload did not reload ({what}):\n{}",
            sys.journal("stallwatch")
        );
    };
    reload("the packaged configuration");
    assert_eq!(main_pid(), pid_before, "reload restarted the agent");

    // At scale under the unit's own limits (TasksMax=, LimitMEMLOCK=, MemoryMax=): 64 more
    // targets with the default modes, directories on the array, added by a reload. Every
    // lane is a thread of its own; all of them must start, and the lock must hold.
    let one_target = std::fs::read_to_string(&cfg).unwrap();
    let mut scaled = one_target.clone();
    for i in 0..64 {
        scaled.push_str(&format!(
            "  - path: /srv/raid0/w{i}\n    name: w{i}\n    interval: 1s\n    require_mountpoint: false\n"
        ));
    }
    std::fs::write(&cfg, scaled).unwrap();
    sys.sh_ok(
        20,
        "for i in $(seq 0 63); do \
           install -d -o stallwatch -g stallwatch -m 0700 /srv/raid0/w$i/.stallwatch; done",
    );
    reload("to 65 targets");
    let all_up = wait_until(Duration::from_secs(30), Duration::from_millis(500), || {
        sys.metrics()
            .is_some_and(|m| (0..64).all(|i| target_up(&m, &format!("w{i}")) == Some(1.0)))
    });
    let status = sys.sh_ok(10, &format!("cat /proc/{}/status", main_pid()));
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{status}"))
    };
    let (threads, lck, rss) = (field("Threads:"), field("VmLck:"), field("VmRSS:"));
    let tasks = sys.sh_ok(
        10,
        "systemctl show -p TasksCurrent -p TasksMax --value stallwatch.service",
    );
    eprintln!(
        "65 targets under the unit: {threads} threads, VmLck {lck} KiB, VmRSS {rss} KiB; \
         TasksCurrent/TasksMax {}",
        tasks.split_whitespace().collect::<Vec<_>>().join("/")
    );
    assert!(
        all_up,
        "not all 64 added targets are up under TasksMax=/LimitMEMLOCK=:\n{}",
        sys.journal("stallwatch")
    );
    // Two lanes per target, each a thread, beside the fixed few.
    assert!(threads >= 65 * 2, "{threads} threads for 130 lanes");
    let still_locked = sys
        .metrics()
        .and_then(|m| m.get("stallwatch_memory_locked", &[]))
        .unwrap();
    assert_eq!(
        still_locked, locked,
        "the memory lock changed with 65 targets"
    );
    if locked == 1.0 {
        assert!(lck > 0, "reports locked, but VmLck {lck} kB");
    }
    assert_eq!(
        main_pid(),
        pid_before,
        "the reload to 65 targets restarted the agent"
    );
    // Back to the one array target for what follows.
    std::fs::write(&cfg, &one_target).unwrap();
    reload("back to one target");
    assert!(
        wait_until(Duration::from_secs(15), Duration::from_millis(250), || {
            sys.metrics().is_some_and(|m| target_up(&m, "w0").is_none())
        }),
        "the 64 added targets were not retired"
    );

    // The stall record across an upgrade: a freeze of the array makes a stall, which
    // the agent writes under /var/lib/stallwatch (StateDirectory=); the same binary
    // packaged again with a higher version is installed over it (dpkg restarts the
    // service) and the event is still served, marked restored.
    assert!(
        sys.path("/var/lib/stallwatch").is_dir(),
        "StateDirectory= did not create /var/lib/stallwatch"
    );
    let raid0_event = |done_only: bool| -> Option<serde_json::Value> {
        let body = sys.scrape("/api/stalls").ok()?;
        let events: Vec<serde_json::Value> = serde_json::from_str(&body).ok()?;
        events.into_iter().find(|e| {
            e["target"] == "raid0"
                && (!done_only || (e["ongoing"] == false && e["evidence"]["complete"] == true))
        })
    };
    raid.freeze();
    let frozen = Instant::now();
    let seen = wait_until(Duration::from_secs(8), Duration::from_millis(200), || {
        raid0_event(false).is_some()
    });
    std::thread::sleep(Duration::from_secs(3).saturating_sub(frozen.elapsed()));
    raid.thaw();
    assert!(
        seen,
        "no stall of raid0 during a 3 s freeze:\n{}",
        sys.journal("stallwatch")
    );
    let mut stall = None;
    assert!(
        wait_until(Duration::from_secs(10), Duration::from_millis(200), || {
            stall = raid0_event(true);
            stall.is_some()
        }),
        "the raid0 stall did not complete with its final evidence"
    );
    let stall = stall.unwrap();
    let id = stall["id"].as_str().unwrap().to_owned();
    let record = sys.path("/var/lib/stallwatch/stalls.jsonl");
    assert!(
        wait_until(Duration::from_secs(5), Duration::from_millis(200), || {
            std::fs::read_to_string(&record).is_ok_and(|t| t.contains(&id))
        }),
        "{} does not hold the stall {id}",
        record.display()
    );
    let old_version = sys.sh_ok(10, "dpkg-query -W -f '${Version}' stallwatch");
    let new_version = format!("{}+upgrade1", old_version.trim());
    let out2 = tempfile::tempdir().unwrap();
    let deb2 = build_deb_with(out2.path(), &["--no-build", "--deb-version", &new_version]);
    std::fs::copy(&deb2, sys.path("/tmp/stallwatch-upgrade.deb")).unwrap();
    let pid_before_upgrade = sys
        .sh_ok(10, "systemctl show -p MainPID --value stallwatch.service")
        .trim()
        .to_string();
    let t0 = Instant::now();
    sys.sh_ok(300, "dpkg -i /tmp/stallwatch-upgrade.deb");
    eprintln!(
        "upgrade {} -> {new_version}: {:.1} s",
        old_version.trim(),
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(
        sys.sh_ok(10, "dpkg-query -W -f '${Version}' stallwatch")
            .trim(),
        new_version
    );
    let mut restored = None;
    let back = wait_until(Duration::from_secs(30), Duration::from_millis(250), || {
        let pid = sys
            .sh(10, "systemctl show -p MainPID --value stallwatch.service")
            .1;
        if pid.trim() == pid_before_upgrade || pid.trim() == "0" {
            return false;
        }
        restored = sys
            .scrape(&format!("/api/stalls/{id}"))
            .ok()
            .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok());
        restored.is_some()
    });
    assert!(
        back,
        "the stall {id} is not served after the upgrade:\n{}",
        sys.journal("stallwatch")
    );
    let restored = restored.unwrap();
    eprintln!("after the upgrade: {restored}");
    assert_eq!(restored["restored"], true, "{restored}");
    assert_eq!(restored["interrupted"], false, "{restored}");
    for k in ["target", "op", "started_at", "duration_seconds", "verdict"] {
        assert_eq!(restored[k], stall[k], "{k}");
    }
    assert!(up(1.0), "raid0 not up after the upgrade");

    // systemctl stop, timed: probe files removed, the process gone.
    let t0 = Instant::now();
    sys.sh_ok(60, "systemctl stop stallwatch.service");
    let stop = t0.elapsed();
    eprintln!("systemctl stop: {:.2} s", stop.as_secs_f64());
    assert!(
        stop < Duration::from_secs(10),
        "systemctl stop took {stop:?}"
    );
    assert_eq!(
        sys.sh(10, "systemctl is-active stallwatch.service")
            .1
            .trim(),
        "inactive"
    );
    let left = sys.sh_ok(10, "ls -A /srv/raid0/.stallwatch");
    assert!(
        left.trim().is_empty(),
        "probe files left after stop: {left}"
    );

    // Socket activation, the shipped example's steps.
    sys.sh_ok(
        30,
        "install -m 0644 /usr/share/doc/stallwatch/examples/stallwatch.socket /etc/systemd/system/ && \
         install -D -m 0644 /usr/share/doc/stallwatch/examples/socket-activation.conf.example \
             /etc/systemd/system/stallwatch.service.d/socket-activation.conf && \
         systemctl daemon-reload && \
         systemctl enable --now stallwatch.socket && systemctl restart stallwatch.service",
    );
    let via_socket = wait_until(Duration::from_secs(20), Duration::from_millis(200), || {
        sys.metrics().and_then(|m| target_up(&m, "raid0")) == Some(1.0)
    });
    let journal = sys.journal("stallwatch");
    assert!(
        via_socket,
        "no answer through stallwatch.socket:\n{journal}"
    );
    assert!(
        journal.contains("serving on the sockets systemd passed"),
        "the agent did not take systemd's socket:\n{journal}"
    );
    // The socket stays open across a restart of the service: a scrape during the
    // restart waits in the backlog instead of being refused.
    let (ok, _, err) = sys.sh(
        60,
        "systemctl restart --no-block stallwatch.service; curl -sS --fail --max-time 20 -o /dev/null http://127.0.0.1:19858/healthz",
    );
    assert!(
        ok,
        "a scrape during a restart failed with socket activation: {err}"
    );
    eprintln!("socket activation: served through stallwatch.socket, also during a restart");
    sys.sh_ok(
        60,
        "systemctl disable --now stallwatch.socket && systemctl stop stallwatch.service && \
         rm /etc/systemd/system/stallwatch.socket /etc/systemd/system/stallwatch.service.d/socket-activation.conf && \
         systemctl daemon-reload",
    );

    // apt purge: no /etc/stallwatch and no /var/lib/stallwatch left.
    let t0 = Instant::now();
    sys.sh_ok(120, "apt-get purge -y stallwatch");
    eprintln!("apt purge: {:.1} s", t0.elapsed().as_secs_f64());
    assert!(
        !sys.path("/etc/stallwatch").exists(),
        "/etc/stallwatch left after apt purge"
    );
    assert!(
        !sys.path("/var/lib/stallwatch").exists(),
        "/var/lib/stallwatch (the stall record) left after apt purge"
    );
    assert!(!sys.path("/usr/bin/stallwatch").exists());
    assert_eq!(
        sys.sh(10, "systemctl is-active stallwatch.service")
            .1
            .trim(),
        "inactive"
    );
    sys.sh_ok(20, "umount /srv/raid0");

    drop(sys);
    eprintln!("total: {:.1} s", t_all.elapsed().as_secs_f64());
}
