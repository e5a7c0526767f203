//! The debuginfod worker: one build id at a time, each server in turn
//! (`GET URL/buildid/HEX/debuginfo`), the whole request (connect, headers, body) under
//! the timeout, the body streamed to a temporary file and cut off past the size cap, then
//! kept only if ember's bounded ELF reader finds the build id asked for in it. Each
//! server's answer is counted in `ember_debuginfod_requests_total`.

use std::io::Write;
use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::store::Store;
use super::{hex, BuildId, Done};
use crate::config::Symbols;
use crate::metrics::{Cache, DebuginfodResult, Metrics};
use crate::process::elf_file::{ElfReader, Limits};
use crate::process::object::FileAt;

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// The worker's state: servers, caps, the disk cache.
pub struct Worker {
    urls: Vec<String>,
    ca_file: std::path::PathBuf,
    timeout: Duration,
    max_file: u64,
    limits: Limits,
    store: Store,
    metrics: Metrics,
}

impl Worker {
    /// A worker for `urls` with the caps of `settings`.
    pub fn new(urls: Vec<String>, settings: &Symbols, store: Store, metrics: Metrics) -> Self {
        Self {
            urls,
            ca_file: settings.debuginfod_ca_file.clone(),
            timeout: settings.debuginfod_timeout,
            max_file: settings.debuginfod_max_file_bytes,
            limits: Limits {
                max_read_bytes: settings.max_read_bytes,
                max_section_bytes: settings.max_section_bytes,
            },
            store,
            metrics,
        }
    }

    /// Serves requests until the symbolizer's side is gone.
    pub fn run(mut self, requests: Receiver<BuildId>, done: SyncSender<Done>) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("debuginfod: no runtime for the worker: {e}; not fetching");
                return;
            }
        };
        let client = match client(&self.ca_file) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("debuginfod: no TLS configuration: {e}; not fetching");
                return;
            }
        };
        while let Ok(id) = requests.recv() {
            let result = runtime.block_on(self.fetch(&client, &id));
            tracing::debug!("debuginfod: {}: {}", hex(&id), result.as_str());
            // The symbolizer drains these every window; blocking here only slows fetching.
            if done.send(Done { id, result }).is_err() {
                return;
            }
        }
    }

    /// Asks each server for `id` until one has it; the most telling failure otherwise.
    async fn fetch(&mut self, client: &HttpsClient, id: &[u8]) -> DebuginfodResult {
        let name = hex(id);
        let mut worst = DebuginfodResult::NotFound;
        for url in self.urls.clone() {
            let uri = format!("{}/buildid/{name}/debuginfo", url.trim_end_matches('/'));
            let (file, temp) = match self.store.temp(&name) {
                Ok(t) => t,
                Err(_) => return DebuginfodResult::Io,
            };
            let got =
                tokio::time::timeout(self.timeout, download(client, &uri, file, self.max_file))
                    .await
                    .unwrap_or(Err(DebuginfodResult::Timeout));
            let result = match got {
                Ok(bytes) => self.check_and_keep(&temp, id, bytes),
                Err(r) => r,
            };
            let _ = std::fs::remove_file(&temp);
            // Every server's answer counts: a hostile one shows even when another had it.
            self.metrics.debuginfod_request(result);
            if result == DebuginfodResult::Fetched {
                return result;
            }
            if result != DebuginfodResult::NotFound {
                worst = result;
            }
        }
        worst
    }

    /// Keeps the downloaded `temp` if it is an ELF file whose build id is `id`.
    fn check_and_keep(&mut self, temp: &Path, id: &[u8], bytes: u64) -> DebuginfodResult {
        let Ok(file) = std::fs::File::open(temp) else {
            return DebuginfodResult::Io;
        };
        let src = FileAt::new(&file, bytes);
        // A parser bug on a hostile answer costs that answer, not the worker.
        let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ElfReader::new(&src, self.limits).map(|mut elf| elf.build_id())
        }));
        match found {
            Ok(Ok(Ok(Some(b)))) if b == id => {}
            Ok(Ok(Ok(_))) => return DebuginfodResult::WrongBuildId,
            _ => return DebuginfodResult::Malformed,
        }
        match self.store.keep(temp, id, bytes) {
            Ok(evicted) => {
                if evicted > 0 {
                    self.metrics.dropped(Cache::Debuginfod, evicted);
                }
                self.metrics
                    .debuginfod_cache_bytes
                    .set(self.store.bytes() as i64);
                DebuginfodResult::Fetched
            }
            Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => DebuginfodResult::TooLarge,
            Err(_) => DebuginfodResult::Io,
        }
    }
}

/// Streams the answer to `uri` into `file`, at most `max` bytes; its length.
async fn download(
    client: &HttpsClient,
    uri: &str,
    mut file: std::fs::File,
    max: u64,
) -> Result<u64, DebuginfodResult> {
    let req = http::Request::get(uri)
        .body(Empty::new())
        .map_err(|_| DebuginfodResult::Http)?;
    let resp = client
        .request(req)
        .await
        .map_err(|_| DebuginfodResult::Connect)?;
    match resp.status().as_u16() {
        200 => {}
        404 => return Err(DebuginfodResult::NotFound),
        _ => return Err(DebuginfodResult::Http),
    }
    let declared = resp
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max) {
        return Err(DebuginfodResult::TooLarge);
    }
    let mut body = resp.into_body();
    let mut written: u64 = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| DebuginfodResult::Connect)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        written = written.saturating_add(data.len() as u64);
        if written > max {
            return Err(DebuginfodResult::TooLarge);
        }
        file.write_all(&data).map_err(|_| DebuginfodResult::Io)?;
    }
    Ok(written)
}

/// An http(s) client trusting the PEM CAs of `ca_file`, else the system's roots
/// (`crate::tls`, as every https client).
fn client(ca_file: &Path) -> Result<HttpsClient, crate::tls::TlsError> {
    let tls = crate::tls::client_for(ca_file)?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}
