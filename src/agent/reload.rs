//! Reloading the configuration without a restart, on SIGHUP or `POST /-/reload`
//! (`--web.enable-lifecycle`), as Prometheus does: an invalid file is refused and the
//! running configuration kept; targets added, removed and changed take effect, unchanged
//! ones keep their lanes, histograms and stall log.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use prometheus::{Gauge, IntGauge, Registry};
use tracing::{info, warn};

use crate::base::sync::lock;
use crate::config::{Config, ConfigError, Source};
use crate::probe::supervisor::{Changes, SpawnError, Supervisor};
use crate::probe::Targets;

/// Why a reload did not take effect; the running configuration stays.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("shutting down")]
    ShuttingDown,
    /// The file was refused.
    #[error("{0}")]
    Config(ConfigError),
    /// The new targets could not be started.
    #[error("{0}")]
    Apply(SpawnError),
}

/// The running configuration, its source and the lanes it started.
pub struct Reloader {
    source: Source,
    running: Mutex<Running>,
    targets: Arc<Targets>,
    successful: IntGauge,
    success_time: Gauge,
}

struct Running {
    config: Config,
    /// None once shut down.
    supervisor: Option<Supervisor>,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

impl Reloader {
    /// Starts `config`'s targets under `supervisor`; registers the reload metrics, which
    /// count the start as the first successful load (as Prometheus does).
    pub fn start(
        source: Source,
        config: Config,
        mut supervisor: Supervisor,
        registry: &Registry,
    ) -> anyhow::Result<Reloader> {
        supervisor.apply(&config.targets)?;
        let successful = IntGauge::new(
            "stallwatch_config_last_reload_successful",
            "1 when the last configuration reload (or the start) succeeded, 0 when the file was refused and the running configuration kept.",
        )?;
        let success_time = Gauge::new(
            "stallwatch_config_last_reload_success_timestamp_seconds",
            "Unix time of the last successful configuration load: the start, or a reload.",
        )?;
        registry.register(Box::new(successful.clone()))?;
        registry.register(Box::new(success_time.clone()))?;
        successful.set(1);
        success_time.set(unix_now());
        Ok(Reloader {
            source,
            targets: supervisor.targets(),
            running: Mutex::new(Running {
                config,
                supervisor: Some(supervisor),
            }),
            successful,
            success_time,
        })
    }

    /// The targets probed now.
    pub fn targets(&self) -> Arc<Targets> {
        Arc::clone(&self.targets)
    }

    /// Re-reads the configuration and applies it. Returns what changed, or why the file
    /// was refused (the running configuration then stays).
    pub fn reload(&self) -> Result<Changes, ReloadError> {
        let mut running = lock(&self.running);
        let loaded = self.source.load();
        let Some(supervisor) = running.supervisor.as_mut() else {
            return Err(ReloadError::ShuttingDown);
        };
        let (config, file) = match loaded {
            Ok(x) => x,
            Err(e) => {
                self.successful.set(0);
                warn!(error = %e, "configuration reload refused; the running configuration is kept");
                return Err(ReloadError::Config(e));
            }
        };
        let changes = match supervisor.apply(&config.targets) {
            Ok(c) => c,
            Err(e) => {
                self.successful.set(0);
                let e = ReloadError::Apply(e);
                warn!(error = %e, "configuration reload failed");
                return Err(e);
            }
        };
        let old = &running.config;
        let restart_only = [
            (
                "listen_address",
                old.listen_address != config.listen_address,
            ),
            (
                "telemetry_path",
                old.telemetry_path != config.telemetry_path,
            ),
            ("vm_interval", old.vm_interval != config.vm_interval),
            (
                "stall_log_size",
                old.stall_log_size != config.stall_log_size,
            ),
        ];
        for (key, differs) in restart_only {
            if differs {
                warn!(
                    setting = key,
                    "changed in the configuration file; takes effect at the next restart"
                );
            }
        }
        self.successful.set(1);
        self.success_time.set(unix_now());
        let source = file.map_or("the embedded default".to_owned(), |f| {
            f.display().to_string()
        });
        info!(file = %source, changes = %changes, "configuration reloaded");
        // The settings that need a restart stay as they run.
        let mut kept = config;
        kept.listen_address = old.listen_address;
        kept.telemetry_path = old.telemetry_path.clone();
        kept.vm_interval = old.vm_interval;
        kept.stall_log_size = old.stall_log_size;
        running.config = kept;
        Ok(changes)
    }

    /// Stops every lane and waits for them (see [`Supervisor::shutdown`]). A reload still
    /// running (its file read blocked on a hung disk, say) is waited for a few seconds at
    /// most: the lanes are told to stop without its lock.
    pub fn shutdown(&self) {
        for t in self.targets.current().iter() {
            t.stop();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        loop {
            match self.running.try_lock() {
                Ok(mut r) => {
                    let supervisor = r.supervisor.take();
                    drop(r);
                    if let Some(s) = supervisor {
                        s.shutdown();
                    }
                    return;
                }
                Err(std::sync::TryLockError::Poisoned(p)) => {
                    let supervisor = p.into_inner().supervisor.take();
                    if let Some(s) = supervisor {
                        s.shutdown();
                    }
                    return;
                }
                Err(std::sync::TryLockError::WouldBlock) => {
                    if std::time::Instant::now() >= deadline {
                        warn!("a configuration reload is still running; exiting without waiting for it");
                        return;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
        }
    }
}
