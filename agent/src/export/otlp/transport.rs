//! Sending export requests to one OTLP endpoint over gRPC (tonic): TLS, metadata, the
//! bearer token read again when its file is rotated, and gzip.

use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_client::ProfilesServiceClient;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use prost::Message;
use tonic::codec::CompressionEncoding;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use super::error::classify;
use super::NAME;
use crate::config::OtlpSink;
use crate::export::delivery::{Outcome, Transport};
use crate::export::secrets::{secret, SecretFiles};
use crate::export::setup::SinkSetupError;

/// Sends export requests to one OTLP endpoint.
pub struct Grpc {
    client: ProfilesServiceClient<Channel>,
    metadata: MetadataMap,
    /// `sinks.otlp.bearer_token_file`, read again when it changes.
    token_file: std::path::PathBuf,
    secrets: SecretFiles,
}

impl Grpc {
    /// A lazily connecting client for the `sinks.otlp` settings; must be called
    /// inside a Tokio runtime. Reads the CA and token files now.
    pub fn new(cfg: &OtlpSink, timeout: std::time::Duration) -> Result<Self, SinkSetupError> {
        let client_error = |what| move |source| SinkSetupError::OtlpClient { what, source };
        let mut endpoint = Endpoint::from_shared(cfg.endpoint.0.clone())
            .map_err(|source| SinkSetupError::OtlpEndpoint {
                endpoint: cfg.endpoint.to_string(),
                source,
            })?
            .connect_timeout(timeout)
            .timeout(timeout)
            .tcp_nodelay(true)
            .user_agent(concat!("ember/", env!("CARGO_PKG_VERSION")))
            .map_err(client_error("user agent"))?;
        if cfg.endpoint.starts_with("https://") {
            let tls = tls(&cfg.ca_file)?;
            endpoint = endpoint.tls_config(tls).map_err(client_error("TLS"))?;
        }
        let channel = endpoint.connect_lazy();
        let mut client = ProfilesServiceClient::new(channel).max_encoding_message_size(64 << 20);
        if cfg.gzip {
            client = client.send_compressed(CompressionEncoding::Gzip);
        }
        let mut metadata = MetadataMap::new();
        for (k, v) in &cfg.headers {
            let key =
                MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes()).map_err(|source| {
                    SinkSetupError::MetadataKey {
                        name: k.clone(),
                        source,
                    }
                })?;
            let mut value = MetadataValue::try_from(v.0.as_str()).map_err(|source| {
                SinkSetupError::MetadataValue {
                    name: k.clone(),
                    source,
                }
            })?;
            // Headers carry credentials (authorization, API keys): never in a log or a
            // debug print of the request.
            value.set_sensitive(true);
            metadata.insert(key, value);
        }
        let secrets = SecretFiles::new([cfg.bearer_token_file.as_path()]);
        set_token(&mut metadata, &cfg.bearer_token_file)?;
        if cfg.endpoint.starts_with("http://") && !metadata.is_empty() {
            crate::export::secrets::warn_cleartext(NAME.as_str(), &cfg.endpoint);
        }
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
                tracing::info!(sink = NAME.as_str(), "bearer token file changed; read it again");
            }
            Err(e) => tracing::warn!(sink = NAME.as_str(), "bearer token file changed but could not be read: {e:#}; keeping the previous token"),
        }
    }
}

/// TLS for an `https://` gRPC endpoint: the CAs [`crate::tls::trusted`] picks (the PEM
/// CAs in `ca_file`, else the system's roots), as tonic takes them: trust anchors, paired
/// with the same ring provider. Shared with the OTLP metrics push
/// (`crate::readings::otlp`), which talks to the same kind of endpoint through
/// opentelemetry-otlp's own tonic client.
pub fn tls(ca_file: &std::path::Path) -> Result<ClientTlsConfig, crate::tls::TlsError> {
    Ok(ClientTlsConfig::new().trust_anchors(crate::tls::anchors(ca_file)?))
}

/// Sets `authorization: Bearer <token>` from `file` (nothing when no file is named).
fn set_token(metadata: &mut MetadataMap, file: &std::path::Path) -> Result<(), SinkSetupError> {
    let token = secret("", file, "sinks.otlp.bearer_token_file")?;
    if !token.is_empty() {
        let mut value = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(SinkSetupError::TokenValue)?;
        value.set_sensitive(true);
        metadata.insert("authorization", value);
    }
    Ok(())
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
