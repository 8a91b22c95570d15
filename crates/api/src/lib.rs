//! The payments HTTP service: `POST /charges` with exactly-once idempotency keys, charge and
//! ledger reads, health checks.
//!
//! This crate owns everything HTTP: routing, authentication, request parsing, the mapping of
//! every error to one RFC 9457 problem response, configuration and telemetry. It also holds
//! the operations the exactly-once engine runs (`operations`), a module each with its
//! resource's routes, body and view; what the engine calls of an operation (its effect, its
//! finish) knows no HTTP. The engine, its protocol data and `decide()` live in
//! `payments-idempotency`, the rules in `payments-domain`, the SQL in `payments-storage`;
//! this crate converts between HTTP and those types at the edge.

mod admission;
mod auth;
pub mod config;
mod config_file;
mod edge;
mod error;
mod events_tail;
mod extract;
mod failpoint;
mod handling;
mod metrics;
mod operations;
mod reconcile;
mod replay;
mod routes;
mod state;
mod telemetry;
mod views;
mod workers;

use std::sync::Arc;
use std::time::Duration;

use payments_card_sim::{HttpCardProcessor, InMemoryCardProcessor};
use payments_redis::{EventStream, RedisLink, ReplayCache, SentinelPasswords};
use payments_storage::{Backend, Durability};
use secrecy::{ExposeSecret, SecretString};
use tokio::net::TcpListener;

pub use auth::ApiKeys;
pub use error::{ApiError, Decline};
pub use events_tail::tail_events;
pub use routes::app;
pub use state::AppState;

use crate::config::{RedisServer, Settings, StartupError, ValidRedis, ValidSettings};
use crate::operations::Processor;

/// Loads the configuration, prepares the database and serves until SIGINT or SIGTERM.
pub async fn run() -> Result<(), StartupError> {
    let settings = Settings::load()?.validate()?;
    telemetry::init(&settings.log, telemetry::LogTo::Stdout);
    if let Some(demo_keys) = settings.demo_keys_exposed {
        tracing::warn!(
            bind = %settings.bind,
            "the public demo keys ({demo_keys}) are accepted on a non-loopback address \
             (auth.allow_demo_keys = true): anyone who can reach it can act with them"
        );
    }

    let store = open_store(&settings).await?;
    let (processor, processor_name) = processor(&settings)?;
    let mut cache = None;
    let mut events = None;
    if let Some(ValidRedis {
        settings: redis,
        cache_secret,
        server,
    }) = &settings.redis
    {
        let link = |timeout_ms| {
            let timeout = Duration::from_millis(timeout_ms);
            let (link, key) = match server {
                RedisServer::Url(url) => (RedisLink::new(url, timeout), "redis.url"),
                RedisServer::Sentinel { master, sentinels } => (
                    RedisLink::through_sentinels(
                        sentinels,
                        master,
                        SentinelPasswords {
                            master: non_empty(&redis.password),
                            sentinels: non_empty(&redis.sentinel_password),
                        },
                        timeout,
                    ),
                    "redis.sentinels",
                ),
            };
            link.map_err(|e| StartupError::Invalid {
                key,
                reason: e.to_string(),
            })
        };
        // Two links: a request must give up on the cache within milliseconds, while the relay
        // may wait for a whole batch to be accepted. Apart, neither's timeout drops the other's
        // connection, and no request queues behind a large pipeline.
        cache = Some(ReplayCache::new(
            link(redis.timeout_ms)?,
            redis.key_prefix.clone(),
            cache_secret.clone(),
        ));
        events = Some(EventStream::new(
            link(redis.stream_timeout_ms)?,
            redis.stream.clone(),
            redis.stream_max_len,
        ));
    }
    let mut state = AppState::new(
        store,
        processor,
        settings.api_keys.clone(),
        settings.limits,
        settings.recent_answers_bytes,
        cache,
        settings.authorization_window,
    );
    state.events = events.map(Arc::new);
    state.metrics = metrics::install();
    state
        .store
        .records()
        .observe_commits(Arc::new(metrics::CommitMetrics));
    // Said once at start, and by `/readyz` each time it is asked: whether a commit the service
    // acknowledges survives a failover to a standby.
    let durability = state.store.durability().await.map_err(|e| {
        StartupError::Database(format!(
            "cannot read the durability of {}: {}",
            settings.database.describe(),
            error_chain(&e)
        ))
    })?;
    metrics::record_durability(durability);
    if durability == Durability::Local && state.store.backend() == Backend::Postgres {
        tracing::warn!(
            "acknowledged commits wait for no standby (synchronous_standby_names is empty or \
             synchronous_commit does not wait): a failover to a standby that is behind can lose \
             charges the service already answered for"
        );
    }
    let redis_name = settings.redis.as_ref().map_or_else(
        || "disabled".to_owned(),
        |r| match &r.server {
            RedisServer::Url(url) => without_credentials(url),
            RedisServer::Sentinel { master, sentinels } => {
                let at: Vec<String> = sentinels.iter().map(|(h, p)| format!("{h}:{p}")).collect();
                format!("{master} through the Sentinels at {}", at.join(", "))
            }
        },
    );

    let (listener, address) = listen("server.bind", settings.bind).await?;
    let metrics_listener = match settings.metrics_bind {
        Some(addr) => Some(listen("server.metrics_bind", addr).await?),
        None => None,
    };
    let metrics_address = metrics_listener
        .as_ref()
        .map_or_else(|| "disabled".to_owned(), |(_, address)| address.to_string());
    tracing::info!(%address, metrics = %metrics_address, database = %settings.database.describe(),
        durability = durability.name(), processor = %processor_name, redis = %redis_name,
        "listening");

    // One shutdown signal stops the servers (after draining requests) and then the workers.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop.send(true);
    });
    let until_stopped = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        payments_idempotency::lifecycle::stopped(&mut stopped).await;
    };
    let (stop_workers, workers_stopped) = tokio::sync::watch::channel(false);
    let workers = workers::spawn(state.clone(), settings.workers, workers_stopped);
    let edge = settings.edge;
    let metrics_server = metrics_listener.map(|(listener, _)| {
        let serve = edge::serve(
            listener,
            routes::metrics_app(state.clone()),
            edge,
            until_stopped(stopped.clone()),
        );
        tokio::spawn(serve)
    });
    let attempts = state.attempts.clone();
    edge::serve(listener, app(state), edge, until_stopped(stopped)).await;
    if let Some(metrics_server) = metrics_server {
        let _ = metrics_server.await;
    }
    // Attempts whose clients went away run to their end, as those of the drained requests did.
    attempts.wait_for_all().await;
    let _ = stop_workers.send(true);
    for worker in workers {
        let _ = worker.await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// Opens the database the settings name, migrated.
async fn open_store(
    settings: &ValidSettings,
) -> Result<Arc<dyn payments_storage::Store>, StartupError> {
    payments_storage::open_store(&settings.database, &settings.pool, settings.policy)
        .await
        .map_err(|e| {
            StartupError::Database(format!(
                "cannot open {}: {}",
                settings.database.describe(),
                error_chain(&e)
            ))
        })
}

/// The processor the settings name (card-sim over HTTP, or the in-process simulator), and its
/// name for the start-up line.
fn processor(settings: &ValidSettings) -> Result<(Arc<dyn Processor>, String), StartupError> {
    Ok(match &settings.processor_url {
        Some(url) => {
            let client = HttpCardProcessor::new(url, settings.processor_timeout).map_err(|e| {
                StartupError::Invalid {
                    key: "processor.url",
                    reason: e.to_string(),
                }
            })?;
            (Arc::new(client), format!("card-sim at {url}"))
        }
        None => (
            Arc::new(InMemoryCardProcessor::new(
                Duration::ZERO,
                settings.processor_key_window,
            )),
            "in-process simulator".to_owned(),
        ),
    })
}

/// Why a command other than serving stopped.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(transparent)]
    Startup(#[from] StartupError),
    #[error("reconciliation: {0}")]
    Reconcile(String),
}

/// How `payments-api reconcile` ended, when it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconciled {
    /// Every item matched, or was settled, or is in flight.
    Clean,
    /// Some items are exceptions, kept for an operator.
    Exceptions,
}

/// `payments-api reconcile --date YYYY-MM-DD [--json]`: reconciles the day against the
/// processor's settlement report, keeps the run, and prints it as a table or as JSON.
pub async fn reconcile(date: chrono::NaiveDate, json: bool) -> Result<Reconciled, CommandError> {
    let settings = Settings::load()?.validate()?;
    telemetry::init(&settings.log, telemetry::LogTo::Stderr);
    let store = open_store(&settings).await?;
    let (processor, _) = processor(&settings)?;
    let state = AppState::new(
        store,
        processor,
        settings.api_keys.clone(),
        settings.limits,
        0,
        None,
        settings.authorization_window,
    );
    let run = state
        .reconciler()
        .run(date)
        .await
        .map_err(|e| CommandError::Reconcile(error_chain(&e)))?;
    if json {
        println!("{}", run.to_json());
    } else {
        print!("{}", run.to_table());
    }
    Ok(if run.exceptions() > 0 {
        Reconciled::Exceptions
    } else {
        Reconciled::Clean
    })
}

/// A listener on `addr`, the setting `key` names, and the address it got (port 0 picks one).
async fn listen(
    key: &'static str,
    addr: std::net::SocketAddr,
) -> Result<(TcpListener, std::net::SocketAddr), StartupError> {
    let failed = |e: std::io::Error| StartupError::Bind {
        key,
        addr,
        reason: e.to_string(),
    };
    let listener = TcpListener::bind(addr).await.map_err(failed)?;
    let address = listener.local_addr().map_err(failed)?;
    Ok((listener, address))
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM; in-flight requests are then drained.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}

/// A URL with any `user:password@` replaced, for logs.
/// The secret, or `None` when it is empty.
fn non_empty(secret: &SecretString) -> Option<&str> {
    Some(secret.expose_secret()).filter(|s| !s.is_empty())
}

fn without_credentials(url: &str) -> String {
    match (url.split_once("://"), url.rfind('@')) {
        (Some((scheme, _)), Some(at)) => format!("{scheme}://***{}", &url[at..]),
        _ => url.to_owned(),
    }
}

/// An error and its sources on one line, for logs and start-up messages.
pub(crate) use payments_idempotency::engine::error_chain;

#[cfg(test)]
mod tests {
    use super::without_credentials;

    #[test]
    fn credentials_are_hidden_from_logged_urls() {
        assert_eq!(
            without_credentials("redis://user:secret@cache:6379/0"),
            "redis://***@cache:6379/0"
        );
        assert_eq!(
            without_credentials("redis://cache:6379"),
            "redis://cache:6379"
        );
    }
}
