//! The long-running agent: starts the probe lanes, the VM sampler and the watchdog,
//! serves HTTP until SIGTERM/SIGINT, reloads the configuration on SIGHUP, then shuts
//! down without waiting on its own locks.

pub mod files;
#[doc(hidden)]
pub mod fixture;
pub mod reload;
pub mod resident;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tracing::{info, warn};

use crate::base::sync::Shutdown;
use crate::config::{Config, Source};
use crate::exposition::registry;
use crate::history::History;
use crate::http::server::{self, Limits, WebConfig};
use crate::http::{self, App};
use crate::kernel::host::HostInfo;
use crate::kernel::kernfs::Roots;
use crate::probe::supervisor::Supervisor;
use crate::probe::watchdog;
use crate::probe::{self, Context, ProbeMetrics};
use crate::sampler::{Latest, Sampler, SamplerMetrics};
use crate::stall::log::StallLog;
use crate::stall::store::{self, Store};
use crate::stall::wake::Wake;
use crate::stall::worker;
use reload::Reloader;
use resident::Lock;

/// How the agent serves and where it reads, besides the configuration file.
pub struct Options {
    pub listen: Listen,
    pub roots: Roots,
    pub web: WebConfig,
    pub limits: Limits,
    /// `--web.enable-lifecycle`: `POST /-/reload`.
    pub lifecycle: bool,
    /// What `resident::lock` achieved at start-up, for `stallwatch_memory_locked`.
    pub memory_lock: Lock,
    /// `--storage.path`: where the stall record is kept; None: nothing is written.
    pub storage: Option<PathBuf>,
}

/// Where the HTTP server listens.
pub enum Listen {
    /// Bind this address (port 0: any free port).
    Address(SocketAddr),
    /// `--web.systemd-socket`: the listening sockets systemd passed.
    Sockets(Vec<std::net::TcpListener>),
}

/// Runs the agent until a signal; returns once no probe is blocked any more.
pub fn run(config: Config, source: Source, options: Options) -> anyhow::Result<()> {
    let Options {
        listen,
        roots,
        web,
        limits,
        lifecycle,
        memory_lock,
        storage,
    } = options;
    let shutdown = Arc::new(Shutdown::default());
    // Each module registers the families it owns; the scrape encodes the registry.
    let registry = registry::registry();
    resident::register(&registry, &memory_lock);
    match HostInfo::read(&roots) {
        Ok(host) => host.register(&registry),
        Err(e) => warn!("no stallwatch_host_info: {e}"),
    }
    // The evidence worker's wake-up: the stall log notifies it, the worker waits on it.
    let wake = Arc::new(Wake::default());
    let stalls = Arc::new(StallLog::new(
        config.stall_log_size,
        &registry,
        Arc::clone(&wake),
    ));
    let storage_errors = store::register(&registry);
    let history = Arc::new(History::new());
    let ctx = Arc::new(Context::new(
        Arc::new(ProbeMetrics::new(&registry)),
        Arc::clone(&stalls),
        Arc::clone(&history),
        roots.clone(),
    ));
    let latest = Arc::new(Latest::default());
    let sampler = Sampler {
        history: Arc::clone(&history),
        metrics: SamplerMetrics::new(&registry),
        roots,
        interval: config.vm_interval,
        devices: Arc::clone(&ctx.devices),
        latest: Arc::clone(&latest),
    };

    // Bind before starting probes: a port in use is a start-up error, not a probe result.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    let systemd_socket = matches!(listen, Listen::Sockets(_));
    let listeners = match listen {
        Listen::Address(addr) => vec![rt
            .block_on(tokio::net::TcpListener::bind(addr))
            .with_context(|| format!("cannot listen on {addr}"))?],
        Listen::Sockets(sockets) => {
            let _guard = rt.enter();
            sockets
                .into_iter()
                .map(|s| {
                    s.set_nonblocking(true)?;
                    tokio::net::TcpListener::from_std(s)
                })
                .collect::<std::io::Result<Vec<_>>>()
                .context("using the sockets systemd passed")?
        }
    };
    let bound = listeners
        .iter()
        .map(|l| l.local_addr())
        .collect::<std::io::Result<Vec<_>>>()?;
    let signals = install_signals(&rt)?;
    // The stall record: its own thread loads it into the log and keeps it written;
    // started once the port is ours, so an agent that cannot start touches no record.
    let store = match storage {
        Some(dir) => Some(
            Store::start(dir, Arc::clone(&stalls), storage_errors)
                .context("spawning the stall record's thread")?,
        ),
        None => None,
    };

    // One thread per lane (targets x modes), plus the sampler, the watchdog and the
    // HTTP runtime's, whatever happens to the probed filesystems.
    let telemetry_path = config.telemetry_path.clone();
    let reloader = Arc::new(Reloader::start(
        source,
        config,
        Supervisor::new(Arc::clone(&ctx)),
        &registry,
    )?);
    let targets = reloader.targets();
    probe::register_inflight(&registry, Arc::clone(&targets));
    let sampler = {
        let (s, sd) = (Arc::clone(&stalls), Arc::clone(&shutdown));
        std::thread::Builder::new()
            .name("vm-sampler".into())
            .spawn(move || sampler.run(&s, &sd))
            .context("spawning the VM sampler")?
    };
    let evidence = {
        let (s, w, r) = (Arc::clone(&stalls), Arc::clone(&wake), ctx.roots.clone());
        std::thread::Builder::new()
            .name("evidence".into())
            .spawn(move || worker::run(s, w, r))
            .context("spawning the evidence worker")?
    };
    let watchdog = {
        let (t, d, s, sd) = (
            Arc::clone(&targets),
            Arc::clone(&ctx.devices),
            Arc::clone(&stalls),
            Arc::clone(&shutdown),
        );
        std::thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || watchdog::run(t, d, s, sd))
            .context("spawning the watchdog")?
    };

    let reload: Option<http::ReloadFn> = lifecycle.then(|| {
        let r = Arc::clone(&reloader);
        Arc::new(move || r.reload().map_err(Into::into)) as http::ReloadFn
    });
    let app = http::app(Arc::new(App {
        registry,
        stalls: Arc::clone(&stalls),
        targets,
        history,
        latest,
        telemetry_path,
        reload,
        stalls_json: std::sync::Mutex::default(),
    }));
    for addr in &bound {
        info!(address = %addr, tls = web.tls_enabled(), basic_auth = web.auth_enabled(),
            lifecycle, systemd_socket, "listening on {addr}");
    }
    let (term, int, hup) = signals;
    {
        let _guard = rt.enter();
        tokio::spawn(reload_on_sighup(hup, Arc::clone(&reloader)));
    }
    // On the signal the listener is dropped at once (new connections are refused) and
    // open connections get `limits.shutdown_grace` to finish, not more.
    rt.block_on(server::serve(
        listeners,
        app,
        web,
        limits,
        wait_for_signal(term, int),
    ));
    // Whatever is still open is dropped here; a bcrypt or a reload still running is not
    // waited for.
    rt.shutdown_timeout(Duration::from_millis(100));

    shutdown.trigger();
    let _ = sampler.join();
    let _ = watchdog.join();
    wake.close();
    let _ = evidence.join();
    reloader.shutdown();
    if let Some(store) = store {
        store.stop(store::SHUTDOWN_WAIT);
    }
    info!("stopped");
    Ok(())
}

/// SIGTERM, SIGINT and SIGHUP streams, installed before the agent says it is listening,
/// so a signal that follows that line is always handled, never the default death.
type Signals = (
    tokio::signal::unix::Signal,
    tokio::signal::unix::Signal,
    tokio::signal::unix::Signal,
);

fn install_signals(rt: &tokio::runtime::Runtime) -> anyhow::Result<Signals> {
    use tokio::signal::unix::{signal, SignalKind};
    let _guard = rt.enter();
    Ok((
        signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
        signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        signal(SignalKind::hangup()).context("installing the SIGHUP handler")?,
    ))
}

/// Reloads the configuration at every SIGHUP, off the runtime's thread (reading the
/// file and starting lanes must not hold up a scrape).
async fn reload_on_sighup(mut hup: tokio::signal::unix::Signal, reloader: Arc<Reloader>) {
    while hup.recv().await.is_some() {
        info!(signal = "SIGHUP", "reloading the configuration");
        let r = Arc::clone(&reloader);
        if let Err(e) = tokio::task::spawn_blocking(move || r.reload()).await {
            warn!(error = %e, "configuration reload did not complete");
        }
    }
}

async fn wait_for_signal(
    mut term: tokio::signal::unix::Signal,
    mut int: tokio::signal::unix::Signal,
) {
    let which = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    info!(
        signal = which,
        "shutting down: listener closed, no new probe cycles"
    );
}
