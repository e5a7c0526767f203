//! `symbols:` settings: how object files are read for names, and where debuginfod is asked.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{duration, size};

/// `symbols:` keys: how object files are read for names.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Symbols {
    /// Memory of the parsed symbol tables kept between windows; the least recently used go.
    #[serde(deserialize_with = "size")]
    pub cache_bytes: u64,
    /// Bytes read from one object (headers, symbol and string tables, inflated sections).
    #[serde(deserialize_with = "size")]
    pub max_read_bytes: u64,
    /// Bytes of one section, as stored and as declared when compressed.
    #[serde(deserialize_with = "size")]
    pub max_section_bytes: u64,
    /// Host directories searched by build id (`DIR/.build-id/ab/cdef….debug`) for the
    /// symbols of stripped objects; debug links named inside objects are never followed.
    pub debug_dirs: Vec<PathBuf>,
    /// The same search inside the root of the process that maps the object (a container's
    /// image), after the host's: confined to that root, symlinks refused.
    pub root_debug_dirs: Vec<PathBuf>,
    /// debuginfod servers asked for the debug file of a stripped object no debug directory
    /// has (`https://`; `http://` only with `debuginfod_allow_http`): the build ids of the
    /// host's and its containers' stripped objects go to them. Empty: none (nothing leaves
    /// the host unless asked), unless `debuginfod_urls_from_env`.
    pub debuginfod_urls: Vec<String>,
    /// With `debuginfod_urls` empty, ask the servers of `DEBUGINFOD_URLS` (space-separated).
    /// Off by default: distributions export it in every login shell, and `ember run` from
    /// such a shell must not send build ids to a third party nobody chose.
    pub debuginfod_urls_from_env: bool,
    /// Allow `http://` servers (build ids and debug files in clear text, unauthenticated).
    pub debuginfod_allow_http: bool,
    /// PEM CA bundle the `https://` servers are verified against; empty: the system's roots.
    pub debuginfod_ca_file: PathBuf,
    /// Time allowed for one request to one server, body included.
    #[serde(deserialize_with = "duration")]
    pub debuginfod_timeout: Duration,
    /// Bytes of fetched debug files kept on disk (under `output.data_dir`/debuginfod);
    /// the oldest go first.
    #[serde(deserialize_with = "size")]
    pub debuginfod_cache_bytes: u64,
    /// Bytes of one fetched debug file: a larger answer is cut off and refused.
    #[serde(deserialize_with = "size")]
    pub debuginfod_max_file_bytes: u64,
    /// The debuginfod disk cache, searched after the debug directories (set by the agent
    /// when servers are configured; not a key).
    #[serde(skip)]
    pub fetched_dir: Option<PathBuf>,
    /// Read DWARF (in the object or its debug file) for inlined frames and source lines.
    pub dwarf: bool,
    /// DWARF held between windows, all objects together: the units loaded (only those
    /// holding sampled addresses) and an estimate of what was parsed of them; the least
    /// recently used object is let go first.
    #[serde(deserialize_with = "size")]
    pub dwarf_bytes: u64,
}

impl Default for Symbols {
    fn default() -> Self {
        Self {
            cache_bytes: 16 << 20,
            max_read_bytes: 64 << 20,
            max_section_bytes: 48 << 20,
            debug_dirs: vec![PathBuf::from("/usr/lib/debug")],
            root_debug_dirs: vec![PathBuf::from("/usr/lib/debug")],
            debuginfod_urls: Vec::new(),
            debuginfod_urls_from_env: false,
            debuginfod_allow_http: false,
            debuginfod_ca_file: PathBuf::new(),
            debuginfod_timeout: Duration::from_secs(30),
            debuginfod_cache_bytes: 1 << 30,
            debuginfod_max_file_bytes: 256 << 20,
            fetched_dir: None,
            dwarf: true,
            dwarf_bytes: 12 << 20,
        }
    }
}
