//! ember's configuration: a documented YAML file, validated once into typed settings.
//!
//! `config/ember.yaml` is the default and is embedded in the binary; a user file
//! is layered over it key by key, so every key has exactly one documented default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// The default configuration, as shipped in `config/ember.yaml`.
pub const DEFAULT_YAML: &str = include_str!("../../config/ember.yaml");

/// Why a configuration was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// YAML syntax or schema error, with its position.
    #[error("{origin}:{line}:{column}: {message}")]
    Parse {
        /// File name (or `<default>`).
        origin: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// A value that parses but makes no sense.
    #[error("{origin}: {key}: {message}")]
    Invalid {
        /// File name.
        origin: String,
        /// Dotted key path.
        key: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// The whole configuration.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// How samples are taken.
    pub sampling: Sampling,
    /// How samples are grouped in time.
    pub window: Window,
    /// Where windows are written.
    pub output: Output,
    /// The local HTTP server.
    pub server: Server,
    /// Caps on every cache and queue.
    pub limits: Limits,
    /// Logging.
    pub log: Log,
}

/// `sampling:` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Sampling {
    /// Samples per second per CPU.
    pub frequency_hz: u64,
    /// Perf event driving the sampler.
    pub event: SampleEvent,
    /// Sample the idle task too.
    pub include_idle: bool,
    /// BPF ring buffer size in bytes.
    pub ring_buffer_bytes: u32,
    /// Only these tgids; empty means all.
    pub pids: Vec<u32>,
}

/// The perf event that triggers a sample.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum SampleEvent {
    /// Software CPU clock: works everywhere.
    CpuClock,
    /// Hardware CPU cycles, when the PMU provides them.
    Cycles,
}

/// `window:` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// Length of one window.
    #[serde(deserialize_with = "duration")]
    pub duration: Duration,
}

/// `output:` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Output {
    /// Directory for window files.
    pub data_dir: PathBuf,
    /// Window files kept at most.
    pub keep_windows: usize,
    /// Bytes of window files kept at most.
    pub keep_bytes: u64,
}

/// `server:` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Server {
    /// Serve HTTP at all.
    pub enabled: bool,
    /// Listen address.
    pub listen: SocketAddr,
}

/// `limits:` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Processes tracked.
    pub max_processes: usize,
    /// Object files held open.
    pub max_objects: usize,
    /// Distinct stacks per window.
    pub max_stacks_per_window: usize,
    /// Symbolized addresses cached.
    pub symbol_cache_entries: usize,
    /// Sample batches queued between capture and aggregation.
    pub sample_queue_batches: usize,
}

/// `log:` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Log {
    /// Default log level.
    pub level: String,
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(|e| serde::de::Error::custom(format!("{s:?}: {e}")))
}

impl Default for Config {
    fn default() -> Self {
        // The embedded default is checked by a unit test, so this cannot fail in a release.
        Self::from_yaml(DEFAULT_YAML, "<default>").unwrap_or_else(|e| panic!("embedded default config: {e}"))
    }
}

impl Config {
    /// Loads `path` layered over the embedded default.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_yaml(&text, &path.display().to_string())
    }

    /// Parses YAML text layered over the embedded default; `origin` names it in errors.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let parse_err = |origin: &str, e: serde_yaml::Error| {
            let (line, column) = e.location().map(|l| (l.line(), l.column())).unwrap_or((1, 1));
            ConfigError::Parse {
                origin: origin.to_owned(),
                line,
                column,
                message: strip_location(&e.to_string()),
            }
        };
        let mut base: serde_yaml::Value =
            serde_yaml::from_str(DEFAULT_YAML).map_err(|e| parse_err("<default>", e))?;
        let user: serde_yaml::Value = serde_yaml::from_str(text).map_err(|e| parse_err(origin, e))?;
        if !user.is_null() {
            if !user.is_mapping() {
                return Err(ConfigError::Parse {
                    origin: origin.to_owned(),
                    line: 1,
                    column: 1,
                    message: "the configuration must be a mapping of sections".into(),
                });
            }
            merge(&mut base, user);
        }
        // Parse the user's text on its own first, so schema errors (unknown keys, wrong
        // types) point at its lines rather than at the merged document.
        if let Err(e) = check_partial(text) {
            return Err(parse_err(origin, e));
        }
        let cfg: Config = serde_yaml::from_value(base).map_err(|e| parse_err(origin, e))?;
        cfg.validate(origin)?;
        Ok(cfg)
    }

    fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let invalid = |key, message: &str| {
            Err(ConfigError::Invalid {
                origin: origin.to_owned(),
                key,
                message: message.to_owned(),
            })
        };
        let s = &self.sampling;
        if !(1..=10_000).contains(&s.frequency_hz) {
            return invalid("sampling.frequency_hz", "must be between 1 and 10000");
        }
        if !s.ring_buffer_bytes.is_power_of_two() || s.ring_buffer_bytes < 4096 {
            return invalid("sampling.ring_buffer_bytes", "must be a power of two of at least 4096");
        }
        if self.window.duration < Duration::from_millis(100) {
            return invalid("window.duration", "must be at least 100ms");
        }
        if self.output.keep_windows == 0 {
            return invalid("output.keep_windows", "must be at least 1");
        }
        let l = &self.limits;
        for (key, v) in [
            ("limits.max_processes", l.max_processes),
            ("limits.max_objects", l.max_objects),
            ("limits.max_stacks_per_window", l.max_stacks_per_window),
            ("limits.symbol_cache_entries", l.symbol_cache_entries),
            ("limits.sample_queue_batches", l.sample_queue_batches),
        ] {
            if v == 0 {
                return invalid(key, "must be at least 1");
            }
        }
        Ok(())
    }
}

/// Every section with every key optional: used only to check a user file's shape
/// against its own line numbers.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Partial {
    sampling: Option<PartialSection<Sampling>>,
    window: Option<PartialSection<Window>>,
    output: Option<PartialSection<Output>>,
    server: Option<PartialSection<Server>>,
    limits: Option<PartialSection<Limits>>,
    log: Option<PartialSection<Log>>,
}

/// A section checked key by key against the full type, with defaults filled in.
struct PartialSection<T>(std::marker::PhantomData<T>);

impl<'de, T> Deserialize<'de> for PartialSection<T>
where
    T: for<'a> Deserialize<'a> + SectionDefault,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let user = serde_yaml::Value::deserialize(d)?;
        let mut base = T::default_value();
        merge(&mut base, user);
        T::deserialize(base).map_err(serde::de::Error::custom)?;
        Ok(Self(std::marker::PhantomData))
    }
}

trait SectionDefault {
    fn default_value() -> serde_yaml::Value;
}

macro_rules! section_default {
    ($($ty:ty => $key:literal),*) => {$(
        impl SectionDefault for $ty {
            fn default_value() -> serde_yaml::Value {
                serde_yaml::from_str::<serde_yaml::Value>(DEFAULT_YAML)
                    .ok()
                    .and_then(|v| v.get($key).cloned())
                    .unwrap_or(serde_yaml::Value::Null)
            }
        }
    )*};
}
section_default!(Sampling => "sampling", Window => "window", Output => "output",
    Server => "server", Limits => "limits", Log => "log");

fn check_partial(text: &str) -> Result<(), serde_yaml::Error> {
    let _: Option<Partial> = serde_yaml::from_str(text)?;
    Ok(())
}

/// Overlays `over` onto `base`, mapping by mapping; scalars and lists replace.
fn merge(base: &mut serde_yaml::Value, over: serde_yaml::Value) {
    match (base, over) {
        (serde_yaml::Value::Mapping(b), serde_yaml::Value::Mapping(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

/// serde_yaml appends " at line L column C" to messages; the position is reported separately.
fn strip_location(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_owned(),
        None => msg.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_parses_and_validates() {
        let c = Config::default();
        assert_eq!(c.sampling.frequency_hz, 99);
        assert_eq!(c.window.duration, Duration::from_secs(10));
        assert_eq!(c.server.listen.ip().to_string(), "127.0.0.1");
        assert!(c.sampling.pids.is_empty());
    }

    #[test]
    fn user_file_overrides_single_keys() {
        let c = Config::from_yaml("window:\n  duration: 2s\nsampling:\n  frequency_hz: 49\n", "t.yaml")
            .expect("valid");
        assert_eq!(c.window.duration, Duration::from_secs(2));
        assert_eq!(c.sampling.frequency_hz, 49);
        assert_eq!(c.output.keep_windows, 360, "untouched keys keep their default");
    }

    #[test]
    fn unknown_key_points_at_its_line() {
        let err = Config::from_yaml("window:\n  duration: 2s\n  durration: 3s\n", "t.yaml").unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("t.yaml:3:"), "{msg}");
        assert!(msg.contains("durration"), "{msg}");
    }

    #[test]
    fn unknown_section_points_at_its_line() {
        let err = Config::from_yaml("# c\n\nsamplin:\n  frequency_hz: 1\n", "t.yaml").unwrap_err();
        assert!(err.to_string().starts_with("t.yaml:3:"), "{err}");
    }

    #[test]
    fn wrong_type_points_at_its_line() {
        let err = Config::from_yaml("sampling:\n  frequency_hz: fast\n", "t.yaml").unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("t.yaml:2:"), "{msg}");
    }

    #[test]
    fn bad_duration_is_explained() {
        let err = Config::from_yaml("window:\n  duration: soon\n", "t.yaml").unwrap_err();
        assert!(err.to_string().contains("soon"), "{err}");
        assert!(err.to_string().starts_with("t.yaml:2:"), "{err}");
    }

    #[test]
    fn syntax_error_has_position() {
        let err = Config::from_yaml("window: [1,\n", "t.yaml").unwrap_err();
        assert!(matches!(err, ConfigError::Parse { line: 2, .. } | ConfigError::Parse { line: 1, .. }), "{err}");
    }

    #[test]
    fn invalid_values_name_the_key() {
        let err = Config::from_yaml("sampling:\n  ring_buffer_bytes: 5000\n", "t.yaml").unwrap_err();
        assert!(err.to_string().contains("sampling.ring_buffer_bytes"), "{err}");
        let err = Config::from_yaml("limits:\n  max_objects: 0\n", "t.yaml").unwrap_err();
        assert!(err.to_string().contains("limits.max_objects"), "{err}");
    }

    #[test]
    fn empty_file_is_the_default() {
        assert_eq!(Config::from_yaml("", "t.yaml").expect("valid"), Config::default());
    }
}
