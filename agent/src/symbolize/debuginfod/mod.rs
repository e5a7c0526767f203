//! Debug files by build id from debuginfod servers (`symbols.debuginfod_urls`), for
//! stripped objects that no debug directory has.
//!
//! The symbolizer never waits for the network: it asks ([`Debuginfod::ask`], a bounded
//! `try_send`, counted when full) and goes on with the object unnamed. A worker thread of
//! its own ([`fetch`]) asks the servers in turn, each request under
//! `symbols.debuginfod_timeout`, streams the answer into the disk cache ([`store`]) under
//! `symbols.debuginfod_max_file_bytes`, and keeps it only if it is an ELF file with the
//! build id asked for. What comes back is hostile like any container file: later it is
//! read by the same bounded ELF reader, as one more `.build-id` debug directory
//! ([`Debuginfod::dir`]). Finished build ids come back on a bounded channel
//! ([`Debuginfod::arrived`]) so the symbolizer can drop what it cached of their objects and
//! name them from the next window on. Failures are remembered per build id with a backoff
//! (an hour after a 404, 30 s doubling for the rest), so a missing file costs one request
//! an hour, not one a window.

mod fetch;
mod store;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use crate::config::Symbols;
use crate::metrics::{Cache, DebuginfodResult, Metrics};
use crate::model::FileId;

/// Build ids waiting for the worker.
const QUEUE: usize = 256;
/// Build ids remembered (in flight, or failed and backing off); past it the oldest
/// verdicts are forgotten.
const MAX_TRACKED: usize = 4096;
/// After a 404 from every server.
const NOT_FOUND_BACKOFF: Duration = Duration::from_secs(3600);
/// After another failure, doubled per failure up to [`NOT_FOUND_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(30);
/// Files remembered per build id asked for (their caches are dropped when it arrives).
const MAX_FILES_PER_ID: usize = 16;

/// A build id, as the ELF note holds it.
pub type BuildId = Vec<u8>;

/// Where a build id stands, and the files waiting for it.
#[derive(Debug, Clone)]
struct Entry {
    asked: Asked,
    files: Vec<FileId>,
}

/// What the worker made of one build id.
#[derive(Debug)]
struct Done {
    id: BuildId,
    result: DebuginfodResult,
}

/// Where a build id stands.
#[derive(Debug, Clone, Copy)]
enum Asked {
    /// With the worker.
    InFlight,
    /// Failed `failures` times; not asked again before `until`.
    Failed { until: Instant, failures: u32 },
}

/// The symbolizer's side: asks for build ids, learns which arrived.
pub struct Debuginfod {
    dir: PathBuf,
    requests: SyncSender<BuildId>,
    done: Receiver<Done>,
    asked: HashMap<BuildId, Entry>,
    metrics: Metrics,
}

impl Debuginfod {
    /// Starts the worker for the servers `settings` names (or `DEBUGINFOD_URLS`), its disk
    /// cache under `data_dir/debuginfod`; `None` when no server is configured or the cache
    /// directory cannot be made (said in the log).
    pub fn start(settings: &Symbols, data_dir: &Path, metrics: Metrics) -> Option<Self> {
        let env = std::env::var("DEBUGINFOD_URLS").ok();
        if settings.debuginfod_urls.is_empty()
            && !settings.debuginfod_urls_from_env
            && env.as_deref().is_some_and(|e| !e.trim().is_empty())
        {
            tracing::info!("debuginfod: DEBUGINFOD_URLS is set but ignored (symbols.debuginfod_urls_from_env is false)");
        }
        let urls = servers(settings, env);
        if urls.is_empty() {
            return None;
        }
        // Who learns the build ids of every stripped object on the host, said once.
        tracing::info!(
            "debuginfod: build ids of stripped objects without local debug files go to {}",
            urls.join(", ")
        );
        let dir = data_dir.join("debuginfod");
        let store = match store::Store::open(&dir, settings.debuginfod_cache_bytes) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(
                    "debuginfod: cannot use {}: {e}; not fetching",
                    dir.display()
                );
                return None;
            }
        };
        metrics.debuginfod_cache_bytes.set(store.bytes() as i64);
        let (requests, rx) = sync_channel(QUEUE);
        let (done_tx, done) = sync_channel(QUEUE);
        let worker = fetch::Worker::new(urls, settings, store, metrics.clone());
        let spawned = std::thread::Builder::new()
            .name("ember-debuginfod".into())
            .spawn(move || worker.run(rx, done_tx));
        if let Err(e) = spawned {
            tracing::warn!("debuginfod: cannot start its worker: {e}; not fetching");
            return None;
        }
        Some(Self {
            dir,
            requests,
            done,
            asked: HashMap::new(),
            metrics,
        })
    }

    /// The disk cache, laid out as a debug directory (`DIR/.build-id/ab/cdef….debug`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Asks for the debug file of `id`, which `file` lacks, unless it is in flight or
    /// backing off; never blocks. Returns whether it was queued now.
    pub fn ask(&mut self, id: &[u8], file: FileId) -> bool {
        let now = Instant::now();
        if let Some(e) = self.asked.get_mut(id) {
            if e.files.len() < MAX_FILES_PER_ID && !e.files.contains(&file) {
                e.files.push(file);
            }
            match e.asked {
                Asked::InFlight => return false,
                Asked::Failed { until, .. } if until > now => return false,
                Asked::Failed { .. } => {}
            }
        } else if self.asked.len() >= MAX_TRACKED {
            // Forget the verdicts that are over; if all are live, drop this request.
            self.asked
                .retain(|_, e| !matches!(e.asked, Asked::Failed { until, .. } if until <= now));
            if self.asked.len() >= MAX_TRACKED {
                self.metrics.dropped(Cache::Debuginfod, 1);
                return false;
            }
        }
        let entry = self.asked.entry(id.to_vec()).or_insert_with(|| Entry {
            asked: Asked::InFlight,
            files: vec![file],
        });
        match self.requests.try_send(id.to_vec()) {
            Ok(()) => {
                entry.asked = Asked::InFlight;
                true
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                // Asked again at the file's next miss.
                entry.asked = Asked::Failed {
                    until: now,
                    failures: 0,
                };
                self.metrics.dropped(Cache::Debuginfod, 1);
                false
            }
        }
    }

    /// The files whose debug file arrived since the last call (their caches are to be
    /// dropped, so they are read again); failures are remembered for the backoff.
    pub fn arrived(&mut self) -> Vec<FileId> {
        let mut out = Vec::new();
        while let Ok(d) = self.done.try_recv() {
            if d.result == DebuginfodResult::Fetched {
                if let Some(e) = self.asked.remove(&d.id) {
                    out.extend(e.files);
                }
                continue;
            }
            let Some(e) = self.asked.get_mut(&d.id) else {
                continue;
            };
            let failures = match e.asked {
                Asked::Failed { failures, .. } => failures + 1,
                Asked::InFlight => 1,
            };
            let wait = if d.result == DebuginfodResult::NotFound {
                NOT_FOUND_BACKOFF
            } else {
                FIRST_BACKOFF
                    .saturating_mul(1 << failures.min(16).saturating_sub(1))
                    .min(NOT_FOUND_BACKOFF)
            };
            e.asked = Asked::Failed {
                until: Instant::now() + wait,
                failures,
            };
        }
        out
    }
}

/// The servers to ask: the config's, else, only with `debuginfod_urls_from_env`, `env`
/// (`DEBUGINFOD_URLS`, space-separated; entries that are not `https://` URLs, or `http://`
/// without `debuginfod_allow_http`, are ignored, said in the log).
fn servers(settings: &Symbols, env: Option<String>) -> Vec<String> {
    if !settings.debuginfod_urls.is_empty() {
        return settings.debuginfod_urls.clone();
    }
    if !settings.debuginfod_urls_from_env {
        return Vec::new();
    }
    let env = env.unwrap_or_default();
    env.split_whitespace()
        .filter(|u| {
            let ok = u.starts_with("https://")
                || settings.debuginfod_allow_http && u.starts_with("http://");
            if !ok {
                tracing::warn!("DEBUGINFOD_URLS: {u:?} is not an https:// URL (http:// needs symbols.debuginfod_allow_http); ignored");
            }
            ok
        })
        .map(|u| u.trim_end_matches('/').to_owned())
        .collect()
}

/// `id` in lower-case hex, as servers and the `.build-id` layout spell it.
pub fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_come_from_the_config_else_the_environment_only_when_asked() {
        let mut s = Symbols::default();
        assert!(servers(&s, None).is_empty());
        let env = Some("https://a.example/ ftp://no http://b.example".to_owned());
        // Issue 58: the environment alone sends nothing anywhere.
        assert!(servers(&s, env.clone()).is_empty());
        s.debuginfod_urls_from_env = true;
        assert_eq!(servers(&s, env.clone()), ["https://a.example"]);
        s.debuginfod_allow_http = true;
        assert_eq!(
            servers(&s, env.clone()),
            ["https://a.example", "http://b.example"]
        );
        s.debuginfod_urls = vec!["http://c.example".into()];
        assert_eq!(servers(&s, env), ["http://c.example"]);
    }

    fn file(ino: u64) -> FileId {
        FileId {
            dev: 1,
            ino,
            size: 0,
            mtime: Default::default(),
            ctime: Default::default(),
        }
    }

    #[test]
    fn failures_back_off_and_a_full_queue_is_counted() {
        let (requests, rx) = sync_channel(1);
        let (done_tx, done) = sync_channel(4);
        let metrics = Metrics::new();
        let mut d = Debuginfod {
            dir: PathBuf::from("/nonexistent"),
            requests,
            done,
            asked: HashMap::new(),
            metrics: metrics.clone(),
        };
        assert!(d.ask(b"\x01\x02", file(1)));
        assert!(!d.ask(b"\x01\x02", file(2)), "in flight: not asked twice");
        assert!(!d.ask(b"\x03\x04", file(3)), "queue of one is full");
        let dropped = metrics
            .cache_dropped
            .get_or_create(&crate::metrics::CacheLabel {
                cache: crate::metrics::DropCause::Full(Cache::Debuginfod),
            })
            .get();
        assert_eq!(dropped, 1);
        assert_eq!(rx.try_recv().ok(), Some(vec![1, 2]));
        assert!(
            d.ask(b"\x03\x04", file(3)),
            "asked again once the queue has room"
        );
        assert_eq!(rx.try_recv().ok(), Some(vec![3, 4]));
        for (id, result) in [
            (vec![1, 2], DebuginfodResult::NotFound),
            (vec![3, 4], DebuginfodResult::Fetched),
        ] {
            done_tx.send(Done { id, result }).expect("send");
        }
        assert_eq!(d.arrived(), vec![file(3)]);
        assert!(!d.ask(b"\x01\x02", file(1)), "a 404 backs off for an hour");
        assert!(d.ask(b"\x05\x06", file(5)), "the queue has room again");
    }

    #[test]
    fn hex_is_lower_case() {
        assert_eq!(hex(&[0xab, 0x01]), "ab01");
    }
}
