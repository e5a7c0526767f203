//! OTLP profiles over gRPC: the export requests [`encode`] builds from a window, sent
//! to one endpoint (TLS, headers, bearer token, gzip) by [`transport`], and what a gRPC
//! status means for delivery ([`error`]). Its settings are `crate::config::OtlpSink`.

pub mod encode;
pub mod error;
pub mod transport;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use prost::Message;

use super::{Encode, EncodeError};
use crate::config::{OtlpSink, ResourcePer};
use crate::metrics::SinkName;
use crate::model::Symbolized;
pub use transport::Grpc;

/// Metric and log name of this sink.
pub const NAME: SinkName = SinkName::Otlp;

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
        encode::request(w, &self.host, self.per)
    }
}

impl Encode for Encoder {
    type Item = ExportProfilesServiceRequest;
    fn encode(&mut self, w: &Symbolized) -> Result<Vec<(Self::Item, u64)>, EncodeError> {
        let r = self.request(w);
        if r.resource_profiles.is_empty() {
            return Ok(Vec::new());
        }
        let n = r.encoded_len() as u64;
        Ok(vec![(r, n)])
    }
}
