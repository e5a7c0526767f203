//! The explorer page and its assets, embedded in the binary: nothing is fetched from
//! the network at run time.
//!
//! The flame graph is d3-flame-graph 5.0.0 on d3 7.9.0, vendored from npm at pinned
//! versions with their licenses (`ui/vendor/`, see its README). Why not inferno's SVG
//! (which `/flamegraph/<window>.svg` still serves): the page zooms, searches, flips to
//! an icicle and colours a differential graph in the browser from one JSON tree the
//! agent builds per range, instead of a server-side render per click; d3's brush gives
//! the time range selection on the same library.

use axum::extract::Path;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};

use super::RouteError;

/// `(path under /ui/, content type, bytes)`.
const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("ui/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_bytes!("ui/app.css"),
    ),
    (
        "use.js",
        "text/javascript; charset=utf-8",
        include_bytes!("ui/use.js"),
    ),
    (
        "vendor/d3-7.9.0.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("ui/vendor/d3-7.9.0.min.js"),
    ),
    (
        "vendor/d3-flamegraph-5.0.0.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("ui/vendor/d3-flamegraph-5.0.0.min.js"),
    ),
    (
        "vendor/d3-flamegraph-5.0.0.css",
        "text/css; charset=utf-8",
        include_bytes!("ui/vendor/d3-flamegraph-5.0.0.css"),
    ),
    (
        "vendor/LICENSE-d3",
        "text/plain; charset=utf-8",
        include_bytes!("ui/vendor/LICENSE-d3"),
    ),
    (
        "vendor/LICENSE-d3-flame-graph",
        "text/plain; charset=utf-8",
        include_bytes!("ui/vendor/LICENSE-d3-flame-graph"),
    ),
];

const HTML: &str = "text/html; charset=utf-8";

/// `GET /`: the explorer.
pub(super) async fn index() -> Response {
    ([(CONTENT_TYPE, HTML)], include_str!("ui/index.html")).into_response()
}

/// `GET /use`: the USE checklist.
pub(super) async fn use_page() -> Response {
    ([(CONTENT_TYPE, HTML)], include_str!("ui/use.html")).into_response()
}

/// `GET /ui/<path>`: one embedded asset. They hold no data, so they need no token
/// (the page asks for one when the API wants it).
pub(super) async fn asset(Path(path): Path<String>) -> Result<Response, RouteError> {
    let (_, content_type, bytes) = ASSETS
        .iter()
        .find(|(p, _, _)| *p == path)
        .ok_or(RouteError::NotFound)?;
    Ok((
        [
            (CONTENT_TYPE, *content_type),
            (CACHE_CONTROL, "max-age=3600"),
        ],
        *bytes,
    )
        .into_response())
}
