//! What a gRPC status means for delivery: retried, or dropped for good under a reason
//! named after the status code.

use crate::export::delivery::{Outcome, Transient};
use crate::metrics::ExportDrop;

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
