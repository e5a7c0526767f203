//! `sinks.otlp:` keys, and the checks the types cannot make.
//!
//! Plain settings, parsed with the rest of the one configuration file (so errors keep
//! their line numbers); the sink in `crate::export::otlp` turns them into a
//! client. They live here, not with the sink, so that config stays a leaf.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::values::{Invalid, Secret, Url};

/// What one OTLP `ResourceProfiles` stands for.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ResourcePer {
    /// One resource per container; host processes get one each.
    Container,
    /// One resource per process.
    Process,
}

/// `sinks.otlp:` keys.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct OtlpSink {
    /// Ship windows as OTLP profiles.
    pub enabled: bool,
    /// gRPC endpoint, `http://host:4317` or `https://…` (TLS).
    pub endpoint: Url,
    /// `container` or `process`.
    pub resource_per: ResourcePer,
    /// gzip-compress requests.
    pub gzip: bool,
    /// Extra gRPC metadata (headers), e.g. `authorization`.
    pub headers: BTreeMap<String, Secret>,
    /// File holding a bearer token sent as `authorization: Bearer …`; empty: none.
    pub bearer_token_file: PathBuf,
    /// PEM file of CA certificates to trust instead of the system roots.
    pub ca_file: PathBuf,
}

impl Default for OtlpSink {
    fn default() -> Self {
        Self {
            enabled: false,
            endpoint: "http://127.0.0.1:4317".into(),
            resource_per: ResourcePer::Container,
            gzip: true,
            headers: BTreeMap::new(),
            bearer_token_file: PathBuf::new(),
            ca_file: PathBuf::new(),
        }
    }
}

impl OtlpSink {
    /// Checks the endpoint's scheme when the sink is on.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.enabled && !self.endpoint.is_http() {
            return Err(Invalid::new(
                "sinks.otlp.endpoint",
                format!("{:?} must start with http:// or https://", self.endpoint),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_is_checked_only_when_enabled() {
        let off = OtlpSink {
            endpoint: "o:4317".into(),
            ..Default::default()
        };
        assert_eq!(off.validate(), Ok(()));
        let on = OtlpSink {
            enabled: true,
            ..off
        };
        let err = on.validate().map_err(|e| e.to_string());
        assert_eq!(
            err,
            Err("sinks.otlp.endpoint: \"o:4317\" must start with http:// or https://".into())
        );
    }
}
