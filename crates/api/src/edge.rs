//! The listener's edge, before any request exists: how many connections one instance keeps
//! open, and how long a connection may take to send a request head (which is also how long an
//! idle keep-alive connection is kept). Without these, one client that opens connections and
//! never finishes a request holds a descriptor and a task each, for ever, until the instance
//! can accept no one.
//!
//! `axum::serve` sets neither, so the accept loop is this module's: hyper's connection builder
//! with a header-read timeout (and the same bound on the first bytes, from which hyper learns
//! the protocol), a semaphore of connection slots, and hyper-util's graceful shutdown, which
//! drains the requests in flight as `axum::serve` does.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The limits of one listener.
#[derive(Debug, Clone, Copy)]
pub struct EdgeLimits {
    /// How long a connection may take to send a complete request head, counted from when the
    /// server starts waiting for one: a half-sent head and an idle keep-alive connection are
    /// both closed after it.
    pub header_read_timeout: Duration,
    /// Connections open at once; beyond it a new connection is closed as soon as it is
    /// accepted, while those already open keep working.
    pub max_connections: usize,
}

/// How long the loop waits after an accept error that is not the client's (descriptors
/// exhausted): accepting again at once would only spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves `app` on `listener` within `limits` until `shutdown` resolves, then stops accepting
/// and drains the connections' requests in flight.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: EdgeLimits,
    shutdown: impl Future<Output = ()>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    // Shared by every connection's task, not copied into each.
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            // A connection that failed before it was accepted is the client's affair.
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                tracing::error!(error = %e, "accept failed; backing off");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            // Closed at once: refusing costs no task and keeps no descriptor.
            crate::metrics::connection_refused();
            drop(stream);
            continue;
        };
        // Small responses go out at once, not after Nagle's delay.
        let _ = stream.set_nodelay(true);
        let (builder, app, watcher) = (Arc::clone(&builder), app.clone(), graceful.watcher());
        let first_bytes = limits.header_read_timeout;
        tokio::spawn(async move {
            // hyper's header timer starts once it knows the protocol, which it learns from the
            // first bytes: a connection that sends none is bounded here, by the same timeout.
            let mut first = [0_u8; 1];
            let peeked = tokio::time::timeout(first_bytes, stream.peek(&mut first)).await;
            if !matches!(peeked, Ok(Ok(1))) {
                drop(slot);
                return;
            }
            let service = TowerToHyperService::new(app);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            // A connection's own errors (a reset, a head that timed out) end only it.
            let _ = watcher.watch(connection).await;
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Accept errors about one connection, not the listener: the next accept may well succeed.
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}
