//! Why a network sink could not be set up: its secrets, headers, TLS and client, and the
//! thread its deliveries run on. Each message names the config key at fault, for the
//! operator who reads it once at start (or in the log, when a rotated secret file cannot
//! be read again).

use std::path::PathBuf;

use http::header::{InvalidHeaderName, InvalidHeaderValue};
use tonic::metadata::errors::{InvalidMetadataKey, InvalidMetadataValue};

/// A sink that could not start (or a secret that could not be read again).
#[derive(Debug, thiserror::Error)]
pub enum SinkSetupError {
    /// A secret file could not be read.
    #[error("{key}: reading {}", path.display())]
    Secret {
        /// The config key that names the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `sinks.pyroscope`: a value sent as a header (a secret, the tenant, an extra header)
    /// is not a valid header value.
    #[error("sinks.pyroscope: {what} is not a valid header value")]
    HeaderValue {
        /// Which value.
        what: String,
        /// Why.
        source: InvalidHeaderValue,
    },
    /// `sinks.pyroscope.headers`: a key is not a header name.
    #[error("sinks.pyroscope.headers: {name:?} is not a header name")]
    HeaderName {
        /// The key.
        name: String,
        /// Why.
        source: InvalidHeaderName,
    },
    /// `sinks.pyroscope` sets both basic auth and a bearer token.
    #[error("sinks.pyroscope: set either basic auth or a bearer token, not both")]
    BothAuth,
    /// No TLS configuration could be made (a CA file that cannot be read or holds no
    /// usable certificate).
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// `sinks.otlp.endpoint` is not a valid endpoint.
    #[error("sinks.otlp.endpoint {endpoint}")]
    OtlpEndpoint {
        /// The endpoint, as configured.
        endpoint: String,
        /// Why.
        source: tonic::transport::Error,
    },
    /// The OTLP client refused a setting (`what`: its user agent, its TLS).
    #[error("sinks.otlp: {what}")]
    OtlpClient {
        /// The setting.
        what: &'static str,
        /// Why.
        source: tonic::transport::Error,
    },
    /// `sinks.otlp.headers`: a key is not a metadata key.
    #[error("sinks.otlp.headers: {name:?} is not a header name")]
    MetadataKey {
        /// The key.
        name: String,
        /// Why.
        source: InvalidMetadataKey,
    },
    /// `sinks.otlp.headers`: a value is not a valid metadata value.
    #[error("sinks.otlp.headers: the value of {name} is not valid")]
    MetadataValue {
        /// The key whose value it is.
        name: String,
        /// Why.
        source: InvalidMetadataValue,
    },
    /// `sinks.otlp.bearer_token_file` holds what cannot be sent as a header.
    #[error("sinks.otlp.bearer_token_file: not a valid header value")]
    TokenValue(#[source] InvalidMetadataValue),
    /// The sinks' Tokio runtime could not be built.
    #[error("starting the sinks' runtime")]
    Runtime(#[source] std::io::Error),
    /// The sinks' thread could not be spawned.
    #[error("starting the sinks' thread")]
    Thread(#[source] std::io::Error),
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::values::Secret;
    use crate::config::{OtlpSink, PyroscopeSink};
    use crate::export::otlp::Grpc;
    use crate::export::pyroscope::Http;

    /// The message and its causes as `ember:` prints them (`{:#}`: joined by ": ").
    fn chain(e: &dyn std::error::Error) -> String {
        let mut out = e.to_string();
        let mut next = e.source();
        while let Some(cause) = next {
            out.push_str(&format!(": {cause}"));
            next = cause.source();
        }
        out
    }

    fn pyroscope(cfg: PyroscopeSink) -> String {
        match Http::new(&cfg, Duration::from_secs(1)) {
            Ok(_) => "started".to_owned(),
            Err(e) => chain(&e),
        }
    }

    #[test]
    fn pyroscope_setup_errors_name_the_key_and_keep_the_cause() {
        let base = || PyroscopeSink {
            url: "http://127.0.0.1:1".into(),
            ..Default::default()
        };
        assert_eq!(
            pyroscope(PyroscopeSink {
                bearer_token_file: "/nonexistent/ember-token".into(),
                ..base()
            }),
            "sinks.pyroscope.bearer_token_file: reading /nonexistent/ember-token: \
             No such file or directory (os error 2)"
        );
        assert_eq!(
            pyroscope(PyroscopeSink {
                basic_auth_user: "u".into(),
                bearer_token: Secret("t".into()),
                ..base()
            }),
            "sinks.pyroscope: set either basic auth or a bearer token, not both"
        );
        assert_eq!(
            pyroscope(PyroscopeSink {
                headers: [("bad name".to_owned(), Secret("v".into()))].into(),
                ..base()
            }),
            "sinks.pyroscope.headers: \"bad name\" is not a header name: invalid HTTP header name"
        );
        assert_eq!(
            pyroscope(PyroscopeSink {
                tenant_id: "a\nb".into(),
                ..base()
            }),
            "sinks.pyroscope: tenant_id is not a valid header value: failed to parse header value"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "no certificate here\n").expect("write");
        assert_eq!(
            pyroscope(PyroscopeSink {
                url: "https://127.0.0.1:1".into(),
                ca_file: ca.clone(),
                ..base()
            }),
            format!("CA file {} holds no certificate", ca.display())
        );
    }

    #[test]
    fn otlp_setup_errors_name_the_key_and_keep_the_cause() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let _guard = rt.enter();
        let otlp = |cfg: OtlpSink| match Grpc::new(&cfg, Duration::from_secs(1)) {
            Ok(_) => "started".to_owned(),
            Err(e) => chain(&e),
        };
        assert_eq!(otlp(OtlpSink::default()), "started");
        assert_eq!(
            otlp(OtlpSink {
                headers: [("bad name".to_owned(), Secret("v".into()))].into(),
                ..Default::default()
            }),
            "sinks.otlp.headers: \"bad name\" is not a header name: invalid gRPC metadata key name"
        );
        assert_eq!(
            otlp(OtlpSink {
                endpoint: "https://127.0.0.1:4317".into(),
                ca_file: "/nonexistent/ember-ca.pem".into(),
                ..Default::default()
            }),
            "reading CA file /nonexistent/ember-ca.pem: No such file or directory (os error 2)"
        );
    }
}
