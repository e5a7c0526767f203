//! Single windows: the raw `.pb.gz` file (`/windows/<name>`) and inferno's SVG flame
//! graph of one window (`/flamegraph/<name>.svg`), each under `server.max_file_bytes`,
//! as heavy work ([`Heavy::run`]).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};

use super::limits::Heavy;
use super::RouteError;
use crate::encode::flamegraph;
use crate::export::files::WindowDir;
use crate::metrics::{HttpRefusal, Metrics};

/// What these routes need.
#[derive(Clone)]
pub(super) struct Windows {
    pub(super) dir: Arc<WindowDir>,
    pub(super) heavy: Heavy,
    pub(super) max_file_bytes: u64,
    pub(super) max_response_bytes: u64,
    pub(super) metrics: Metrics,
}

impl Windows {
    /// The bytes of window `name`, refusing files over the cap.
    fn read(&self, name: &str) -> Result<Vec<u8>, RouteError> {
        let bytes = self.dir.read(name)?;
        if bytes.len() as u64 > self.max_file_bytes {
            self.metrics.http_refused(HttpRefusal::TooLarge);
            return Err(RouteError::TooLarge);
        }
        Ok(bytes)
    }
}

/// `GET /windows/<name>`: the window file as written.
pub(super) async fn raw(
    State(w): State<Windows>,
    Path(name): Path<String>,
) -> Result<Response, RouteError> {
    let heavy = w.heavy.clone();
    let bytes = heavy.run(move |_| w.read(&name)).await?;
    Ok(([(CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

/// `GET /flamegraph/<name>.svg`: inferno's flame graph of one window.
pub(super) async fn svg(
    State(w): State<Windows>,
    Path(file): Path<String>,
) -> Result<Response, RouteError> {
    let name = file
        .strip_suffix(".svg")
        .filter(|n| crate::export::files::is_window_name(n))
        .ok_or(RouteError::NotFound)?
        .to_string();
    let heavy = w.heavy.clone();
    let svg = heavy
        .run(move |work| -> Result<Vec<u8>, RouteError> {
            let profile = flamegraph::decode_gz(&w.read(&name)?)?;
            work.check()?;
            let svg = flamegraph::svg(&profile, &format!("ember CPU {name}"))?;
            if svg.len() as u64 > w.max_response_bytes {
                w.metrics.http_refused(HttpRefusal::TooLarge);
                return Err(RouteError::ResponseTooLarge);
            }
            Ok(svg)
        })
        .await?;
    Ok(([(CONTENT_TYPE, "image/svg+xml")], svg).into_response())
}
