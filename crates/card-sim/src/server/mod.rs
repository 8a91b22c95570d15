//! The `card-sim` HTTP server: the [`InMemoryCardProcessor`] in its own process, so that the
//! service can be killed and restarted while the processor keeps remembering its keys.
//!
//! | Route | Answer |
//! | --- | --- |
//! | `POST /v1/charges` (`Idempotency-Key` required; body `amount`, `currency`, `source`, optional `capture`) | 200 charge (status `succeeded`, or `requires_capture` for `"capture": false`: an authorisation, to capture or void), 402 `card_error`, 500 `api_error`, 409 `processing` while a call under the key is in flight, 409 `idempotency_key_canceled`, 400 |
//! | `GET /v1/charges?idempotency_key=K` | 200 charge made under K, or 404 (also while processing); never creates |
//! | `POST /v1/charges/cancel` (`Idempotency-Key` required) | 200 charge made under the key, 409 `processing`, or 200 `{"status":"canceled"}`: the key is tombstoned |
//! | `POST /v1/refunds` (`Idempotency-Key` required; body `charge`, `amount`, `currency`) | 200 refund, 402 `card_error` with `decline_code` `no_such_charge`, `charge_not_captured` (an authorisation not captured), `refund_declined`, `amount_too_large` (more than remains of what the charge, or the authorisation's capture, took) or `currency_mismatch`, 409 `processing`, 409 `idempotency_key_canceled`, 400 |
//! | `GET /v1/refunds?idempotency_key=K` | 200 refund made under K, or 404 (also while processing); never refunds |
//! | `POST /v1/refunds/cancel` (`Idempotency-Key` required) | 200 refund made under the key, 409 `processing`, or 200 `{"status":"canceled"}`: the key is tombstoned |
//! | `POST /v1/captures` (`Idempotency-Key` required; body `charge`, `amount`, `currency`) | 200 capture, 402 `card_error` with `decline_code` `charge_not_capturable` (unknown, captured when it was made, or another currency), `charge_already_captured`, `charge_canceled` (voided) or `amount_too_large` (more than it authorised), 409 `processing`, 409 `idempotency_key_canceled`, 400 |
//! | `GET /v1/captures?idempotency_key=K` | 200 capture made under K, or 404 (also while processing); never captures |
//! | `POST /v1/captures/cancel` (`Idempotency-Key` required) | 200 capture made under the key, 409 `processing`, or 200 `{"status":"canceled"}`: the key is tombstoned |
//! | `POST /v1/voids` (`Idempotency-Key` required; body `charge`) | 200 void, 402 `card_error` with `decline_code` `charge_not_capturable`, `charge_already_captured` or `charge_canceled`, 409 `processing`, 409 `idempotency_key_canceled`, 400 |
//! | `GET /v1/voids?idempotency_key=K` | 200 void made under K, or 404 (also while processing); never voids |
//! | `POST /v1/voids/cancel` (`Idempotency-Key` required) | 200 void made under the key, 409 `processing`, or 200 `{"status":"canceled"}`: the key is tombstoned |
//! | `POST /v1/payouts` (`Idempotency-Key` required; body `amount`, `currency`, `destination`) | 200 payout, 402 `card_error` with `decline_code` `account_closed` (to `ba_declined`), 409 `processing`, 409 `idempotency_key_canceled`, 400 |
//! | `GET /v1/payouts?idempotency_key=K` | 200 payout made under K, or 404 (also while processing); never pays |
//! | `POST /v1/payouts/cancel` (`Idempotency-Key` required) | 200 payout made under the key, 409 `processing`, or 200 `{"status":"canceled"}`: the key is tombstoned |
//! | `GET /v1/reports/settlement?date=YYYY-MM-DD` | 200 `text/csv`: the header `type,processor_id,processor_key,amount,currency,status,created_at,tenant,resource_id`, then one line per charge (an authorisation is one, `requires_capture`), refund and payout that came into existence that UTC day and is still remembered, in that order; captures and voids are not listed; 400 for a missing or malformed date |
//! | `POST /v1/testing/report/drop` (body `processor_id`) | 204: its line leaves every report, what it made stays; 404 for an id not remembered |
//! | `POST /v1/testing/report/alter` (body `processor_id`, `amount`) | 204: its line shows `amount`; 404 for an id not remembered |
//! | `POST /v1/testing/charges/unsolicited` (body `processor_key`, `amount`, `currency`, optional `tenant` and `resource_id`) | 200 charge made under the key at once, as if by another caller (or what the key already answers, as for `POST /v1/charges`) |
//! | `GET /v1/stats` | `{"charges_created": N, "authorizations_created": A, "captures_created": C, "voids_created": V, "refunds_created": M, "payouts_created": P}`: each counts keys under which something came into existence, forgotten or not; `charges_created` includes the authorisations |
//! | `GET /healthz` | 200 |
//!
//! Every kind of call (charges, refunds, captures, voids, payouts) takes an optional `metadata`
//! object (`{"tenant": ..., "resource_id": ...}`, both or neither), and shows it, with `created`
//! (a Unix timestamp), in its view. An authorisation's captures and voids process as long as a
//! call with its token (`tok_slow`: slowly).
//! Every key is forgotten, with what was made under it, once `CARD_SIM_KEY_WINDOW_SECS` have
//! passed since it settled or was canceled; the report lists only what is still remembered.

mod captures;
mod config;
mod error;
mod payouts;
mod refunds;
mod reports;
mod routes;
mod testing;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::{MethodRouter, get, post};
use payments_domain::{
    ProcessorCapture, ProcessorCharge, ProcessorPayout, ProcessorRefund, ProcessorVoid,
};
use tokio::net::TcpListener;

pub use config::{ConfigError, DEFAULT_BIND, ServerConfig, USAGE};

use crate::InMemoryCardProcessor;
use routes::{Served, Sim};

/// The router over one simulator. Tests and the binary build the same one.
pub fn app(processor: Arc<InMemoryCardProcessor>) -> Router {
    let router = Router::new();
    let router = keyed::<ProcessorCharge>(router, "/v1/charges", post(routes::create_charge));
    let router = keyed::<ProcessorRefund>(router, "/v1/refunds", post(refunds::create_refund));
    let capture = post(captures::create_capture);
    let router = keyed::<ProcessorCapture>(router, "/v1/captures", capture);
    let router = keyed::<ProcessorVoid>(router, "/v1/voids", post(captures::create_void));
    let router = keyed::<ProcessorPayout>(router, "/v1/payouts", post(payouts::create_payout));
    router
        .route("/v1/reports/settlement", get(reports::settlement_report))
        .route("/v1/testing/report/drop", post(testing::drop_line))
        .route("/v1/testing/report/alter", post(testing::alter_line))
        .route(
            "/v1/testing/charges/unsolicited",
            post(testing::unsolicited_charge),
        )
        .route("/v1/stats", get(routes::stats))
        .route("/healthz", get(routes::healthz))
        .fallback(routes::not_found)
        .with_state(processor)
}

/// The routes of one kind of call the simulator keeps keys for: `path` makes (with `create`)
/// and looks up, `path/cancel` cancels; the lookup and the cancel are the shared handlers.
fn keyed<T: Served>(router: Router<Sim>, path: &str, create: MethodRouter<Sim>) -> Router<Sim> {
    router
        .route(path, create.get(routes::find::<T>))
        .route(&format!("{path}/cancel"), post(routes::cancel::<T>))
}

/// Why the server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address is in use, not local, or not permitted.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// The accept loop failed after start-up.
    #[error("server failed: {0}")]
    Serve(#[source] std::io::Error),
}

/// Listens on `config.bind`, announces the address and serves until SIGINT or SIGTERM, then
/// drains the requests in flight.
pub async fn run(config: ServerConfig) -> Result<(), ServeError> {
    let listener = TcpListener::bind(config.bind)
        .await
        .map_err(|source| ServeError::Bind {
            addr: config.bind,
            source,
        })?;
    let address = listener.local_addr().map_err(|source| ServeError::Bind {
        addr: config.bind,
        source,
    })?;
    announce(address);
    tracing::info!(
        %address,
        latency_ms = config.latency.as_millis(),
        key_window_secs = config.key_window.as_secs(),
        "card-sim started"
    );

    let processor = Arc::new(InMemoryCardProcessor::new(
        config.latency,
        config.key_window,
    ));
    axum::serve(listener, app(processor))
        .with_graceful_shutdown(shutdown_signal())
        .await
        .map_err(ServeError::Serve)?;
    tracing::info!("card-sim stopped");
    Ok(())
}

/// Prints the one line other programs parse to find the port: `listening address=<ip:port>`.
/// It goes to stdout, apart from the logs (stderr), so that `RUST_LOG` cannot hide it, and is
/// flushed at once because a reader is waiting for it.
fn announce(address: SocketAddr) {
    let mut stdout = std::io::stdout().lock();
    // A closed stdout must not stop the server; the reader has simply gone.
    let _ = writeln!(stdout, "card-sim listening address={address}");
    let _ = stdout.flush();
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
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
    tracing::info!("shutdown signal received; draining requests in flight");
}
