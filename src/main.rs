//! stallwatch's command line: the agent, `check-config`, `probe`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use tracing::info;

use stallwatch::agent;
use stallwatch::agent::{files, resident};
use stallwatch::cli::probe::{self, ProbeArgs};
use stallwatch::config::{self, Config, ConfigError};
use stallwatch::http::server::{self, WebConfig, WebConfigError};
use stallwatch::kernel::kernfs::{self, Roots};

/// Storage stall probe agent: times create/write/fsync on each mount point, samples
/// dirty-page and writeback state, and serves it for Prometheus.
#[derive(Parser)]
#[command(
    name = "stallwatch",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    /// Configuration file (default: /etc/stallwatch/config.yaml, else an embedded default).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to listen on, overriding the file; port 0 picks a free port.
    #[arg(long = "web.listen-address", value_name = "ADDR")]
    listen_address: Option<String>,
    /// Serve on the listening sockets systemd passes (socket activation: LISTEN_FDS,
    /// LISTEN_PID) instead of binding the listen address; see stallwatch.socket.
    #[arg(long = "web.systemd-socket", conflicts_with = "listen_address")]
    web_systemd_socket: bool,
    /// Web configuration (exporter-toolkit format): TLS, basic auth, headers.
    #[arg(long = "web.config.file", value_name = "FILE")]
    web_config_file: Option<PathBuf>,
    /// Requests served at once; more get 503 at once. 0: no limit.
    #[arg(long = "web.max-requests", value_name = "N", default_value_t = server::DEFAULT_MAX_REQUESTS)]
    web_max_requests: usize,
    /// Enable the lifecycle endpoint: POST or PUT /-/reload re-reads the configuration
    /// (as SIGHUP does). Off by default, as in Prometheus.
    #[arg(long = "web.enable-lifecycle")]
    web_enable_lifecycle: bool,
    /// Log level: error, warn, info, debug, trace.
    #[arg(long = "log.level", value_name = "LEVEL", default_value = "info")]
    log_level: tracing::Level,
    /// Log format.
    #[arg(long = "log.format", value_name = "FORMAT", default_value = "logfmt")]
    log_format: LogFormat,
    /// procfs mount point, e.g. the host's /proc mounted elsewhere in a container.
    #[arg(long = "path.procfs", value_name = "DIR", default_value = kernfs::DEFAULT_PROCFS)]
    procfs: PathBuf,
    /// Lock the agent's memory (mlockall) so its code and heap never wait on a disk; needs
    /// CAP_IPC_LOCK or a large enough RLIMIT_MEMLOCK (the unit's LimitMEMLOCK=). When not
    /// allowed the agent logs a warning and runs unlocked. `--memory.lock=false` turns it off.
    #[arg(long = "memory.lock", value_name = "BOOL", default_value_t = true,
        action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    memory_lock: bool,
    /// sysfs mount point, e.g. the host's /sys mounted elsewhere in a container.
    #[arg(long = "path.sysfs", value_name = "DIR", default_value = kernfs::DEFAULT_SYSFS)]
    sysfs: PathBuf,
    /// Directory where the stall record is kept across restarts (created if missing;
    /// the unit's StateDirectory=). Without it, nothing is written.
    #[arg(long = "storage.path", value_name = "DIR")]
    storage_path: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Logfmt,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a configuration file, print a summary; exit 2 when invalid.
    CheckConfig { file: PathBuf },
    /// Run probe cycles in the foreground and print each operation's latency.
    Probe(ProbeArgs),
}

fn init_logging(level: tracing::Level, format: LogFormat) {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::filter::LevelFilter::from_level(level);
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Logfmt => registry
            .with(
                tracing_logfmt::builder()
                    .with_target(false)
                    .layer()
                    .with_writer(std::io::stderr),
            )
            .init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_target(false)
                    .flatten_event(true)
                    .with_writer(std::io::stderr),
            )
            .init(),
    }
}

/// Exit status for a refused configuration or bad arguments.
const EXIT_INVALID: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::CheckConfig { file }) => check_config(&file),
        Some(Command::Probe(args)) => probe::run(args),
        None => {
            init_logging(cli.log_level, cli.log_format);
            // First, before any thread exists (see resident.rs).
            resident::fixed_mmap_threshold();
            let memory_lock = resident::lock(cli.memory_lock);
            let (soft_before, soft) = files::raise_limit();
            if soft_before != soft {
                tracing::info!(
                    before = soft_before,
                    now = soft,
                    "open-file limit raised to the hard limit (one descriptor per probe lane)"
                );
            }
            // Also before any thread: it removes LISTEN_* from the environment.
            let sockets = match cli
                .web_systemd_socket
                .then(server::systemd_listeners)
                .transpose()
            {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("Error: {e}");
                    return ExitCode::from(EXIT_INVALID);
                }
            };
            let web = WebArgs {
                config_file: cli.web_config_file.as_deref(),
                max_requests: cli.web_max_requests,
                lifecycle: cli.web_enable_lifecycle,
            };
            let roots = Roots {
                proc_root: cli.procfs,
                sys_root: cli.sysfs,
            };
            let storage = cli.storage_path;
            match run_agent(
                cli.config.as_deref(),
                cli.listen_address.as_deref(),
                sockets,
                web,
                roots,
                memory_lock,
                storage,
            ) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("Error: {e:#}");
                    let invalid = e.downcast_ref::<ConfigError>().is_some()
                        || e.downcast_ref::<WebConfigError>().is_some();
                    ExitCode::from(if invalid { EXIT_INVALID } else { 1 })
                }
            }
        }
    }
}

fn check_config(file: &Path) -> ExitCode {
    match Config::load(file) {
        Ok(c) => {
            print!("{}: valid\n{c}", file.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("Error: {e}");
            ExitCode::from(EXIT_INVALID)
        }
    }
}

/// The `--web.*` flags besides the listen address.
struct WebArgs<'a> {
    config_file: Option<&'a Path>,
    max_requests: usize,
    lifecycle: bool,
}

fn run_agent(
    config: Option<&Path>,
    listen: Option<&str>,
    sockets: Option<Vec<std::net::TcpListener>>,
    web: WebArgs,
    roots: Roots,
    memory_lock: resident::Lock,
    storage: Option<PathBuf>,
) -> anyhow::Result<()> {
    let source = match config {
        Some(p) => config::Source::File(p.to_owned()),
        None => config::Source::Default,
    };
    let config = match source.load()? {
        (c, Some(file)) => {
            info!(file = %file.display(), "configuration loaded");
            c
        }
        (c, None) => {
            info!(
                "no --config and no {}: running the embedded default (probe /var/tmp, listen on 127.0.0.1:19858)",
                config::DEFAULT_CONFIG_PATH
            );
            c
        }
    };
    let listen = match (sockets, listen) {
        (Some(sockets), _) => {
            info!(
                sockets = sockets.len(),
                "--web.systemd-socket: serving on the sockets systemd passed; listen_address not used"
            );
            agent::Listen::Sockets(sockets)
        }
        (None, Some(a)) => agent::Listen::Address(a.parse().map_err(|_| {
            anyhow::Error::new(ConfigError::ListenFlag {
                value: a.to_owned(),
            })
        })?),
        (None, None) => agent::Listen::Address(config.listen_address),
    };
    let web_config = match web.config_file {
        Some(p) => {
            let c = WebConfig::load(p)?;
            info!(file = %p.display(), tls = c.tls_enabled(), basic_auth = c.auth_enabled(),
                "web configuration loaded");
            c
        }
        None => WebConfig::none(),
    };
    let limits = server::Limits {
        max_requests: web.max_requests,
        ..server::Limits::default()
    };
    let options = agent::Options {
        listen,
        roots,
        web: web_config,
        limits,
        lifecycle: web.lifecycle,
        memory_lock,
        storage,
    };
    agent::run(config, source, options)
}
