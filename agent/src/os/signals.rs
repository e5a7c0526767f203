//! The agent's tokio runtime and its stop signals (SIGTERM, SIGINT), installed before
//! anything starts.

use std::io;

/// SIGTERM and SIGINT handlers.
pub(crate) struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

/// The agent's runtime, with one worker thread so the server answers while the calling
/// thread loads the sampler, and the stop signals' handlers, installed before anything
/// starts: the server answers (and a probe or a client may send SIGTERM) from the first
/// second, long before the agent waits for them. None when they cannot be installed (the default
/// action then still ends the process).
pub(crate) fn runtime() -> io::Result<(tokio::runtime::Runtime, Option<StopSignals>)> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let signals = {
        let _in_rt = rt.enter();
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => Some(StopSignals { term, int }),
            _ => None,
        }
    };
    Ok((rt, signals))
}

/// Until SIGTERM or SIGINT (forever without handlers).
pub(crate) async fn stop_signal(signals: Option<StopSignals>) {
    let Some(StopSignals { mut term, mut int }) = signals else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
