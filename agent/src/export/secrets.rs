//! Secrets the network sinks send (passwords, tokens): read from a file when one is
//! named, and read again when Kubernetes rotates the file.

use std::path::Path;

use super::setup::SinkSetupError;

/// Reads a secret: the file if one is named (trailing newline removed), else `inline`.
pub(crate) fn secret(
    inline: &str,
    file: &Path,
    key: &'static str,
) -> Result<String, SinkSetupError> {
    if file.as_os_str().is_empty() {
        return Ok(inline.to_owned());
    }
    let text = std::fs::read_to_string(file).map_err(|source| SinkSetupError::Secret {
        key,
        path: file.to_owned(),
        source,
    })?;
    Ok(text.trim_end_matches(['\r', '\n']).to_owned())
}

/// Watches secret files (tokens, passwords) for rotation: Kubernetes swaps a mounted
/// Secret's files atomically, so a change of identity, size or modification time means
/// "read it again". A `stat` per request is cheap next to the request.
pub(crate) struct SecretFiles {
    files: Vec<(std::path::PathBuf, Option<Stamp>)>,
}

/// Device, inode, mtime (seconds, nanoseconds) and size of a file.
type Stamp = (u64, u64, i64, i64, u64);

impl SecretFiles {
    /// Watches the non-empty paths of `files`, as they are now.
    pub(crate) fn new<'a>(files: impl IntoIterator<Item = &'a Path>) -> Self {
        let files = files
            .into_iter()
            .filter(|p| !p.as_os_str().is_empty())
            .map(|p| (p.to_owned(), stamp(p)))
            .collect();
        Self { files }
    }

    /// Whether any file changed since the last call (or since [`SecretFiles::new`]).
    pub(crate) fn changed(&mut self) -> bool {
        let mut changed = false;
        for (path, last) in &mut self.files {
            let now = stamp(path);
            if now != *last {
                *last = now;
                changed = true;
            }
        }
        changed
    }
}

/// What identifies a file's content cheaply: device, inode, mtime and size (following
/// symlinks, as Kubernetes' `..data` link is swapped on update).
fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.size()))
}

/// Says, once at start, that `sink` sends credentials in clear text to `url` (shown
/// redacted): anyone on the path reads them.
pub(crate) fn warn_cleartext(sink: &str, url: &crate::config::values::Url) {
    tracing::warn!(
        sink,
        %url,
        "credentials (authorization or headers) go over plain http://: anyone on the network path can read them; use https://"
    );
}

/// A backend's error text as one log line: control characters (newlines among them)
/// escaped, at most `cap` bytes of it (cut on a character boundary, marked `…`). A
/// hostile backend must not forge log lines or flood the log.
pub(crate) fn one_line(text: &str, cap: usize) -> String {
    let mut out = String::with_capacity(text.len().min(cap) + 8);
    for c in text.chars() {
        let escaped: String = if c.is_control() {
            c.escape_default().collect()
        } else {
            c.to_string()
        };
        if out.len() + escaped.len() > cap {
            out.push('…');
            break;
        }
        out.push_str(&escaped);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_text_is_one_capped_line() {
        assert_eq!(
            one_line("bad\nFAKE line\r\x1b[31m", 512),
            "bad\\nFAKE line\\r\\u{1b}[31m"
        );
        let long = "é".repeat(600);
        let cut = one_line(&long, 512);
        assert!(
            cut.len() <= 512 + '…'.len_utf8() && cut.ends_with('…'),
            "{}",
            cut.len()
        );
        assert!(!one_line("a\u{2028}b\u{85}c", 64).contains('\u{85}'));
    }
}
