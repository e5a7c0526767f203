//! Grafana Pyroscope: each window, split into one pprof profile per
//! `service_name` by [`encode`], is pushed as one series per service.
//!
//! The push API is Connect unary, `POST /push.v1.PusherService/Push` with a
//! gzip'ed protobuf `PushRequest` (`application/proto`); the pprof inside each
//! `RawSample` is not compressed, as the pyroscope-io client sends it. Old
//! servers get the legacy `POST /ingest?name=…&format=pprof`, one request per
//! service. Series labels: `__name__=process_cpu` (`off_cpu` for off-CPU windows), `service_name`, the
//! namespace/pod/container/container_id shared by every sample of the service,
//! and the configured static labels.
//!
//! One folder holds the whole sink but its settings (`crate::config::PyroscopeSink`):
//! the split of a window by service ([`encode`]), the requests made of it ([`request`]), the HTTP client
//! ([`transport`]) and what a reply means for delivery ([`error`]).

pub mod encode;
pub mod error;
pub mod request;
pub mod transport;

pub use request::Encoder;

use crate::metrics::SinkName;
pub use transport::Http;

/// Metric and log name of this sink.
pub const NAME: SinkName = SinkName::Pyroscope;
/// The Connect path of the push API.
pub const PUSH_PATH: &str = "/push.v1.PusherService/Push";
