//! Bearer-token auth for the profiles listener.
//!
//! Why a token file and not Kubernetes TokenReview/SubjectAccessReview: it works the
//! same on a plain host and in a pod, needs no API server on the request path (a
//! profile read must not fail because the control plane is slow) and no extra RBAC
//! (`tokenreviews: create` is cluster-wide and a DaemonSet on every node should not
//! hold it). In a cluster the default is stronger still: the profiles listener stays on
//! the pod's 127.0.0.1, reachable only through `kubectl port-forward`, which the API
//! server authorizes (`pods/portforward`).
//!
//! The file is re-read when its identity or mtime changes, so a rotated Secret (which
//! the kubelet swaps by a symlink rename) takes effect without a restart. An unreadable,
//! empty or oversized file refuses every request: failing closed.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::metrics::{HttpRefusal, Metrics};

/// A token file larger than this is not a token.
const MAX_TOKEN_BYTES: u64 = 4096;

/// What identifies one version of the file: its identity, size and times.
type Version = crate::os::file_id::FileId;

/// The token file and its last read.
pub(super) struct TokenFile {
    path: PathBuf,
    cached: Mutex<Option<(Version, Option<Vec<u8>>)>>,
}

impl std::fmt::Debug for TokenFile {
    // Never the token itself.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl TokenFile {
    /// A token file at `path`; nothing is read yet.
    pub(super) fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            cached: Mutex::new(None),
        }
    }

    /// Whether `presented` is the file's current token (compared in constant time).
    pub(super) fn accepts(&self, presented: &[u8]) -> bool {
        let Some(token) = self.current() else {
            return false;
        };
        constant_time_eq(&token, presented)
    }

    /// The current token, re-read if the file changed; `None` if it cannot be used.
    fn current(&self) -> Option<Vec<u8>> {
        let meta = std::fs::metadata(&self.path).ok()?;
        let version = Version::of(&meta);
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((v, token)) = cached.as_ref() {
            if *v == version {
                return token.clone();
            }
        }
        let token = read_token(&self.path, &meta);
        if token.is_none() {
            tracing::warn!(file = %self.path.display(), "server.token_file is unreadable, empty or too large: refusing profile requests");
        }
        *cached = Some((version, token.clone()));
        token
    }
}

fn read_token(path: &Path, meta: &std::fs::Metadata) -> Option<Vec<u8>> {
    if !meta.is_file() || meta.len() > MAX_TOKEN_BYTES {
        return None;
    }
    let bytes = std::fs::read(path).ok()?;
    let token = bytes.trim_ascii().to_vec();
    (!token.is_empty() && token.len() as u64 <= MAX_TOKEN_BYTES).then_some(token)
}

/// Equal lengths and bytes, in time independent of where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What the auth middleware needs.
#[derive(Clone)]
pub(super) struct Auth {
    /// `None`: no token configured (a loopback listener).
    pub(super) token: Option<std::sync::Arc<TokenFile>>,
    pub(super) metrics: Metrics,
}

/// Middleware: with a token configured, only `Authorization: Bearer <token>` passes.
pub(super) async fn require_token(State(auth): State<Auth>, req: Request, next: Next) -> Response {
    let Some(token) = &auth.token else {
        return next.run(req).await;
    };
    let presented = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .map(<[u8]>::trim_ascii);
    let ok = match presented {
        Some(p) => {
            let token = token.clone();
            let p = p.to_vec();
            // A stat (and on change a read) of a small file.
            tokio::task::spawn_blocking(move || token.accepts(&p))
                .await
                .unwrap_or(false)
        }
        None => false,
    };
    if ok {
        next.run(req).await
    } else {
        auth.metrics.http_refused(HttpRefusal::Unauthorized);
        (
            StatusCode::UNAUTHORIZED,
            [(WWW_AUTHENTICATE, "Bearer")],
            "a bearer token is required (server.token_file)\n",
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rereads_a_rotated_file_and_fails_closed() -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let path = tmp.path().join("token");
        let file = TokenFile::new(&path);
        assert!(!file.accepts(b"anything"), "no file: refuse");
        std::fs::write(&path, "first\n")?;
        assert!(file.accepts(b"first"));
        assert!(!file.accepts(b"firs"));
        // Rotation the way the kubelet does it: a new file renamed over the old.
        let next = tmp.path().join("token.new");
        std::fs::write(&next, "second-token")?;
        std::fs::rename(&next, &path)?;
        assert!(file.accepts(b"second-token"));
        assert!(!file.accepts(b"first"));
        std::fs::write(&path, "  \n")?;
        assert!(!file.accepts(b""), "empty token: refuse");
        Ok(())
    }

    #[test]
    fn debug_hides_the_token() -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let path = tmp.path().join("token");
        std::fs::write(&path, "s3cret")?;
        let file = TokenFile::new(&path);
        assert!(file.accepts(b"s3cret"));
        assert!(!format!("{file:?}").contains("s3cret"));
        Ok(())
    }
}
