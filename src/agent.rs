//! The long-running agent: starts the probe threads, the VM sampler and the watchdog,
//! serves HTTP until SIGTERM/SIGINT, then shuts down without waiting on its own locks.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tracing::{info, warn};

use crate::blockdev;
use crate::config::Config;
use crate::http::{self, App};
use crate::metrics::Metrics;
use crate::probe::{Context, Shutdown, TargetShared, Worker};
use crate::stalls::{self, DeviceReading, Snapshot, StallLog};
use crate::vm;
use crate::web::{self, Limits, WebConfig};

pub use crate::kernfs::Roots;

/// Runs the agent until a signal; returns once no probe is blocked any more.
pub fn run(
    config: Config,
    listen: SocketAddr,
    roots: Roots,
    web: WebConfig,
    limits: Limits,
) -> anyhow::Result<()> {
    let shutdown = Arc::new(Shutdown::default());
    let targets: Vec<Arc<TargetShared>> = config
        .targets
        .iter()
        .enumerate()
        .map(|(i, t)| Arc::new(TargetShared::new(i, t.clone())))
        .collect();
    let metrics = Arc::new(Metrics::new(targets.clone()));
    let stalls = Arc::new(StallLog::new(config.stall_log_size, Arc::clone(&metrics)));
    let ctx = Arc::new(Context {
        metrics: Arc::clone(&metrics),
        stalls: Arc::clone(&stalls),
        shutdown: Arc::clone(&shutdown),
        proc_root: roots.proc_root.clone(),
        sys_root: roots.sys_root.clone(),
    });

    // Bind before starting probes: a port in use is a start-up error, not a probe result.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(listen))
        .with_context(|| format!("cannot listen on {listen}"))?;
    let bound = listener.local_addr()?;
    let signals = install_signals(&rt)?;

    for t in &config.targets {
        info!(target = %t.name, path = %t.path.display(), interval = ?t.interval,
            modes = ?t.modes.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
            size = t.size, sync = t.sync.as_str(), stall_threshold = ?t.stall_threshold,
            require_mountpoint = t.require_mountpoint, "target configured");
    }

    let mut probes: Vec<(Arc<TargetShared>, JoinHandle<()>)> = Vec::new();
    for t in &targets {
        let worker = Worker::new(Arc::clone(t), Arc::clone(&ctx));
        let h = std::thread::Builder::new()
            .name(format!("probe-{}", t.index))
            .spawn(move || worker.run())
            .context("spawning a probe thread")?;
        probes.push((Arc::clone(t), h));
    }
    let sampler = {
        let (m, s, sd, r, iv) = (
            Arc::clone(&metrics),
            Arc::clone(&stalls),
            Arc::clone(&shutdown),
            roots.clone(),
            config.vm_interval,
        );
        std::thread::Builder::new()
            .name("vm-sampler".into())
            .spawn(move || run_sampler(&m, &s, &sd, &r, iv))
            .context("spawning the VM sampler")?
    };
    let watchdog = {
        let (t, s, m, sd) = (
            targets.clone(),
            Arc::clone(&stalls),
            Arc::clone(&metrics),
            Arc::clone(&shutdown),
        );
        std::thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || stalls::run_watchdog(t, s, m, sd))
            .context("spawning the watchdog")?
    };

    let app = http::app(Arc::new(App {
        metrics,
        stalls,
        targets: targets.clone(),
        telemetry_path: config.telemetry_path.clone(),
    }));
    info!(address = %bound, tls = web.tls_enabled(), basic_auth = web.auth_enabled(),
        "listening on {bound}");
    // On the signal the listener is dropped at once (new connections are refused) and
    // open connections get `limits.shutdown_grace` to finish, not more.
    rt.block_on(web::serve(
        listener,
        app,
        web,
        limits,
        wait_for_signal(signals),
    ));
    // Whatever is still open is dropped here; a bcrypt still running is not waited for.
    rt.shutdown_timeout(Duration::from_millis(100));

    shutdown.trigger();
    let _ = sampler.join();
    let _ = watchdog.join();
    wait_for_probes(probes);
    info!("stopped");
    Ok(())
}

/// SIGTERM and SIGINT streams, installed before the agent says it is listening, so a
/// signal that follows that line is always a clean shutdown, never the default death.
type Signals = (tokio::signal::unix::Signal, tokio::signal::unix::Signal);

fn install_signals(rt: &tokio::runtime::Runtime) -> anyhow::Result<Signals> {
    use tokio::signal::unix::{signal, SignalKind};
    let _guard = rt.enter();
    Ok((
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
        signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
    ))
}

async fn wait_for_signal((mut term, mut int): Signals) {
    let which = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    info!(
        signal = which,
        "shutting down: listener closed, no new probe cycles"
    );
}

/// Waits for every probe thread. A thread blocked in the kernel (a frozen filesystem, a
/// hung device) cannot be interrupted; say which target holds it, every few seconds.
fn wait_for_probes(mut probes: Vec<(Arc<TargetShared>, JoinHandle<()>)>) {
    let mut next_log = Instant::now();
    loop {
        let (done, rest): (Vec<_>, Vec<_>) = probes.into_iter().partition(|(_, h)| h.is_finished());
        for (_, h) in done {
            let _ = h.join();
        }
        probes = rest;
        if probes.is_empty() {
            return;
        }
        if Instant::now() >= next_log {
            for (t, _) in &probes {
                match t.inflight.current() {
                    Some(op) => warn!(target = %t.target.name, path = %t.target.path.display(),
                        mode = %op.mode, op = %op.op, blocked_seconds = op.age.as_secs_f64(),
                        "waiting to exit: probe blocked in the kernel; it cannot be interrupted, not even by SIGKILL"),
                    None => info!(target = %t.target.name, "waiting for probe thread to finish"),
                }
            }
            next_log = Instant::now() + Duration::from_secs(5);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Samples vmstat, PSI, the sysctls and the devices beneath the targets every
/// `interval`, into the gauges and the stall log's history.
fn run_sampler(
    m: &Metrics,
    stalls: &StallLog,
    shutdown: &Shutdown,
    roots: &Roots,
    interval: Duration,
) {
    let page = vm::page_size();
    let mut prev: Option<vm::VmSample> = None;
    let mut failing = false;
    let mut samples: u64 = 0;
    let mut next = Instant::now();
    loop {
        // The sysctls every tenth sample (and the first).
        let with_sysctls = samples % 10 == 0;
        samples += 1;
        match vm::sample(&roots.proc_root, page, with_sysctls) {
            Ok(s) => {
                if failing {
                    info!("VM sampling recovered");
                    failing = false;
                }
                publish_vm(m, &s, prev.as_ref());
                let devices = read_devices(m, stalls, &roots.sys_root);
                stalls.observe(Snapshot { vm: s, devices });
                prev = Some(s);
            }
            Err(e) => {
                m.vm_sample_errors.inc();
                if !failing {
                    warn!(error = %e, "VM sampling failed");
                    failing = true;
                }
            }
        }
        next += interval;
        let now = Instant::now();
        if next < now {
            next = now;
        }
        if shutdown.sleep_until(next) {
            return;
        }
    }
}

fn publish_vm(m: &Metrics, s: &vm::VmSample, prev: Option<&vm::VmSample>) {
    let c = &s.counters;
    m.vm_dirty.set(c.dirty_bytes as i64);
    m.vm_writeback.set(c.writeback_bytes as i64);
    m.vm_dirty_threshold.set(c.dirty_threshold_bytes as i64);
    m.vm_dirty_background_threshold
        .set(c.dirty_background_threshold_bytes as i64);
    // Kernel totals mirrored as counters: add what grew since the last sample.
    let (d0, w0) = prev
        .map(|p| (p.counters.dirtied_bytes, p.counters.written_bytes))
        .unwrap_or((0, 0));
    m.vm_dirtied.inc_by(c.dirtied_bytes.saturating_sub(d0));
    m.vm_written.inc_by(c.written_bytes.saturating_sub(w0));
    if let Some(p) = s.pressure {
        let (s0, f0) = prev
            .and_then(|p| p.pressure)
            .map(|p| (p.some_seconds, p.full_seconds))
            .unwrap_or((0.0, 0.0));
        m.pressure_some.inc_by((p.some_seconds - s0).max(0.0));
        m.pressure_full.inc_by((p.full_seconds - f0).max(0.0));
    }
    if let Some(y) = s.sysctls {
        m.sysctl_dirty_ratio.set(y.dirty_ratio);
        m.sysctl_dirty_background_ratio
            .set(y.dirty_background_ratio);
        m.sysctl_dirty_bytes.set(y.dirty_bytes as f64);
        m.sysctl_dirty_background_bytes
            .set(y.dirty_background_bytes as f64);
        m.sysctl_dirty_expire.set(y.dirty_expire_seconds);
        m.sysctl_dirty_writeback.set(y.dirty_writeback_seconds);
    }
}

/// Reads in-flight requests and md state of the devices beneath the targets.
fn read_devices(m: &Metrics, stalls: &StallLog, sys_root: &std::path::Path) -> DeviceReading {
    let (disks, arrays): (BTreeSet<String>, BTreeSet<String>) = stalls.watched_devices();
    let mut r = DeviceReading::default();
    for d in &disks {
        if let Ok((reads, writes)) = blockdev::inflight(sys_root, d) {
            m.device_inflight
                .with_label_values(&[d, "read"])
                .set(reads as i64);
            m.device_inflight
                .with_label_values(&[d, "write"])
                .set(writes as i64);
            r.inflight.insert(d.clone(), reads + writes);
        }
    }
    for a in &arrays {
        let Ok(st) = blockdev::md_state(sys_root, a) else {
            continue;
        };
        if let Some(action) = st.sync_action {
            for x in blockdev::SyncAction::ALL {
                m.md_sync_action
                    .with_label_values(&[a, x.as_str()])
                    .set((x == action) as i64);
            }
            r.md_action.insert(a.clone(), action.as_str().to_owned());
        }
        m.md_sync_completed
            .with_label_values(&[a])
            .set(st.sync_fraction.unwrap_or(1.0));
        if let Some(d) = st.degraded {
            m.md_degraded.with_label_values(&[a]).set(d as i64);
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stalls::TargetDevices;
    use std::path::Path;

    #[test]
    fn md_and_device_metrics_from_a_resyncing_raid5_fixture() {
        let sys = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sys/md-raid5-resync");
        let m = Arc::new(Metrics::new(Vec::new()));
        let log = StallLog::new(4, Arc::clone(&m));
        let d = blockdev::resolve(&sys, 9, 0).unwrap();
        log.set_devices(
            0,
            TargetDevices {
                disk: Some(d.disk.clone()),
                arrays: d.md_arrays.clone(),
            },
        );
        let r = read_devices(&m, &log, &sys);
        assert_eq!(r.md_action.get("md0").map(String::as_str), Some("resync"));
        assert_eq!(
            m.md_sync_action.with_label_values(&["md0", "resync"]).get(),
            1
        );
        assert_eq!(
            m.md_sync_action.with_label_values(&["md0", "idle"]).get(),
            0
        );
        let done = m.md_sync_completed.with_label_values(&["md0"]).get();
        assert!((done - 123456.0 / 7814037168.0).abs() < 1e-9, "{done}");
        assert!(r.inflight.contains_key("md0"));
    }
}
