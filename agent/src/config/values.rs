//! Value types shared by the config sections, the sinks' (`super::otlp`,
//! `super::pyroscope`) included: URLs and secrets that never print their credentials,
//! and the error a section's own check returns.
//!
//! It imports nothing of the crate, so every section can use it.

use serde::Deserialize;

/// A value that parses but makes no sense, found by a section's own check; the config
/// room adds where it came from ([`super::ConfigError::Invalid`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct Invalid {
    /// Dotted key path.
    pub key: &'static str,
    /// What is wrong.
    pub message: String,
}

impl Invalid {
    /// `key` is invalid: `message`.
    pub fn new(key: &'static str, message: impl Into<String>) -> Self {
        Self {
            key,
            message: message.into(),
        }
    }
}

/// A URL that may carry credentials (`https://user:password@host/`): `Debug` and
/// `Display` print it without its userinfo, so logs and config dumps never show them.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Url(pub String);

impl Url {
    /// The URL with any `user:password@` replaced by `***@`, and the value of every query
    /// parameter whose name says it is a secret (`token`, `key`, `api_key`, `password`,
    /// `secret`, `auth`, `signature`, `credential`... in any case) by `***`.
    pub fn redacted(&self) -> std::borrow::Cow<'_, str> {
        let s = &self.0;
        let rest_at = s.find("://").map_or(0, |i| i + 3);
        let authority_end = s[rest_at..]
            .find(['/', '?', '#'])
            .map_or(s.len(), |i| rest_at + i);
        let url: std::borrow::Cow<'_, str> = match s[rest_at..authority_end].rfind('@') {
            Some(at) => format!("{}***@{}", &s[..rest_at], &s[rest_at + at + 1..]).into(),
            None => s.as_str().into(),
        };
        match redact_query(&url) {
            Some(r) => r.into(),
            None => url,
        }
    }

    /// Whether the URL starts with `http://` or `https://`.
    pub fn is_http(&self) -> bool {
        self.starts_with("http://") || self.starts_with("https://")
    }
}

/// Parts of query parameter names that mark their values as secrets.
const SECRET_PARAMS: [&str; 9] = [
    "token",
    "key",
    "secret",
    "pass",
    "auth",
    "signature",
    "sig",
    "credential",
    "session",
];

fn is_secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_PARAMS.iter().any(|s| name.contains(s))
}

/// `url` with the values of its secret query parameters replaced by `***`; `None` when
/// it has none.
fn redact_query(url: &str) -> Option<String> {
    let q = url.find('?')?;
    let end = url[q..].find('#').map_or(url.len(), |i| q + i);
    let mut changed = false;
    let params: Vec<String> = url[q + 1..end]
        .split('&')
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !v.is_empty() && is_secret_param(k) => {
                changed = true;
                format!("{k}=***")
            }
            _ => p.to_owned(),
        })
        .collect();
    changed.then(|| format!("{}?{}{}", &url[..q], params.join("&"), &url[end..]))
}

impl std::ops::Deref for Url {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Url {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

impl std::fmt::Debug for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

impl std::fmt::Display for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// A secret string (password, token, header value): never printed by `Debug`.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "\"***\"" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_hide_userinfo_and_secrets_hide_everything() {
        let u = Url::from("https://bob:pw@host:1/p?q=a@b");
        assert_eq!(u.to_string(), "https://***@host:1/p?q=a@b");
        assert_eq!(format!("{u:?}"), "\"https://***@host:1/p?q=a@b\"");
        assert_eq!(Url::from("http://h/a@b").redacted(), "http://h/a@b");
        // Issue 58: secrets in the query string, in any case, are hidden too.
        let q = Url::from("https://u:p@h/ingest?name=app&token=t0k&API_KEY=k3y&x-amz-signature=s1g&access_token=a&from=1#frag");
        assert_eq!(
            q.to_string(),
            "https://***@h/ingest?name=app&token=***&API_KEY=***&x-amz-signature=***&access_token=***&from=1#frag"
        );
        for secret in ["t0k", "k3y", "s1g", "u:p"] {
            assert!(!format!("{q:?}").contains(secret), "{secret}");
        }
        assert_eq!(
            Url::from("http://h/p?password=hunter2").redacted(),
            "http://h/p?password=***"
        );
        assert!(u.is_http() && Url::from("http://h").is_http());
        assert!(!Url::from("h:1").is_http() && !Url::from("grpc://h").is_http());
        assert_eq!(format!("{:?}", Secret("x".into())), "\"***\"");
        assert_eq!(format!("{:?}", Secret::default()), "\"\"");
        assert_eq!(Invalid::new("a.b", "must be").to_string(), "a.b: must be");
    }
}
