//! OTLP profiles over gRPC: the export requests [`crate::encode::otlp`] builds from a
//! window, sent to one endpoint (TLS, headers, bearer token, gzip), and what a gRPC
//! status means for delivery.

use anyhow::{Context, Result};
use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_client::ProfilesServiceClient;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use prost::Message;
use tonic::codec::CompressionEncoding;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use super::delivery::{Outcome, Transient, Transport};
use super::Encode;
use crate::config::{OtlpSink, ResourcePer};
use crate::metrics::ExportDrop;
use crate::model::Symbolized;

/// Metric and log name of this sink.
pub const NAME: &str = "otlp";

/// Builds export requests from windows.
pub struct Encoder {
    host: String,
    per: ResourcePer,
}

impl Encoder {
    /// An encoder naming `host` as `host.name` (and `k8s.node.name` for pods).
    pub fn new(cfg: &OtlpSink, host: &str) -> Self {
        Self {
            host: host.to_owned(),
            per: cfg.resource_per,
        }
    }

    /// The export request for one window.
    pub fn request(&self, w: &Symbolized) -> ExportProfilesServiceRequest {
        crate::encode::otlp::request(w, &self.host, self.per)
    }
}

impl Encode for Encoder {
    type Item = ExportProfilesServiceRequest;
    fn encode(&mut self, w: &Symbolized) -> Result<Vec<(Self::Item, u64)>> {
        let r = self.request(w);
        if r.resource_profiles.is_empty() {
            return Ok(Vec::new());
        }
        let n = r.encoded_len() as u64;
        Ok(vec![(r, n)])
    }
}

/// Sends export requests to one OTLP endpoint.
pub struct Grpc {
    client: ProfilesServiceClient<Channel>,
    metadata: MetadataMap,
    /// `sinks.otlp.bearer_token_file`, read again when it changes.
    token_file: std::path::PathBuf,
    secrets: super::SecretFiles,
}

impl Grpc {
    /// A lazily connecting client for the `sinks.otlp` settings; must be called
    /// inside a Tokio runtime. Reads the CA and token files now.
    pub fn new(cfg: &OtlpSink, timeout: std::time::Duration) -> Result<Self> {
        let mut endpoint = Endpoint::from_shared(cfg.endpoint.0.clone())
            .with_context(|| format!("sinks.otlp.endpoint {}", cfg.endpoint))?
            .connect_timeout(timeout)
            .timeout(timeout)
            .tcp_nodelay(true)
            .user_agent(concat!("ember/", env!("CARGO_PKG_VERSION")))
            .context("sinks.otlp: user agent")?;
        if cfg.endpoint.starts_with("https://") {
            let tls = if cfg.ca_file.as_os_str().is_empty() {
                ClientTlsConfig::new().with_native_roots()
            } else {
                let pem = std::fs::read(&cfg.ca_file)
                    .with_context(|| format!("reading CA file {}", cfg.ca_file.display()))?;
                ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem))
            };
            endpoint = endpoint.tls_config(tls).context("sinks.otlp: TLS")?;
        }
        let channel = endpoint.connect_lazy();
        let mut client = ProfilesServiceClient::new(channel).max_encoding_message_size(64 << 20);
        if cfg.gzip {
            client = client.send_compressed(CompressionEncoding::Gzip);
        }
        let mut metadata = MetadataMap::new();
        for (k, v) in &cfg.headers {
            let key = MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
                .with_context(|| format!("sinks.otlp.headers: {k:?} is not a header name"))?;
            let value = MetadataValue::try_from(v.0.as_str())
                .with_context(|| format!("sinks.otlp.headers: the value of {k} is not valid"))?;
            metadata.insert(key, value);
        }
        let secrets = super::SecretFiles::new([cfg.bearer_token_file.as_path()]);
        set_token(&mut metadata, &cfg.bearer_token_file)?;
        Ok(Self {
            client,
            metadata,
            token_file: cfg.bearer_token_file.clone(),
            secrets,
        })
    }

    /// Reads the token file again if it changed (rotation); an unreadable one keeps the
    /// last good token, with a warning.
    fn rotate(&mut self) {
        if !self.secrets.changed() {
            return;
        }
        let mut metadata = self.metadata.clone();
        match set_token(&mut metadata, &self.token_file) {
            Ok(()) => {
                self.metadata = metadata;
                tracing::info!(sink = NAME, "bearer token file changed; read it again");
            }
            Err(e) => tracing::warn!(sink = NAME, "bearer token file changed but could not be read: {e:#}; keeping the previous token"),
        }
    }
}

/// Sets `authorization: Bearer <token>` from `file` (nothing when no file is named).
fn set_token(metadata: &mut MetadataMap, file: &std::path::Path) -> Result<()> {
    let token = super::secret("", file, "sinks.otlp.bearer_token_file")?;
    if !token.is_empty() {
        let mut value = MetadataValue::try_from(format!("Bearer {token}"))
            .context("sinks.otlp.bearer_token_file: not a valid header value")?;
        value.set_sensitive(true);
        metadata.insert("authorization", value);
    }
    Ok(())
}

/// What a gRPC status means for delivery: UNAVAILABLE, RESOURCE_EXHAUSTED and
/// DEADLINE_EXCEEDED are retried; everything else is a permanent rejection.
pub fn classify(status: &tonic::Status) -> Outcome {
    use tonic::Code;
    let reason = ExportDrop::Grpc(status.code());
    match status.code() {
        Code::Unavailable | Code::ResourceExhausted | Code::DeadlineExceeded => Outcome::Retry {
            reason: Transient::Status(reason),
            after: None,
        },
        _ => Outcome::Reject {
            reason,
            detail: status.message().chars().take(512).collect(),
        },
    }
}

impl Transport for Grpc {
    type Item = ExportProfilesServiceRequest;
    fn send(
        &mut self,
        item: &ExportProfilesServiceRequest,
    ) -> impl std::future::Future<Output = Outcome> + Send + '_ {
        self.rotate();
        let mut req = tonic::Request::new(item.clone());
        *req.metadata_mut() = self.metadata.clone();
        let bytes = item.encoded_len() as u64;
        async move {
            match self.client.export(req).await {
                Ok(resp) => {
                    if let Some(p) = resp.into_inner().partial_success {
                        if p.rejected_profiles > 0 {
                            tracing::debug!(
                                rejected = p.rejected_profiles,
                                message = %p.error_message,
                                "the OTLP backend rejected part of a request"
                            );
                        }
                    }
                    Outcome::Sent { bytes }
                }
                Err(status) => classify(&status),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_codes() {
        assert!(matches!(
            classify(&tonic::Status::unavailable("x")),
            Outcome::Retry { .. }
        ));
        assert!(matches!(
            classify(&tonic::Status::resource_exhausted("x")),
            Outcome::Retry { .. }
        ));
        assert!(matches!(
            classify(&tonic::Status::invalid_argument("x")),
            Outcome::Reject { reason, .. } if reason.to_string() == "grpc_invalid_argument"
        ));
    }
}
