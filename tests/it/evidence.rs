//! A stall's evidence for real: a random buffered writer in its own cgroup fills a slow
//! device, and the stall event must name that cgroup first among the dirtiers (ahead
//! of an idle cgroup beside it), show the device's throughput held at the throttle with
//! the device busy all the time, and carry the ext4 journal's figures. The test reads
//! the cgroup's memory.stat, the device's stat and the journal's info itself, from
//! outside the agent, and compares.
//!
//! The slow device: a blkio throttle holds bios above the throttled device's queue, so a
//! throttled loop device is not busy by its own count (io_ticks), however slow it is. The
//! target therefore sits on an upper loop device with direct I/O whose image lives on a
//! throttled lower loop device: each upper request stays in flight while the throttle
//! holds its bio below, so the upper device is 100 % busy at the throttle's rate.
//!
//! The writer is in its own memory and blkio cgroups (the blkio one so that what it
//! writes is counted against it: dirty memory alone is counted over all devices, and the
//! other processes of a shared machine have hundreds of MB dirty elsewhere). Cgroup v1
//! throttles per cgroup, so the throttle is split between the root's cgroup and the
//! writer's. The loop driver serves each blkio cgroup with its own worker, so the probe's
//! own writes never queue behind the writer's: the stall comes from ext4's ordered mode
//! instead, mounted `nodelalloc,dioread_lock` as older ext4 ran: the journal commit that
//! the probe's fsync waits for must first write the writer's dirty data, in the root's
//! share of the throttle (the fsync-behind-a-writer case of the mailing lists).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::agent::Agent;
use crate::support::cmd::{run, run_cmd};
use crate::support::loopfs::LoopFs;
use crate::support::machine;
use crate::support::root::require_root;
use crate::support::wait::wait_until;

const THROTTLE_BPS: u64 = 2 << 20;
const MEMCG: &str = "/sys/fs/cgroup/memory";
const BLKIO: &str = "/sys/fs/cgroup/blkio";

/// An ext4 filesystem on a direct-I/O loop device whose image lives inside `lower`.
struct Upper {
    dev: String,
    mnt: PathBuf,
    mounted: bool,
    attached: bool,
    _dir: tempfile::TempDir,
}

impl Upper {
    fn new(lower: &LoopFs, size_mib: u64, options: &str) -> Upper {
        let image = lower.path().join("upper.img");
        run("truncate", &["-s", &format!("{size_mib}M"), s(&image)]);
        let dir = tempfile::Builder::new()
            .prefix("stallwatch-upper-")
            .tempdir()
            .unwrap();
        let mut u = Upper {
            dev: String::new(),
            mnt: dir.path().join("mnt"),
            mounted: false,
            attached: false,
            _dir: dir,
        };
        u.dev = run("losetup", &["--direct-io=on", "-f", "--show", s(&image)])
            .trim()
            .to_owned();
        assert!(
            u.dev.starts_with("/dev/loop"),
            "losetup printed {:?}",
            u.dev
        );
        u.attached = true;
        assert_eq!(
            read(&format!("/sys/block/{}/loop/dio", u.name())).trim(),
            "1",
            "the upper loop device must do direct I/O, or it is never busy"
        );
        run("mkfs.ext4", &["-q", "-F", &u.dev]);
        std::fs::create_dir(&u.mnt).unwrap();
        run("mount", &["-t", "ext4", "-o", options, &u.dev, s(&u.mnt)]);
        u.mounted = true;
        u
    }

    fn name(&self) -> &str {
        self.dev.trim_start_matches("/dev/")
    }
}

impl Drop for Upper {
    fn drop(&mut self) {
        if self.mounted {
            for i in 0..10 {
                if run_cmd("umount", &[s(&self.mnt)]).is_ok() {
                    self.mounted = false;
                    break;
                }
                std::thread::sleep(Duration::from_millis(200 * (i + 1)));
            }
        }
        if self.attached && !self.mounted {
            if let Err(e) = run_cmd("losetup", &["-d", &self.dev]) {
                eprintln!("Upper drop: losetup -d {}: {e}", self.dev);
            }
        }
    }
}

/// The two devices, torn down in the only order that does not hang: the throttle off,
/// then the upper filesystem, then the lower one (its own guard).
struct Rig {
    upper: Option<Upper>,
    lower: LoopFs,
}

impl Drop for Rig {
    fn drop(&mut self) {
        if self.lower.is_throttled() {
            self.lower.unthrottle();
        }
        self.upper.take();
    }
}

/// v1 cgroups, each made in the memory and the blkio hierarchy under one name (as
/// systemd lays out v1 hosts), and the process in each: killed by PID, reaped, then the
/// directories removed, on every exit path.
struct Cgroups {
    dirs: Vec<PathBuf>,
    children: Vec<Child>,
    /// Throttle files written, and the device whose limit to lift before removal.
    limits: Vec<(PathBuf, String)>,
}

impl Cgroups {
    /// Makes NAME in both hierarchies; returns the memory one.
    fn create(&mut self, name: &str) -> PathBuf {
        for h in [MEMCG, BLKIO] {
            let dir = Path::new(h).join(name);
            std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
            self.dirs.push(dir);
        }
        Path::new(MEMCG).join(name)
    }

    /// Runs `cmd` through `sh`, which moves itself into `cgroup` (both hierarchies)
    /// before exec.
    fn spawn_in(&mut self, cgroup: &Path, cmd: &str) -> u32 {
        let name = cgroup.file_name().unwrap().to_str().unwrap();
        let script = format!(
            "echo $$ > {MEMCG}/{name}/cgroup.procs && echo $$ > {BLKIO}/{name}/cgroup.procs && exec {cmd}"
        );
        let child = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        self.children.push(child);
        let procs = cgroup.join("cgroup.procs");
        assert!(
            wait_until(Duration::from_secs(5), Duration::from_millis(10), || {
                read(s(&procs)).lines().any(|l| l == pid.to_string())
            }),
            "pid {pid} never joined {}",
            cgroup.display()
        );
        pid
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for (file, dev) in &self.limits {
            if let Err(e) = std::fs::write(file, format!("{dev} 0\n")) {
                eprintln!("Cgroups drop: lifting the limit in {}: {e}", file.display());
            }
        }
        for d in self.dirs.iter().rev() {
            // The kernel lets an emptied cgroup go a moment after its last task exits.
            let gone = wait_until(Duration::from_secs(5), Duration::from_millis(50), || {
                std::fs::remove_dir(d).is_ok() || !d.exists()
            });
            if !gone {
                eprintln!("Cgroups drop: could not remove {}", d.display());
            }
        }
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `dirty + writeback` of a v1 memory cgroup, read by the test itself.
fn memcg_dirty(cgroup: &Path) -> u64 {
    let text = read(s(&cgroup.join("memory.stat")));
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(k, _)| *k == "dirty" || *k == "writeback")
        .map(|(_, v)| v.trim().parse::<u64>().unwrap())
        .sum()
}

/// (time, write sectors, io_ticks ms) of a block device, read by the test itself.
fn disk_stat(dev: &str) -> (Instant, u64, u64) {
    let text = read(&format!("/sys/block/{dev}/stat"));
    let f: Vec<u64> = text
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    (Instant::now(), f[6], f[9])
}

fn jbd2_transactions(dev: &str) -> u64 {
    let info = read(&format!("/proc/fs/jbd2/{dev}-8/info"));
    info.split_whitespace().next().unwrap().parse().unwrap()
}

/// The stall the test follows, and its own readings while it lasted.
struct Watch {
    at: Value,
    stat_first: (Instant, u64, u64),
    stat_last: Option<(Instant, u64, u64)>,
    own_dirty_max: u64,
}

impl Watch {
    /// How long the test's own readings span.
    fn seconds(&self) -> f64 {
        self.stat_last
            .map_or(0.0, |l| l.0.duration_since(self.stat_first.0).as_secs_f64())
    }
}

fn stalls(agent: &Agent) -> Vec<Value> {
    let (status, body, _) = agent.get("/api/stalls");
    assert_eq!(status, 200);
    serde_json::from_str(&body).unwrap()
}

#[test]
fn a_dirtier_in_its_own_cgroup_is_named_and_the_slow_device_is_busy_at_its_throttle() {
    let test = "a_dirtier_in_its_own_cgroup_is_named_and_the_slow_device_is_busy_at_its_throttle";
    if !require_root(test) {
        return;
    }
    // The agent ranks every cgroup and process that dirties or writes on the machine:
    // another test's writer would be among them.
    let _machine = machine::exclusive();
    assert!(
        Path::new(MEMCG).join("memory.stat").is_file()
            && Path::new(BLKIO).join("blkio.throttle.io_service_bytes").is_file(),
        "cgroup v1 memory and blkio are not mounted at {MEMCG}, {BLKIO} (TESTBED.md: the test machines have them)"
    );
    let lower = LoopFs::new("xfs", 320);
    let mut rig = Rig {
        upper: Some(Upper::new(&lower, 160, "nodelalloc,dioread_lock")),
        lower,
    };
    let upper = rig.upper.as_ref().unwrap();
    let (dev, mnt) = (upper.name().to_owned(), upper.mnt.clone());
    let yaml = format!(
        "vm_interval: 100ms\nstall_threshold: 500ms\ntargets:\n  - path: {}\n    name: slow\n    interval: 1s\n    modes: [overwrite]\n",
        mnt.display()
    );
    let agent = Agent::start(&yaml);
    assert!(agent.wait_up("slow"));

    let tag = format!("stallwatch-evidence-{}", std::process::id());
    let mut cg = Cgroups {
        dirs: vec![],
        children: vec![],
        limits: vec![],
    };
    let writer_cg = cg.create(&format!("{tag}-writer"));
    let idle_cg = cg.create(&format!("{tag}-idle"));
    cg.spawn_in(&idle_cg, "sleep 120");
    let jbd2_before = jbd2_transactions(&dev);
    // Half the throttle in the root's cgroup (the journal, the flusher, the probe), half
    // in the writer's: the loop worker issues the lower bios in the upper bio's cgroup.
    rig.lower.throttle_write_bps(THROTTLE_BPS / 2);
    let limit = Path::new(BLKIO).join(format!("{tag}-writer/blkio.throttle.write_bps_device"));
    cg.limits.push((limit.clone(), rig.lower.maj_min()));
    std::fs::write(
        &limit,
        format!("{} {}\n", rig.lower.maj_min(), THROTTLE_BPS / 2),
    )
    .unwrap();
    // Random 256 KiB buffered writes at 4 MB/s, twice what the device takes, writing
    // back every 2 MiB itself; bounded in bytes (32 MiB) and time.
    let fio = format!(
        "fio --name=dirtier --filename={} --rw=randwrite --bs=256k --size=32M --rate=4m \
         --ioengine=psync --thread --sync_file_range=write:8 --runtime=40 --output=/dev/null",
        mnt.join("big").display()
    );
    let writer = cg.spawn_in(&writer_cg, &fio);

    // Watch a stall that has lasted a second; while it lasts, read the cgroup and the
    // device ourselves. One that ends before we have a second of our own readings is
    // passed over for the next.
    let t0 = Instant::now();
    let mut watch: Option<Watch> = None;
    let mut done: Option<(Watch, Value)> = None;
    while t0.elapsed() < Duration::from_secs(50) && done.is_none() {
        let events = stalls(&agent);
        let mine: Vec<&Value> = events.iter().filter(|e| e["target"] == "slow").collect();
        match watch.take() {
            None => {
                let long = mine
                    .iter()
                    .find(|e| e["ongoing"] == true && e["duration_seconds"].as_f64() >= Some(1.0));
                if let Some(e) = long {
                    watch = Some(Watch {
                        at: e["started_at"].clone(),
                        stat_first: disk_stat(&dev),
                        stat_last: None,
                        own_dirty_max: memcg_dirty(&writer_cg),
                    });
                }
            }
            Some(mut w) => match mine.iter().find(|e| e["started_at"] == w.at) {
                Some(e) if e["ongoing"] == true => {
                    w.stat_last = Some(disk_stat(&dev));
                    w.own_dirty_max = w.own_dirty_max.max(memcg_dirty(&writer_cg));
                    watch = Some(w);
                }
                Some(e) if w.seconds() >= 1.0 => done = Some((w, (*e).clone())),
                _ => {}
            },
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let Some((w, ended)) = done else {
        let seen: Vec<String> = stalls(&agent)
            .iter()
            .map(|e| format!("{} {} {}", e["started_at"], e["op"], e["duration_seconds"]))
            .collect();
        panic!("no stall watched for a second within 50 s; events: {seen:#?}");
    };
    // The worker's reading after the end.
    let mut ev = Value::Null;
    let complete = wait_until(Duration::from_secs(5), Duration::from_millis(50), || {
        ev = stalls(&agent)
            .into_iter()
            .find(|e| e["started_at"] == w.at)
            .unwrap();
        ev["evidence"]["complete"] == true
    });
    assert!(
        complete,
        "evidence never complete: {ev}\n{}",
        agent.log_tail(30)
    );
    let line = format!("duration_seconds={}", ended["duration_seconds"]);
    assert!(
        agent
            .logs()
            .iter()
            .any(|l| l.contains("stall evidence") && l.contains(&line)),
        "no stall evidence line with {line}:\n{}",
        agent.log_tail(30)
    );
    let jbd2_end = jbd2_transactions(&dev);
    let m = agent.scrape();
    drop(agent);
    drop(cg);
    drop(rig);
    eprintln!("stall event: {ev}");
    let e = &ev["evidence"];
    assert!(e["reads"].as_u64().unwrap() >= 2, "{e}");
    assert_eq!(
        e["cgroup_version"], 1,
        "this machine's memory controller is v1"
    );

    // Who was dirtying: the writer's cgroup first, the idle one (if named) after it.
    let dirtiers = e["dirtiers"].as_array().unwrap();
    let pos = |name: &str| dirtiers.iter().position(|d| d["cgroup"] == name);
    let writer_pos = pos(&format!("/{tag}-writer"));
    assert_eq!(writer_pos, Some(0), "writer not first: {dirtiers:?}");
    if let Some(i) = pos(&format!("/{tag}-idle")) {
        assert!(i > 0);
        assert_eq!(
            dirtiers[i]["dirty_bytes"], 0,
            "the idle cgroup dirtied nothing"
        );
    }
    // The verdict names the writer's cgroup as the top dirtier, and the busy device.
    let verdict = ev["verdict"].as_str().unwrap_or_default();
    assert!(
        verdict.contains(&format!("top dirtier /{tag}-writer")),
        "the verdict does not name the dirtier: {verdict}"
    );
    assert!(
        verdict.contains(&format!("{dev} writing")),
        "the verdict does not say what the device did: {verdict}"
    );
    let d = &dirtiers[0];
    let agents = d["dirty_bytes"].as_u64().unwrap() + d["writeback_bytes"].as_u64().unwrap();
    let own = w.own_dirty_max;
    assert!(
        own > 0,
        "the test saw no dirty memory in the writer's cgroup"
    );
    let ratio = agents as f64 / own as f64;
    assert!(
        (0.1..=10.0).contains(&ratio),
        "agent's peak {agents} vs the test's own reading {own}"
    );
    // Root: /proc/PID/io of every process is readable, so the writer is named, in its
    // cgroup.
    let writers = e["writers"].as_array().unwrap();
    assert!(
        writers.iter().any(|p| p["pid"] == writer
            && p["comm"] == "fio"
            && p["cgroup"] == format!("/{tag}-writer")
            && p["written_bytes"].as_u64() > Some(0)),
        "fio (pid {writer}) not among the writers: {writers:?}"
    );

    // What the device did: held at the throttle and busy all the time, as the test's own
    // reads of its stat say.
    let bd = e["block_devices"].as_array().unwrap();
    let b = bd
        .iter()
        .find(|b| b["device"] == dev.as_str())
        .expect("upper device");
    assert_eq!(b["role"], "disk");
    let f = |k: &str| b[k].as_f64().unwrap_or_else(|| panic!("{k} in {b}"));
    let throttle = THROTTLE_BPS as f64;
    // blk-throttle lets a cgroup that was idle spend a slice's budget at once, and the
    // two cgroups' shares add up: one interval may run above the throttle, not far.
    assert!(
        f("write_bytes_per_second_max") <= 2.0 * throttle,
        "peak {} far above the {throttle} B/s throttle",
        f("write_bytes_per_second_max")
    );
    assert!(f("write_bytes_per_second_min") <= 1.1 * throttle, "{b}");
    assert!(f("write_bytes_per_second_avg") <= 1.25 * throttle, "{b}");
    assert!(f("write_bytes_per_second_max") >= 0.25 * throttle, "{b}");
    let ((ta, wa, ia), (tb, wb, ib)) = (w.stat_first, w.stat_last.unwrap());
    let dt = tb.duration_since(ta).as_secs_f64();
    assert!(dt >= 1.0, "the test's own window is {dt} s");
    let own_util = (ib - ia) as f64 / 1000.0 / dt;
    let own_rate = (wb - wa) as f64 * 512.0 / dt;
    eprintln!("test's own reading: {own_util:.2} busy, {own_rate:.0} B/s over {dt:.1} s");
    assert!(
        own_util >= 0.8,
        "the device was not busy by its own stat: {own_util}"
    );
    assert!(f("utilisation_max") >= 0.9, "{b}");
    assert!(
        (f("utilisation_avg") - own_util).abs() <= 0.2,
        "{b} vs {own_util}"
    );
    let rate_ratio = f("write_bytes_per_second_avg") / own_rate;
    assert!((0.5..=2.0).contains(&rate_ratio), "{b} vs {own_rate}");
    assert!(b["inflight_writes_max"].as_u64().unwrap() > 0, "{b}");
    assert_eq!(
        b["nr_requests"],
        read(&format!("/sys/block/{dev}/queue/nr_requests"))
            .trim()
            .parse::<u64>()
            .unwrap()
    );
    assert!(
        f("write_latency_seconds_avg") > 0.1,
        "a write waits behind the queue: {b}"
    );

    // The ext4 journal, from its own info file.
    let j = &e["journal"];
    assert_eq!(j["journal"], format!("{dev}-8"));
    let (start, end) = (
        j["start"]["transactions"].as_u64().unwrap(),
        j["end"]["transactions"].as_u64().unwrap(),
    );
    assert!(
        jbd2_before <= start && start <= end && end <= jbd2_end,
        "{j} vs {jbd2_before} before and {jbd2_end} after"
    );
    assert!(j["end"]["commit_seconds_avg"].as_f64().is_some(), "{j}");

    // Device facts for the upper device, as sysfs has them.
    let facts = m.series("stallwatch_device_info");
    let mine = facts
        .iter()
        .find(|(l, _)| l["device"] == dev)
        .unwrap_or_else(|| panic!("no device_info for {dev}: {facts:?}"));
    let want = |attr: &str| {
        read(&format!("/sys/block/{dev}/queue/{attr}"))
            .trim()
            .to_owned()
    };
    assert_eq!(mine.0["rotational"], want("rotational"));
    assert_eq!(mine.0["write_cache"], want("write_cache"));
    assert!(
        want("scheduler").contains(&format!("[{}]", mine.0["scheduler"]))
            || want("scheduler") == mine.0["scheduler"]
    );
}

/// CPU time of `f` on this thread.
fn thread_cpu<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let now = || {
        let ts = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    };
    let t0 = now();
    let out = f();
    (out, now() - t0)
}

/// A v2 hierarchy of `n` cgroups (services under system.slice, sessions under
/// user.slice), each with a memory.stat and an io.stat as the kernel writes them.
fn cgroup_tree(sys: &Path, n: usize) {
    let root = sys.join("fs/cgroup");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(
        root.join("cgroup.controllers"),
        "cpuset cpu io memory pids\n",
    )
    .unwrap();
    let stat = |dirty: usize| {
        format!(
            "anon 1060864\nfile 294912\nkernel 1548288\nkernel_stack 65536\npagetables 131072\nsec_pagetables 0\npercpu 2880\nsock 0\nvmalloc 0\nshmem 0\nzswap 0\nzswapped 0\nfile_mapped 0\nfile_dirty {dirty}\nfile_writeback 4096\nswapcached 0\nanon_thp 0\nfile_thp 0\nshmem_thp 0\ninactive_anon 0\nactive_anon 1060864\ninactive_file 1159168\nactive_file 0\nunevictable 0\nslab_reclaimable 278528\nslab_unreclaimable 1118216\nslab 1396744\nworkingset_refault_anon 0\nworkingset_refault_file 0\nworkingset_activate_anon 0\nworkingset_activate_file 0\nworkingset_restore_anon 0\nworkingset_restore_file 0\nworkingset_nodereclaim 0\npgscan 0\npgsteal 0\npgfault 4419\npgmajfault 0\npgrefill 0\npgactivate 0\npgdeactivate 0\npglazyfree 0\nthp_fault_alloc 0\nthp_collapse_alloc 0\n"
        )
    };
    let io = "8:16 rbytes=1459200 wbytes=314773504 rios=192 wios=353 dbytes=0 dios=0\n8:0 rbytes=90112 wbytes=4096 rios=3 wios=1 dbytes=0 dios=0\n";
    let mut made = 0;
    for (slice, per) in [("system.slice", n / 2), ("user.slice", n - n / 2 - 3)] {
        let s = root.join(slice);
        std::fs::create_dir(&s).unwrap();
        std::fs::write(s.join("memory.stat"), stat(1 << 20)).unwrap();
        std::fs::write(s.join("io.stat"), io).unwrap();
        made += 1;
        for i in 0..per {
            let c = s.join(format!("unit-{i}.scope"));
            std::fs::create_dir(&c).unwrap();
            std::fs::write(c.join("memory.stat"), stat(i * 4096)).unwrap();
            std::fs::write(c.join("io.stat"), io).unwrap();
            made += 1;
        }
    }
    std::fs::write(root.join("memory.stat"), stat(1 << 30)).unwrap();
    std::fs::write(root.join("io.stat"), io).unwrap();
    assert_eq!(made + 1, n, "cgroups in the tree, the root included");
}

/// The cost of one attribution pass on a host with 2,000 cgroups (BENCHMARKS.md): a
/// fixture v2 tree in a temporary directory as sysfs, the real /proc for the processes.
/// Prints the figures; run with `cargo test --release --test it -- --ignored
/// --nocapture evidence::attribution_pass`.
#[test]
#[ignore]
fn attribution_pass_cost_on_2000_cgroups() {
    // A measurement: nothing else may compete for the CPU.
    let _machine = machine::exclusive();
    use stallwatch::kernel::cgroups::{self, DevNum, Hierarchies};
    // On a tmpfs where there is one: cgroupfs lives in memory, and a disk filesystem's
    // directory blocks would be measured instead (ext4's htree readdir).
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .unwrap();
    cgroup_tree(dir.path(), 2000);
    let h = Hierarchies::find(dir.path());
    assert!(h.v2_memory.is_some() && h.v2_io.is_some());
    let devs = [DevNum {
        major: 8,
        minor: 16,
    }];
    // Warm the dentry and page caches, as a second reading of a stall finds them.
    let first = cgroups::read(&h, &devs, cgroups::MAX_CGROUPS);
    assert_eq!((first.walked, first.capped, first.errors), (2000, false, 0));
    let mut cg = Vec::new();
    let mut full = Vec::new();
    let roots = stallwatch::kernel::kernfs::Roots {
        proc_root: "/proc".into(),
        sys_root: dir.path().to_owned(),
    };
    // The target's disk, sdb (8:16), whose written bytes io.stat gives.
    let sdb = dir.path().join("block/sdb");
    std::fs::create_dir_all(sdb.join("queue")).unwrap();
    std::fs::write(sdb.join("dev"), "8:16\n").unwrap();
    std::fs::write(sdb.join("inflight"), "       0       12\n").unwrap();
    std::fs::write(sdb.join("queue/nr_requests"), "64\n").unwrap();
    std::fs::write(
        sdb.join("stat"),
        "   80211 12 6421040 52310 1520 301 9437184 8870 3 40120 61250 0 0 0 0 77 412\n",
    )
    .unwrap();
    let scope = stallwatch::stall::evidence::Scope {
        disk: Some("sdb".into()),
        device: Some("sdb1".into()),
        members: vec![],
    };
    for _ in 0..20 {
        cg.push(thread_cpu(|| cgroups::read(&h, &devs, cgroups::MAX_CGROUPS)).1);
        let (r, t) = thread_cpu(|| stallwatch::stall::evidence::read(&roots, &h, &[&scope]));
        assert_eq!(r.cgroups.walked, 2000);
        assert_eq!(
            r.cgroups.cgroups["/system.slice/unit-7.scope"].written,
            314773504
        );
        full.push((t, r.procs.written.len()));
    }
    cg.sort();
    full.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "attribution pass, 2000 cgroups (v2 memory.stat + io.stat), 20 runs: cgroup walk CPU median {:.2} ms, max {:.2} ms; whole reading (cgroups, /proc/PID/io of {} processes, the disk, jbd2): median {:.2} ms, max {:.2} ms",
        ms(cg[cg.len() / 2]),
        ms(cg[cg.len() - 1]),
        full[0].1,
        ms(full[full.len() / 2].0),
        ms(full[full.len() - 1].0),
    );
}
