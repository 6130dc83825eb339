//! The YAML configuration: schema with defaults, loading, and validation into typed errors
//! that name the file, the line and the key.

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::{self, Deserializer};
use serde::Deserialize;

use crate::base::labels::{Mode, SyncKind};

/// Where the agent looks for its configuration when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/stallwatch/config.yaml";

/// The configuration used when no file exists: probe `/var/tmp`, listen on loopback.
/// `/var/tmp` is usually not a mount point of its own, so the mount check is off here.
pub const EMBEDDED_DEFAULT: &str = r#"
listen_address: "127.0.0.1:19858"
targets:
  - path: /var/tmp
    name: var_tmp
    require_mountpoint: false
"#;

/// Largest probe write; larger would make the probe itself the load.
const MAX_SIZE: u64 = 64 << 20;
/// Shortest probe interval; shorter would make the probe itself the load.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// A configuration that could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    // Not a `source`: the message already carries the reason, and `main` prints the
    // whole chain (`{:#}`), which would repeat it.
    #[error("{path}: cannot read: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// Syntax, type, unknown key or a value that does not parse: the parser's message
    /// names the key path, the line and the column.
    #[error("{path}: {}", parse_error(.error))]
    Syntax {
        path: PathBuf,
        error: yaml_serde::Error,
    },
    /// A setting that parses but is not allowed, with its key and, where found, its line.
    #[error("{path}: {error}")]
    Invalid { path: PathBuf, error: Invalid },
    /// `--web.listen-address`, which overrides the file's `listen_address`.
    #[error("--web.listen-address: {value:?} is not an IP:port address")]
    ListenFlag { value: String },
}

/// A value that does not parse: a duration, a size or a target path. The parser reports
/// it at the value's own line and column.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValueError {
    #[error("invalid duration {text:?} ({reason}); write e.g. 250ms, 10s, 2m")]
    Duration {
        text: String,
        reason: humantime::DurationError,
    },
    #[error("invalid duration {0:?}: must be greater than zero")]
    ZeroDuration(String),
    #[error("invalid size {0:?}; write e.g. 4096, 4KiB, 1MiB")]
    Size(String),
    #[error("invalid size {0:?}: must be greater than zero")]
    ZeroSize(String),
    #[error("path {0:?} is relative: target paths must be absolute")]
    RelativePath(String),
    #[error("path {0:?} contains `..`: write the path it means")]
    ParentDir(String),
}

/// A setting that parses but is not allowed. `key` is the key path (`targets[1].size`);
/// `line` the 1-based line of the setting where it could be found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("listen_address: {value:?} is not an IP:port address{}", at_line(*.line))]
    ListenAddress { value: String, line: Option<usize> },
    #[error(
        "telemetry_path: {value:?} must start with /, differ from {} and not be under /assets/, /api/stalls/ or /stalls/{}",
        RESERVED_PATHS.join(", "),
        at_line(*.line)
    )]
    TelemetryPath { value: String, line: Option<usize> },
    #[error("stall_log_size: {value} is out of range 1..=100000{}", at_line(*.line))]
    StallLogSize { value: i128, line: Option<usize> },
    #[error("{key}: at least one mode is required")]
    NoMode { key: String },
    #[error("{key}: mode {mode} is listed twice")]
    ModeTwice { key: String, mode: Mode },
    #[error("{key}: size {size} is larger than the maximum {MAX_SIZE} bytes")]
    SizeTooLarge { key: String, size: u64 },
    #[error("{key}: {interval:?} is shorter than the minimum {MIN_INTERVAL:?}")]
    IntervalTooShort { key: String, interval: Duration },
    #[error("targets: at least one target is required")]
    NoTarget,
    #[error("{key}.name: {name:?} must be non-empty printable text{}", at_line(*.line))]
    Name {
        key: String,
        name: String,
        line: Option<usize>,
    },
    #[error("{key}.path: {path:?} is already probed by targets[{other}]{}", at_line(*.line))]
    PathTwice {
        key: String,
        path: String,
        other: usize,
        line: Option<usize>,
    },
    #[error(
        "{key}.name: target name {name:?} is already used by targets[{other}]{}",
        at_line(*.line)
    )]
    NameTwice {
        key: String,
        name: String,
        other: usize,
        line: Option<usize>,
    },
    #[error(
        "{key}.rotate_size: {rotate_size} is smaller than size {size}: the append log could not hold one write{}",
        at_line(*.line)
    )]
    RotateSize {
        key: String,
        rotate_size: u64,
        size: u64,
        line: Option<usize>,
    },
}

/// Reads one scalar as text and parses it with `parse`. The check runs inside the visitor,
/// so the parser reports a bad value at its own line and column, not at its mapping.
struct TextVisitor<F> {
    expecting: &'static str,
    parse: F,
}

impl<T, F: FnOnce(&str) -> Result<T, ValueError>> de::Visitor<'_> for TextVisitor<F> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.expecting)
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<T, E> {
        (self.parse)(s).map_err(E::custom)
    }
}

/// A positive duration written as `250ms`, `10s`, `2m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(TextVisitor {
            expecting: "a duration such as 250ms, 10s or 2m",
            parse: |s: &str| parse_duration(s).map(Dur),
        })
    }
}

/// Parses a positive human duration (`250ms`, `10s`, `1m30s`).
pub fn parse_duration(s: &str) -> Result<Duration, ValueError> {
    let d = humantime::parse_duration(s.trim()).map_err(|reason| ValueError::Duration {
        text: s.to_owned(),
        reason,
    })?;
    if d.is_zero() {
        return Err(ValueError::ZeroDuration(s.to_owned()));
    }
    Ok(d)
}

/// A positive byte count written as `4096`, `4KiB`, `1MiB`, `4kB`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as 4096, 4KiB or 1MiB")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Size, E> {
                match n {
                    0 => self.visit_i64(0),
                    n => Ok(Size(n)),
                }
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Size, E> {
                match u64::try_from(n) {
                    Ok(n) if n > 0 => Ok(Size(n)),
                    _ => Err(E::custom(ValueError::ZeroSize(n.to_string()))),
                }
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Size, E> {
                parse_size(s).map(Size).map_err(E::custom)
            }
        }
        // A plain number arrives as an integer, `4KiB` as text.
        d.deserialize_any(V)
    }
}

/// Parses a positive size with an optional binary (`KiB`) or decimal (`kB`) unit.
pub fn parse_size(s: &str) -> Result<u64, ValueError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad = || ValueError::Size(s.to_owned());
    let n: u64 = num.parse().map_err(|_| bad())?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" | "K" => 1 << 10,
        "MiB" | "M" => 1 << 20,
        "GiB" | "G" => 1 << 30,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return Err(bad()),
    };
    let v = n.checked_mul(mult).ok_or_else(bad)?;
    if v == 0 {
        return Err(ValueError::ZeroSize(s.to_owned()));
    }
    Ok(v)
}

/// An integer setting of any sign and size, so that the range check, not the parser,
/// says what is wrong with `-5` or `10000000000000000000`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Count(i128);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer")
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Count, E> {
                Ok(Count(n.into()))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Count, E> {
                Ok(Count(n.into()))
            }
        }
        // `deserialize_i64` would refuse integers above i64::MAX before the visitor sees them.
        d.deserialize_any(V)
    }
}

/// An absolute path without `..` components.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AbsPath(PathBuf);

impl AbsPath {
    fn parse(s: &str) -> Result<AbsPath, ValueError> {
        let p = PathBuf::from(s);
        if !p.is_absolute() {
            return Err(ValueError::RelativePath(s.to_owned()));
        }
        if p.components().any(|c| c == std::path::Component::ParentDir) {
            return Err(ValueError::ParentDir(s.to_owned()));
        }
        Ok(AbsPath(p))
    }
}

impl<'de> Deserialize<'de> for AbsPath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(TextVisitor {
            expecting: "an absolute path",
            parse: AbsPath::parse,
        })
    }
}

// `expecting` names the mappings as the reader knows them, not by their Rust types.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping of settings")]
struct RawConfig {
    listen_address: Option<String>,
    telemetry_path: Option<String>,
    vm_interval: Option<Dur>,
    stall_threshold: Option<Dur>,
    stall_log_size: Option<Count>,
    #[serde(default)]
    defaults: RawDefaults,
    targets: Vec<RawTarget>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping of settings")]
struct RawDefaults {
    interval: Option<Dur>,
    modes: Option<Vec<Mode>>,
    size: Option<Size>,
    sync: Option<SyncKind>,
    require_mountpoint: Option<bool>,
    rotate_size: Option<Size>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping of target settings")]
struct RawTarget {
    path: AbsPath,
    name: Option<String>,
    interval: Option<Dur>,
    modes: Option<Vec<Mode>>,
    size: Option<Size>,
    sync: Option<SyncKind>,
    require_mountpoint: Option<bool>,
    stall_threshold: Option<Dur>,
    rotate_size: Option<Size>,
}

/// The validated configuration the agent runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub listen_address: SocketAddr,
    pub telemetry_path: String,
    pub vm_interval: Duration,
    pub stall_log_size: usize,
    pub targets: Vec<Target>,
}

/// One probed directory with its settings resolved (defaults merged in).
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub name: String,
    pub path: PathBuf,
    pub interval: Duration,
    pub modes: Vec<Mode>,
    pub size: u64,
    pub sync: SyncKind,
    pub require_mountpoint: bool,
    pub stall_threshold: Duration,
    /// The append probe's log is replaced by a new, empty one when the next write would
    /// take it past this size.
    pub rotate_size: u64,
}

/// Defaults of the per-target settings: a 10 s cadence keeps a probe's own load
/// negligible while still resolving minute-long stalls; 4 KiB is one page, the unit
/// that dirty throttling and writeback deal in.
pub mod defaults {
    use super::*;
    pub const LISTEN_ADDRESS: &str = "0.0.0.0:19858";
    pub const TELEMETRY_PATH: &str = "/metrics";
    pub const VM_INTERVAL: Duration = Duration::from_secs(1);
    pub const STALL_THRESHOLD: Duration = Duration::from_secs(1);
    pub const STALL_LOG_SIZE: usize = 256;
    pub const INTERVAL: Duration = Duration::from_secs(10);
    pub const MODES: [Mode; 2] = [Mode::Create, Mode::Overwrite];
    pub const SIZE: u64 = 4096;
    pub const SYNC: SyncKind = SyncKind::Fsync;
    pub const REQUIRE_MOUNTPOINT: bool = true;
    /// Large enough that rotation is rare (every 16384 cycles of 4 KiB, 4.5 h at 1 s),
    /// small enough to be nothing on a data disk; a database's WAL segment is 16-64 MiB.
    pub const ROTATE_SIZE: u64 = 64 << 20;
}

/// Paths the HTTP side serves itself; the telemetry path may not shadow them.
const RESERVED_PATHS: [&str; 6] = [
    "/",
    "/healthz",
    "/api/stalls",
    "/api/history",
    "/stalls",
    "/-/reload",
];

/// Where the configuration comes from, at start and at every reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `--config FILE`.
    File(PathBuf),
    /// No `--config`: `/etc/stallwatch/config.yaml` when it exists, else the embedded
    /// default.
    Default,
}

impl Source {
    /// Reads and validates the configuration; also says which file it came from (None:
    /// the embedded default).
    pub fn load(&self) -> Result<(Config, Option<PathBuf>), ConfigError> {
        let default = Path::new(DEFAULT_CONFIG_PATH);
        match self {
            Source::File(p) => Ok((Config::load(p)?, Some(p.clone()))),
            Source::Default if default.exists() => {
                Ok((Config::load(default)?, Some(default.to_owned())))
            }
            Source::Default => Ok((Config::embedded(), None)),
        }
    }
}

impl Config {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_owned(),
            error,
        })?;
        Config::parse(&text, path)
    }

    /// Validates YAML text; `path` only names the source in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let raw: RawConfig = yaml_serde::from_str(text).map_err(|error| ConfigError::Syntax {
            path: path.to_owned(),
            error,
        })?;
        resolve(raw, text).map_err(|error| ConfigError::Invalid {
            path: path.to_owned(),
            error,
        })
    }

    /// The embedded default configuration.
    pub fn embedded() -> Config {
        Config::parse(EMBEDDED_DEFAULT, Path::new("<embedded default>"))
            .expect("embedded default configuration is valid")
    }
}

/// Finds the 1-based line of the `nth` occurrence of `key: value` in the text, so that
/// errors found after parsing can still point at a line.
fn line_of(text: &str, key: &str, value: &str, nth: usize) -> Option<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            let l = l.trim_start().trim_start_matches("- ").trim_start();
            l.strip_prefix(key)
                .and_then(|r| r.trim_start().strip_prefix(':'))
                .map(|v| v.trim().trim_matches(|c| c == '"' || c == '\'') == value)
                .unwrap_or(false)
        })
        .nth(nth)
        .map(|(i, _)| i + 1)
}

/// The parser's message for a document it could not read or that does not fit the schema.
/// yaml_serde already writes `key.path: what is wrong at line L column C`; the one thing to
/// add is a position at the very start of the file, which it leaves out, and which is where
/// a wrong top-level key on line 1 or a document of the wrong type is reported.
fn parse_error(e: &yaml_serde::Error) -> String {
    match e.location() {
        Some(l) if l.line() == 1 && l.column() == 1 => format!("{e} at line 1 column 1"),
        _ => e.to_string(),
    }
}

/// ` at line L`, or nothing when the line was not found.
fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!(" at line {l}")).unwrap_or_default()
}

/// Name derived from a path: `/srv/raid0` → `srv_raid0`, `/` → `root`. Unique per path.
pub fn name_from_path(p: &Path) -> String {
    let s = p.to_string_lossy();
    let t = s.trim_matches('/');
    if t.is_empty() {
        "root".to_owned()
    } else {
        t.replace('/', "_")
    }
}

fn check_modes(modes: &[Mode], key: &str) -> Result<(), Invalid> {
    if modes.is_empty() {
        return Err(Invalid::NoMode {
            key: key.to_owned(),
        });
    }
    let mut seen = HashSet::new();
    for &mode in modes {
        if !seen.insert(mode) {
            return Err(Invalid::ModeTwice {
                key: key.to_owned(),
                mode,
            });
        }
    }
    Ok(())
}

fn check_size(size: Option<Size>, key: &str) -> Result<(), Invalid> {
    match size {
        Some(Size(size)) if size > MAX_SIZE => Err(Invalid::SizeTooLarge {
            key: key.to_owned(),
            size,
        }),
        _ => Ok(()),
    }
}

fn check_interval(d: Option<Dur>, key: &str) -> Result<(), Invalid> {
    match d {
        Some(Dur(interval)) if interval < MIN_INTERVAL => Err(Invalid::IntervalTooShort {
            key: key.to_owned(),
            interval,
        }),
        _ => Ok(()),
    }
}

fn resolve(raw: RawConfig, text: &str) -> Result<Config, Invalid> {
    let listen = raw
        .listen_address
        .as_deref()
        .unwrap_or(defaults::LISTEN_ADDRESS);
    let listen_address: SocketAddr = listen.parse().map_err(|_| Invalid::ListenAddress {
        value: listen.to_owned(),
        line: line_of(text, "listen_address", listen, 0),
    })?;
    let telemetry_path = raw
        .telemetry_path
        .unwrap_or_else(|| defaults::TELEMETRY_PATH.to_owned());
    if !telemetry_path.starts_with('/')
        || RESERVED_PATHS.contains(&telemetry_path.as_str())
        || telemetry_path.starts_with("/assets/")
        || telemetry_path.starts_with("/api/stalls/")
        || telemetry_path.starts_with("/stalls/")
    {
        return Err(Invalid::TelemetryPath {
            line: line_of(text, "telemetry_path", &telemetry_path, 0),
            value: telemetry_path,
        });
    }
    let stall_log_size = match raw.stall_log_size {
        None => defaults::STALL_LOG_SIZE,
        Some(Count(n)) if (1..=100_000).contains(&n) => n as usize,
        Some(Count(n)) => {
            return Err(Invalid::StallLogSize {
                value: n,
                line: line_of(text, "stall_log_size", &n.to_string(), 0),
            })
        }
    };
    let d = raw.defaults;
    if let Some(m) = &d.modes {
        check_modes(m, "defaults.modes")?;
    }
    check_size(d.size, "defaults.size")?;
    check_interval(d.interval, "defaults.interval")?;
    let threshold = raw
        .stall_threshold
        .map(|d| d.0)
        .unwrap_or(defaults::STALL_THRESHOLD);

    if raw.targets.is_empty() {
        return Err(Invalid::NoTarget);
    }
    let mut targets: Vec<Target> = Vec::with_capacity(raw.targets.len());
    for (i, t) in raw.targets.into_iter().enumerate() {
        let key = format!("targets[{i}]");
        if let Some(m) = &t.modes {
            check_modes(m, &format!("{key}.modes"))?;
        }
        check_size(t.size, &format!("{key}.size"))?;
        check_interval(t.interval, &format!("{key}.interval"))?;
        let path = t.path.0;
        let name = match t.name {
            Some(n) => {
                if n.is_empty() || n.chars().any(|c| c.is_control()) {
                    return Err(Invalid::Name {
                        line: line_of(text, "name", &n, 0),
                        key,
                        name: n,
                    });
                }
                n
            }
            None => name_from_path(&path),
        };
        if let Some(j) = targets.iter().position(|o| o.path == path) {
            let p = path.display().to_string();
            return Err(Invalid::PathTwice {
                line: line_of(text, "path", &p, 1),
                key,
                path: p,
                other: j,
            });
        }
        if let Some(j) = targets.iter().position(|o| o.name == name) {
            return Err(Invalid::NameTwice {
                line: line_of(text, "name", &name, 1),
                key,
                name,
                other: j,
            });
        }
        let size = t.size.or(d.size).map(|s| s.0).unwrap_or(defaults::SIZE);
        let rotate_size = t
            .rotate_size
            .or(d.rotate_size)
            .map(|s| s.0)
            .unwrap_or(defaults::ROTATE_SIZE);
        if rotate_size < size {
            return Err(Invalid::RotateSize {
                key,
                rotate_size,
                size,
                line: text
                    .lines()
                    .position(|l| l.trim_start().starts_with("rotate_size:"))
                    .map(|i| i + 1),
            });
        }
        targets.push(Target {
            name,
            path,
            rotate_size,
            interval: t
                .interval
                .or(d.interval)
                .map(|d| d.0)
                .unwrap_or(defaults::INTERVAL),
            modes: t
                .modes
                .or_else(|| d.modes.clone())
                .unwrap_or_else(|| defaults::MODES.to_vec()),
            size,
            sync: t.sync.or(d.sync).unwrap_or(defaults::SYNC),
            require_mountpoint: t
                .require_mountpoint
                .or(d.require_mountpoint)
                .unwrap_or(defaults::REQUIRE_MOUNTPOINT),
            stall_threshold: t.stall_threshold.map(|d| d.0).unwrap_or(threshold),
        });
    }
    Ok(Config {
        listen_address,
        telemetry_path,
        vm_interval: raw
            .vm_interval
            .map(|d| d.0)
            .unwrap_or(defaults::VM_INTERVAL),
        stall_log_size,
        targets,
    })
}

/// A human summary, printed by `check-config` and logged at start-up.
impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "listen {} path {} vm_interval {:?} stall_log_size {}",
            self.listen_address, self.telemetry_path, self.vm_interval, self.stall_log_size
        )?;
        for t in &self.targets {
            let modes: Vec<&str> = t.modes.iter().map(|m| m.as_str()).collect();
            writeln!(
                f,
                "target {} path {} every {:?} modes [{}] size {} sync {} stall_threshold {:?} require_mountpoint {}{}",
                t.name,
                t.path.display(),
                t.interval,
                modes.join(","),
                t.size,
                t.sync.as_str(),
                t.stall_threshold,
                t.require_mountpoint,
                if t.modes.contains(&Mode::Append) {
                    format!(" rotate_size {}", t.rotate_size)
                } else {
                    String::new()
                }
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strum::VariantArray;

    fn parse(y: &str) -> Result<Config, String> {
        Config::parse(y, Path::new("test.yaml")).map_err(|e| e.to_string())
    }

    #[test]
    fn minimal_gets_every_default() {
        let c = parse("targets:\n  - path: /srv/raid0\n").unwrap();
        assert_eq!(c.listen_address, "0.0.0.0:19858".parse().unwrap());
        assert_eq!(c.telemetry_path, "/metrics");
        assert_eq!(c.vm_interval, Duration::from_secs(1));
        assert_eq!(c.stall_log_size, 256);
        let t = &c.targets[0];
        assert_eq!(t.name, "srv_raid0");
        assert_eq!(t.path, PathBuf::from("/srv/raid0"));
        assert_eq!(t.interval, Duration::from_secs(10));
        assert_eq!(t.modes, vec![Mode::Create, Mode::Overwrite]);
        assert_eq!(t.size, 4096);
        assert_eq!(t.sync, SyncKind::Fsync);
        assert!(t.require_mountpoint);
        assert_eq!(t.stall_threshold, Duration::from_secs(1));
    }

    #[test]
    fn defaults_section_and_target_overrides() {
        let c = parse(
            r#"
listen_address: "127.0.0.1:9999"
telemetry_path: /m
vm_interval: 250ms
stall_threshold: 2s
stall_log_size: 10
defaults:
  interval: 5s
  modes: [overwrite]
  size: 8KiB
  sync: fdatasync
  require_mountpoint: false
targets:
  - path: /a
  - path: /var/lib/postgresql
    name: pg
    modes: [overwrite, direct, replace, create]
    interval: 2m
    size: 1MiB
    sync: fsync
    require_mountpoint: true
    stall_threshold: 500ms
"#,
        )
        .unwrap();
        assert_eq!(c.listen_address, "127.0.0.1:9999".parse().unwrap());
        assert_eq!(c.telemetry_path, "/m");
        assert_eq!(c.vm_interval, Duration::from_millis(250));
        assert_eq!(c.stall_log_size, 10);
        let a = &c.targets[0];
        assert_eq!(
            (a.interval, a.size, a.sync, a.require_mountpoint),
            (Duration::from_secs(5), 8192, SyncKind::Fdatasync, false)
        );
        assert_eq!(a.modes, vec![Mode::Overwrite]);
        assert_eq!(a.stall_threshold, Duration::from_secs(2));
        let pg = &c.targets[1];
        assert_eq!(pg.name, "pg");
        assert_eq!(pg.interval, Duration::from_secs(120));
        assert_eq!(pg.size, 1 << 20);
        assert_eq!(pg.sync, SyncKind::Fsync);
        assert!(pg.require_mountpoint);
        assert_eq!(pg.stall_threshold, Duration::from_millis(500));
        assert_eq!(pg.modes.len(), 4);
    }

    #[test]
    fn sizes_and_durations() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size("4kB").unwrap(), 4000);
        assert_eq!(parse_size("2MiB").unwrap(), 2 << 20);
        assert!(parse_size("0").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("4 parsecs").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("10").is_err());
    }

    #[test]
    fn embedded_default_is_valid() {
        let c = Config::embedded();
        assert_eq!(c.listen_address, "127.0.0.1:19858".parse().unwrap());
        assert_eq!(c.targets[0].path, PathBuf::from("/var/tmp"));
    }

    #[test]
    fn example_file_is_valid() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("config.example.yaml");
        Config::load(&p).unwrap();
    }

    /// Each invalid file with the words its message must contain: the key and the line.
    #[test]
    fn invalid_files_name_key_and_line() {
        let cases: &[(&str, &[&str])] = &[
            ("targets: [", &["line 2", "while parsing"]),
            ("foo: 1\ntargets: []\n", &["unknown field `foo`", "line 1"]),
            (
                "targets:\n  - path: /a\n    intervall: 5s\n",
                &["targets[0]", "unknown field `intervall`", "line 3"],
            ),
            (
                "defaults:\n  colour: red\ntargets:\n  - path: /a\n",
                &["defaults", "unknown field `colour`", "line 2"],
            ),
            ("listen_address: 1\n", &["missing field `targets`"]),
            ("targets: []\n", &["targets: at least one target"]),
            (
                "targets:\n  - path: relative/dir\n",
                &["targets[0].path", "relative", "line 2"],
            ),
            (
                "targets:\n  - path: /a/../b\n",
                &["targets[0].path", "..", "line 2"],
            ),
            (
                "targets:\n  - name: x\n",
                &["targets[0]", "missing field `path`", "line 2"],
            ),
            (
                "targets:\n  - path: /a\n    interval: 0s\n",
                &["targets[0].interval", "greater than zero", "line 3"],
            ),
            (
                "targets:\n  - path: /a\n    interval: -5s\n",
                &["targets[0].interval", "invalid duration", "line 3"],
            ),
            (
                "targets:\n  - path: /a\n    interval: 10ms\n",
                &["targets[0].interval", "minimum"],
            ),
            (
                "targets:\n  - path: /a\n    size: 0\n",
                &["targets[0].size", "greater than zero", "line 3"],
            ),
            (
                "targets:\n  - path: /a\n    size: -4096\n",
                &["targets[0].size", "greater than zero", "line 3"],
            ),
            (
                "targets:\n  - path: /a\n    size: 4 parsecs\n",
                &["targets[0].size", "invalid size", "line 3"],
            ),
            (
                "targets:\n  - path: /a\n    size: 1GiB\n",
                &["targets[0].size", "maximum"],
            ),
            (
                "targets:\n  - path: /a\n    modes: [create, fsync]\n",
                &["targets[0].modes", "unknown variant `fsync`", "line 3"],
            ),
            (
                "targets:\n  - path: /a\n    modes: []\n",
                &["targets[0].modes", "at least one mode"],
            ),
            (
                "targets:\n  - path: /a\n    modes: [create, create]\n",
                &["targets[0].modes", "twice"],
            ),
            (
                "targets:\n  - path: /a\n    sync: sometimes\n",
                &["targets[0].sync", "unknown variant `sometimes`", "line 3"],
            ),
            (
                "targets:\n  - path: /a\n    require_mountpoint: maybe\n",
                &["targets[0].require_mountpoint", "line 3"],
            ),
            (
                "targets:\n  - path: /a\n    name: x\n  - path: /b\n    name: x\n",
                &["targets[1].name", "already used", "line 5"],
            ),
            (
                "targets:\n  - path: /a\n  - path: /a\n",
                &["targets[1].path", "already probed", "line 3"],
            ),
            (
                "listen_address: nowhere\ntargets:\n  - path: /a\n",
                &["listen_address", "not an IP:port", "line 1"],
            ),
            (
                "listen_address: \"10.0.0.1:99999\"\ntargets:\n  - path: /a\n",
                &["listen_address", "line 1"],
            ),
            (
                "telemetry_path: metrics\ntargets:\n  - path: /a\n",
                &["telemetry_path", "line 1"],
            ),
            (
                "telemetry_path: /healthz\ntargets:\n  - path: /a\n",
                &["telemetry_path", "line 1"],
            ),
            (
                "telemetry_path: /api/history\ntargets:\n  - path: /a\n",
                &["telemetry_path", "line 1"],
            ),
            (
                "telemetry_path: /assets/page.js\ntargets:\n  - path: /a\n",
                &["telemetry_path", "line 1"],
            ),
            (
                "telemetry_path: /api/stalls/{id}\ntargets:\n  - path: /a\n",
                &["telemetry_path", "/api/stalls/", "line 1"],
            ),
            (
                "telemetry_path: /stalls\ntargets:\n  - path: /a\n",
                &["telemetry_path", "/stalls", "line 1"],
            ),
            (
                "telemetry_path: /stalls/019ae3f2c1b0-7f3a09c2-42\ntargets:\n  - path: /a\n",
                &["telemetry_path", "/stalls/", "line 1"],
            ),
            (
                "stall_log_size: 0\ntargets:\n  - path: /a\n",
                &["stall_log_size", "out of range", "line 1"],
            ),
            (
                "vm_interval: soon\ntargets:\n  - path: /a\n",
                &["vm_interval", "invalid duration", "line 1"],
            ),
            (
                "stall_threshold: 0ms\ntargets:\n  - path: /a\n",
                &["stall_threshold", "greater than zero", "line 1"],
            ),
            ("targets:\n  path: /a\n", &["targets", "sequence", "line 2"]),
            ("targets:\n  - path: /a\n\tname: tab\n", &["line 3"]),
        ];
        assert!(cases.len() >= 20);
        for (yaml, words) in cases {
            let err = parse(yaml).expect_err(yaml);
            assert!(err.starts_with("test.yaml: "), "{yaml:?} gave {err}");
            for w in *words {
                assert!(err.contains(w), "{yaml:?} gave {err:?}, missing {w:?}");
            }
        }
    }

    /// serde reads the enums by `rename_all`, the rest of the agent by strum's names.
    #[test]
    fn enum_names_agree_with_serde() {
        for m in Mode::VARIANTS {
            assert_eq!(yaml_serde::from_str::<Mode>(m.as_str()).unwrap(), *m);
            assert_eq!(m.as_str().parse::<Mode>(), Ok(*m));
            assert_eq!(m.to_string(), m.as_str());
        }
        for k in SyncKind::VARIANTS {
            assert_eq!(yaml_serde::from_str::<SyncKind>(k.as_str()).unwrap(), *k);
            assert_eq!(k.as_str().parse::<SyncKind>(), Ok(*k));
        }
        assert_eq!(
            "bogus".parse::<Mode>().unwrap_err().to_string(),
            "unknown mode \"bogus\": expected create, overwrite, direct, replace or append"
        );
        assert_eq!(
            "fsink".parse::<SyncKind>().unwrap_err().to_string(),
            "unknown sync \"fsink\": expected fsync or fdatasync"
        );
    }

    /// A bad value is reported at its own line and column, under its full key path.
    #[test]
    fn parse_errors_point_at_the_value() {
        let cases: &[(&str, &str)] = &[
            (
                "targets:\n  - path: /a\n    interval: 0s\n",
                "test.yaml: targets[0].interval: invalid duration \"0s\": must be greater than zero at line 3 column 15",
            ),
            (
                "targets:\n  - path: /a\n    modes: [create, fsync]\n",
                "test.yaml: targets[0].modes[1]: unknown variant `fsync`, expected one of `create`, `overwrite`, `direct`, `replace`, `append` at line 3 column 21",
            ),
            (
                "targets:\n  - path: /a\n    size: 4.5\n",
                "test.yaml: targets[0].size: invalid type: floating point `4.5`, expected a size such as 4096, 4KiB or 1MiB at line 3 column 11",
            ),
            (
                "targets:\n  - path: /a\ncolour: red\n",
                "test.yaml: unknown field `colour`, expected one of `listen_address`, `telemetry_path`, `vm_interval`, `stall_threshold`, `stall_log_size`, `defaults`, `targets` at line 3 column 1",
            ),
            (
                "colour: red\n",
                "test.yaml: unknown field `colour`, expected one of `listen_address`, `telemetry_path`, `vm_interval`, `stall_threshold`, `stall_log_size`, `defaults`, `targets` at line 1 column 1",
            ),
            (
                "stall_log_size: 18446744073709551615\ntargets:\n  - path: /a\n",
                "test.yaml: stall_log_size: 18446744073709551615 is out of range 1..=100000 at line 1",
            ),
        ];
        for (yaml, want) in cases {
            assert_eq!(parse(yaml).unwrap_err(), *want, "{yaml:?}");
        }
    }

    #[test]
    fn missing_file_names_the_file() {
        let e = Config::load(Path::new("/nonexistent/stallwatch.yaml")).unwrap_err();
        assert!(e
            .to_string()
            .contains("/nonexistent/stallwatch.yaml: cannot read"));
    }
}
