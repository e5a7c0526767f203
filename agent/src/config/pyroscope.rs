//! `sinks.pyroscope:` keys, and the checks the types cannot make.
//!
//! Plain settings, parsed with the rest of the one configuration file (so errors keep
//! their line numbers); the sink in `crate::export::pyroscope` turns them into a
//! client. They live here, not with the sink, so that config stays a leaf.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::values::{Invalid, Secret, Url};

/// Which Pyroscope API to push with.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum PyroscopeApi {
    /// `POST /push.v1.PusherService/Push` (Connect, protobuf): current servers.
    Push,
    /// `POST /ingest?name=…&format=pprof`: old servers.
    Ingest,
}

/// `sinks.pyroscope:` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PyroscopeSink {
    /// Ship windows to Pyroscope.
    pub enabled: bool,
    /// Base URL of the server, `http://` or `https://`.
    pub url: Url,
    /// `push` or `ingest`.
    pub api: PyroscopeApi,
    /// Static series labels added to every profile.
    pub labels: BTreeMap<String, String>,
    /// pprof sample labels kept in the pushed profiles; Pyroscope turns each into a
    /// series label, so high-cardinality ones (pid, tid) multiply its series.
    pub sample_labels: Vec<String>,
    /// Most series (distinct service names and kept sample label values) pushed per
    /// window; the lightest past it are lumped into one `ember_overflow` series.
    pub max_series: usize,
    /// Tenant, sent as `X-Scope-OrgID`; empty: none.
    pub tenant_id: String,
    /// Basic auth user; empty: no basic auth.
    pub basic_auth_user: String,
    /// Basic auth password.
    pub basic_auth_password: Secret,
    /// File holding the basic auth password (wins over `basic_auth_password`).
    pub basic_auth_password_file: PathBuf,
    /// Bearer token.
    pub bearer_token: Secret,
    /// File holding the bearer token (wins over `bearer_token`).
    pub bearer_token_file: PathBuf,
    /// Extra HTTP headers.
    pub headers: BTreeMap<String, Secret>,
    /// PEM file of CA certificates to trust instead of the system roots.
    pub ca_file: PathBuf,
}

impl Default for PyroscopeSink {
    fn default() -> Self {
        Self {
            enabled: false,
            url: "http://127.0.0.1:4040".into(),
            api: PyroscopeApi::Push,
            labels: BTreeMap::new(),
            sample_labels: vec!["process".into()],
            max_series: 256,
            tenant_id: String::new(),
            basic_auth_user: String::new(),
            basic_auth_password: Secret::default(),
            basic_auth_password_file: PathBuf::new(),
            bearer_token: Secret::default(),
            bearer_token_file: PathBuf::new(),
            headers: BTreeMap::new(),
            ca_file: PathBuf::new(),
        }
    }
}

impl PyroscopeSink {
    /// Checks the series cap, the URL (when enabled) and the static label names.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.max_series == 0 {
            return Err(Invalid::new(
                "sinks.pyroscope.max_series",
                "must be at least 1",
            ));
        }
        if self.enabled && !self.url.is_http() {
            return Err(Invalid::new(
                "sinks.pyroscope.url",
                format!("{:?} must start with http:// or https://", self.url),
            ));
        }
        if let Some(name) = self.labels.keys().find(|n| !usable_label(n)) {
            return Err(Invalid::new(
                "sinks.pyroscope.labels",
                format!("{name:?} is not a usable label name (letters, digits, _; not __* or service_name)"),
            ));
        }
        Ok(())
    }
}

/// A static series label name Pyroscope accepts and ember does not set itself: letters,
/// digits and `_`, not starting with a digit, not `__*` (reserved) nor `service_name`.
fn usable_label(name: &str) -> bool {
    let valid = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    valid && !name.starts_with("__") && name != "service_name"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_name_the_key() {
        let ok = PyroscopeSink::default();
        assert_eq!(ok.validate(), Ok(()));
        let key = |s: PyroscopeSink| s.validate().map_err(|e| e.key);
        assert_eq!(
            key(PyroscopeSink {
                max_series: 0,
                ..Default::default()
            }),
            Err("sinks.pyroscope.max_series")
        );
        // A bad URL only matters when the sink is on.
        let bad_url = PyroscopeSink {
            url: "p:4040".into(),
            ..Default::default()
        };
        assert_eq!(key(bad_url.clone()), Ok(()));
        assert_eq!(
            key(PyroscopeSink {
                enabled: true,
                ..bad_url
            }),
            Err("sinks.pyroscope.url")
        );
        for name in ["__name__", "service_name", "1x", "a-b", ""] {
            let s = PyroscopeSink {
                labels: [(name.to_owned(), "v".to_owned())].into(),
                ..Default::default()
            };
            assert_eq!(key(s), Err("sinks.pyroscope.labels"), "{name:?}");
        }
        assert!(usable_label("_cluster") && usable_label("zone2"));
    }
}
