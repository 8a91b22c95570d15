//! The listener's edge, before any request exists: how many connections one instance keeps
//! open, and how long a connection may stay open with no request in flight. Without these, one
//! client that opens connections and never finishes a request holds a descriptor and a task
//! each, for ever, until the instance can accept no one.
//!
//! The listener speaks HTTP/1.1 and, over cleartext with prior knowledge, HTTP/2 (what a load
//! balancer that multiplexes to its backends sends). Both are bounded by one rule, kept here
//! rather than in hyper's per-protocol settings because hyper bounds only HTTP/1's request
//! head: **a connection with no request in flight for `header_read_timeout` is closed**. That
//! one rule covers a connection that sends nothing, a half-sent HTTP/1 head, an HTTP/2
//! preface, SETTINGS or HEADERS frame that never completes a request, and an idle keep-alive
//! connection of either protocol. A request is in flight from when its head has arrived until
//! its response's body is done; its own body and its handler are bounded by the request's
//! timeouts (`server.body_timeout_ms`, `server.request_timeout_ms`). HTTP/2 adds a cap on
//! concurrent streams per connection and keep-alive pings that close a connection whose peer
//! has gone. Every connection, of either protocol, takes one of `max_connections` slots.
//!
//! `axum::serve` sets none of this, so the accept loop is this module's: hyper's connection
//! builder, a semaphore of connection slots, and a shutdown that stops accepting and drains
//! the requests in flight, as `axum::serve` does.

use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tower::ServiceExt;

/// The limits of one listener.
#[derive(Debug, Clone, Copy)]
pub struct EdgeLimits {
    /// How long a connection may stay open with no request in flight: from when it is
    /// accepted, and from when its last response was sent. A half-sent request head (of
    /// either protocol) and an idle keep-alive connection are both closed after it.
    pub header_read_timeout: Duration,
    /// Connections open at once; beyond it a new connection is closed as soon as it is
    /// accepted, while those already open keep working.
    pub max_connections: usize,
}

/// Requests one HTTP/2 connection may have in flight at once (its `SETTINGS_MAX_CONCURRENT_
/// STREAMS`): one connection cannot hold more of the instance's in-flight slots than this.
const MAX_STREAMS_PER_CONNECTION: u32 = 100;

/// How long a connection being closed (idle, or at shutdown once its requests are done) may
/// take to say goodbye (HTTP/2's GOAWAY) before it is dropped: a peer that stalls even that,
/// or an HTTP/2 handshake that never completes, does not hold its slot any longer.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

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
    // hyper's own HTTP/1 head timeout says the same as the idle rule, and needs its timer.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .keep_alive_interval(limits.header_read_timeout)
        .keep_alive_timeout(limits.header_read_timeout);
    // Shared by every connection's task, not copied into each.
    let builder = Arc::new(builder);
    // `true` once the service is stopping; every connection's task holds a receiver, so the
    // sender's `closed()` is when the last one has finished.
    let (stopping, stop_watch) = watch::channel(false);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut shutdown = pin!(shutdown);
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
        let (builder, app, stop_watch) = (Arc::clone(&builder), app.clone(), stop_watch.clone());
        tokio::spawn(async move {
            serve_connection(&builder, stream, app, limits, stop_watch).await;
            drop(slot);
        });
    }
    drop(listener);
    let _ = stopping.send(true);
    drop(stop_watch);
    stopping.closed().await;
}

/// Serves one connection until it ends, is idle for `header_read_timeout`, or the service
/// stops; then closes it gracefully, letting its requests in flight finish.
async fn serve_connection(
    builder: &auto::Builder<TokioExecutor>,
    stream: TcpStream,
    app: Router,
    limits: EdgeLimits,
    mut stop_watch: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity::new());
    let counted = Arc::clone(&activity);
    let service = tower::service_fn(move |request: Request<Incoming>| {
        let request_in_flight = InFlight::start(&counted);
        let app = app.clone();
        async move {
            let response = app.oneshot(request).await?;
            // Counted until the body is done or dropped, not merely until the head is ready.
            Ok::<_, Infallible>(response.map(|body| {
                Body::new(body.map_frame(move |frame| {
                    let _held = &request_in_flight;
                    frame
                }))
            }))
        }
    });
    let connection =
        builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
    let mut connection = pin!(connection);
    tokio::select! {
        // A connection's own errors (a reset, a head that timed out) end only it.
        _ = connection.as_mut() => return,
        () = idle_for(&activity, limits.header_read_timeout) => {}
        () = stopped(&mut stop_watch) => {}
    }
    connection.as_mut().graceful_shutdown();
    tokio::select! {
        _ = connection.as_mut() => {}
        // Requests in flight finish; a peer that then stalls the close is dropped.
        () = idle_for(&activity, CLOSE_GRACE) => {}
    }
}

/// Resolves once no request has been in flight on the connection for `timeout` in a row.
///
/// It looks only when a deadline comes due, never at each request: a request costs the
/// connection two atomic updates and no wake-up.
async fn idle_for(activity: &Activity, timeout: Duration) {
    loop {
        let now = Instant::now();
        let deadline = match activity.idle_since() {
            // Busy: nothing can be due before a timeout from now.
            None => now + timeout,
            Some(since) if now >= since + timeout => return,
            Some(since) => since + timeout,
        };
        tokio::time::sleep_until(deadline).await;
    }
}

/// Resolves once the service is stopping.
async fn stopped(stop_watch: &mut watch::Receiver<bool>) {
    // The sender outlives every connection's task: it waits for them all.
    let _ = stop_watch.wait_for(|stopping| *stopping).await;
}

/// What a connection's requests are doing: how many are in flight, and when the last one
/// ended (or the connection opened), in milliseconds since it opened.
struct Activity {
    opened: Instant,
    in_flight: AtomicUsize,
    last_ended_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_ended_ms: AtomicU64::new(0),
        }
    }

    /// Since when nothing has been in flight; `None` while a request is.
    fn idle_since(&self) -> Option<Instant> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let ended = Duration::from_millis(self.last_ended_ms.load(Ordering::SeqCst));
        Some(self.opened + ended)
    }
}

/// One request in flight on a connection, counted until dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(activity))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let activity = &self.0;
        // The time first: whoever sees the count reach zero sees when it did.
        let ended = u64::try_from(activity.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        activity.last_ended_ms.fetch_max(ended, Ordering::SeqCst);
        activity.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_only_once_nothing_is_in_flight_for_the_whole_timeout() {
        let activity = Arc::new(Activity::new());
        let timeout = Duration::from_secs(10);
        let request = InFlight::start(&activity);
        let started = Instant::now();
        let idle = tokio::spawn({
            let activity = Arc::clone(&activity);
            async move { idle_for(&activity, timeout).await }
        });
        // A request in flight for 30 s keeps the connection busy throughout.
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(!idle.is_finished());
        drop(request);
        // A second request 5 s later starts the count again when it ends.
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(InFlight::start(&activity));
        idle.await.expect("idle");
        assert_eq!(started.elapsed(), Duration::from_secs(45));
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_never_sends_a_request_is_idle_after_the_timeout() {
        let activity = Activity::new();
        let started = Instant::now();
        idle_for(&activity, Duration::from_secs(10)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }
}
