//! Bearer-token auth for the profiles listener.
//!
//! Two sources of the token: `server.token_file` (a mounted Secret, re-read when it
//! changes), or, without one, a random token made at start ([`LocalToken`]) and kept in
//! `<output.data_dir>/ui-token` (mode 0600, owner only): on a plain host the loopback
//! listener is reachable by every local user, and profiles name every user's processes
//! and functions (root's too), more than `perf_event_paranoid` lets an unprivileged user
//! see. The token is presented as `Authorization: Bearer <token>`, or as the cookie set by
//! opening `/?token=<token>` once (HttpOnly, SameSite=Strict; the redirect drops the
//! token from the address bar), the way local notebook servers do.
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

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use axum::extract::{Request, State};
use axum::http::header::{
    AUTHORIZATION, CACHE_CONTROL, COOKIE, LOCATION, SET_COOKIE, WWW_AUTHENTICATE,
};
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

/// The name of the local token's file in `output.data_dir`.
pub const LOCAL_TOKEN_FILE: &str = "ui-token";

/// The cookie that carries the token for the explorer page.
const COOKIE_NAME: &str = "ember_token";

/// A random token made at start, for a listener without `server.token_file`; its file is
/// readable by its owner only (root, as ember runs), so only who may read the data
/// directory may read profiles.
pub struct LocalToken {
    token: String,
    path: PathBuf,
}

impl std::fmt::Debug for LocalToken {
    // Never the token itself.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalToken")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl LocalToken {
    /// 32 random bytes, hex, written to `dir/ui-token` (mode 0600): a new file renamed
    /// over the old one, so a link planted at the name is replaced, never followed.
    pub fn create(dir: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut raw = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw)
            .map_err(|_| std::io::Error::other("no random bytes from the kernel"))?;
        let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let path = dir.join(LOCAL_TOKEN_FILE);
        let tmp = dir.join(format!(".{LOCAL_TOKEN_FILE}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(format!("{token}\n").as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        Ok(Self { token, path })
    }

    /// The file holding the token.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The address that logs a browser in: `http://<addr>/?token=<token>`.
    pub fn login_url(&self, addr: std::net::SocketAddr) -> String {
        format!("http://{addr}/?token={}", self.token)
    }
}

/// Where the token a request must present comes from.
pub(super) enum Token {
    /// `server.token_file`.
    File(TokenFile),
    /// Made at start ([`LocalToken`]).
    Local(Vec<u8>),
}

impl Token {
    /// A local token's bytes.
    pub(super) fn local(t: &LocalToken) -> Self {
        Self::Local(t.token.as_bytes().to_vec())
    }

    fn accepts(&self, presented: &[u8]) -> bool {
        match self {
            Self::File(f) => f.accepts(presented),
            Self::Local(t) => constant_time_eq(t, presented),
        }
    }
}

/// What the auth middleware needs.
#[derive(Clone)]
pub(super) struct Auth {
    /// `None`: no token at all (`server.local_auth: false` on a loopback listener).
    pub(super) token: Option<std::sync::Arc<Token>>,
    pub(super) metrics: Metrics,
}

impl Auth {
    /// Whether `presented` is the token (a stat, and on change a read, of a small file).
    async fn accepts(&self, presented: Option<&[u8]>) -> bool {
        let (Some(token), Some(p)) = (&self.token, presented) else {
            return false;
        };
        let token = token.clone();
        let p = p.to_vec();
        tokio::task::spawn_blocking(move || token.accepts(&p))
            .await
            .unwrap_or(false)
    }

    fn refuse(&self) -> Response {
        self.metrics.http_refused(HttpRefusal::Unauthorized);
        (
            StatusCode::UNAUTHORIZED,
            [(WWW_AUTHENTICATE, "Bearer")],
            "a token is required: open the address ember printed at start, or send \
             Authorization: Bearer <token> (server.token_file, or output.data_dir/ui-token)\n",
        )
            .into_response()
    }
}

/// The token a request presents: `Authorization: Bearer`, else the cookie.
fn presented(req: &Request) -> Option<&[u8]> {
    let headers = req.headers();
    if let Some(b) = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
    {
        return Some(b.trim_ascii());
    }
    headers
        .get_all(COOKIE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b';'))
        .find_map(|c| {
            c.trim_ascii()
                .strip_prefix(COOKIE_NAME.as_bytes())?
                .strip_prefix(b"=")
        })
}

/// Middleware: with a token, only a request presenting it passes.
pub(super) async fn require_token(State(auth): State<Auth>, req: Request, next: Next) -> Response {
    if auth.token.is_none() {
        return next.run(req).await;
    }
    if auth.accepts(presented(&req)).await {
        next.run(req).await
    } else {
        auth.refuse()
    }
}

/// Middleware of the pages: `?token=<token>` sets the cookie and redirects to the same
/// page without the token in its address (nor in the history or a Referer); a wrong one
/// is a 401. Without `token=`, the page (which holds no data) is served.
pub(super) async fn login(State(auth): State<Auth>, req: Request, next: Next) -> Response {
    let query = req.uri().query().unwrap_or("");
    let Some(token) = form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned())
    else {
        return next.run(req).await;
    };
    if auth.token.is_none() || !auth.accepts(Some(token.as_bytes())).await {
        return auth.refuse();
    }
    // The token is hex (or a configured file's bytes): keep only cookie-safe ones.
    if !token
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b';' && b != b',')
    {
        return auth.refuse();
    }
    let cookie = format!("{COOKIE_NAME}={token}; Path=/; HttpOnly; SameSite=Strict");
    (
        StatusCode::SEE_OTHER,
        [
            (LOCATION, req.uri().path().to_string()),
            (SET_COOKIE, cookie),
            (CACHE_CONTROL, "no-store".to_string()),
        ],
    )
        .into_response()
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
