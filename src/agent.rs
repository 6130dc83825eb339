//! The long-running agent: starts the probe threads, the VM sampler and the watchdog,
//! serves HTTP until SIGTERM/SIGINT, then shuts down without waiting on its own locks.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tracing::{info, warn};

use crate::config::Config;
use crate::metrics;
use crate::probe::{self, Context, ProbeMetrics, TargetShared, Worker};
use crate::routes::{self, App};
use crate::sampler::{Sampler, SamplerMetrics};
use crate::stalls::StallLog;
use crate::sync::Shutdown;
use crate::watchdog;
use crate::web::{self, Limits, WebConfig};

use crate::kernfs::Roots;

/// Runs the agent until a signal; returns once no probe is blocked any more.
pub fn run(
    config: Config,
    listen: SocketAddr,
    roots: Roots,
    web: WebConfig,
    limits: Limits,
) -> anyhow::Result<()> {
    let shutdown = Arc::new(Shutdown::default());
    // Each module registers the families it owns; the scrape encodes the registry.
    let registry = metrics::registry();
    let probe_metrics = Arc::new(ProbeMetrics::new(&registry));
    let mut lanes = 0;
    let targets: Vec<Arc<TargetShared>> = config
        .targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let shared = TargetShared::new(i, t.clone(), lanes, &probe_metrics, &roots);
            lanes += shared.lanes.len();
            Arc::new(shared)
        })
        .collect();
    probe::register_inflight(&registry, targets.clone());
    let stalls = Arc::new(StallLog::new(config.stall_log_size, &registry));
    let sampler = Sampler {
        metrics: SamplerMetrics::new(&registry),
        roots: roots.clone(),
        interval: config.vm_interval,
    };
    let ctx = Arc::new(Context {
        metrics: probe_metrics,
        stalls: Arc::clone(&stalls),
        shutdown: Arc::clone(&shutdown),
        roots,
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

    // One thread per lane: targets x modes, plus the sampler, the watchdog and the
    // HTTP runtime's, whatever happens to the probed filesystems.
    let mut probes: Vec<(Arc<TargetShared>, usize, JoinHandle<()>)> = Vec::new();
    for t in &targets {
        for (i, lane) in t.lanes.iter().enumerate() {
            let worker = Worker::new(Arc::clone(t), i, Arc::clone(&ctx));
            // Thread names are cut at 15 bytes: the target's number and the mode.
            let h = std::thread::Builder::new()
                .name(format!("p{}-{}", t.index, lane.mode))
                .spawn(move || worker.run())
                .context("spawning a probe lane")?;
            probes.push((Arc::clone(t), i, h));
        }
    }
    let sampler = {
        let (s, sd) = (Arc::clone(&stalls), Arc::clone(&shutdown));
        std::thread::Builder::new()
            .name("vm-sampler".into())
            .spawn(move || sampler.run(&s, &sd))
            .context("spawning the VM sampler")?
    };
    let watchdog = {
        let (t, s, sd) = (targets.clone(), Arc::clone(&stalls), Arc::clone(&shutdown));
        std::thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || watchdog::run(t, s, sd))
            .context("spawning the watchdog")?
    };

    let app = routes::app(Arc::new(App {
        registry,
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

/// Waits for every lane. A thread blocked in the kernel (a frozen filesystem, a hung
/// device) cannot be interrupted; say which target holds it, every few seconds.
fn wait_for_probes(mut probes: Vec<(Arc<TargetShared>, usize, JoinHandle<()>)>) {
    let mut next_log = Instant::now();
    loop {
        let (done, rest): (Vec<_>, Vec<_>) =
            probes.into_iter().partition(|(_, _, h)| h.is_finished());
        for (_, _, h) in done {
            let _ = h.join();
        }
        probes = rest;
        if probes.is_empty() {
            return;
        }
        if Instant::now() >= next_log {
            for (t, i, _) in &probes {
                let lane = &t.lanes[*i];
                match lane.inflight.current() {
                    Some(op) => warn!(target = %t.target.name, path = %t.target.path.display(),
                        mode = %op.mode, op = %op.op, blocked_seconds = op.age.as_secs_f64(),
                        "waiting to exit: probe blocked in the kernel; it cannot be interrupted, not even by SIGKILL"),
                    None => info!(target = %t.target.name, mode = %lane.mode,
                        "waiting for probe thread to finish"),
                }
            }
            next_log = Instant::now() + Duration::from_secs(5);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
