//! An order service built only on the idempotency engine and its two reusable crates, the SQL
//! record store and the axum adapter: `POST /orders` with an `Idempotency-Key` sends one
//! confirmation mail and writes one order row, and every retry gets the same answer, on
//! PostgreSQL or SQLite, through concurrent duplicates and a crash after the mail was sent.
//!
//!     ORDERS_DATABASE_URL=sqlite://data/orders.db ORDERS_MAIL_URL=http://127.0.0.1:8025 \
//!       cargo run -p orders-example --bin orders
//!
//! What it writes itself: its operation (the mail is the effect, sent under the engine's
//! effect key, so that the mail service sends it at most once), its table and its route. What
//! it starts from the kit: attempts that outlive their client ([`Attempts`]), the completer
//! that settles an order whose attempt died ([`Completer`]), and the records' upkeep, which
//! reaps them past their retention ([`Upkeep`]); at SIGTERM it drains its requests, waits for
//! the attempts in flight, then stops the rest.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use payments_idempotency::engine::{
    Completer, CompleterSettings, EffectError, Engine, Idempotent, KeyedRequest, Operation, Owner,
    Prepared, Preparing, ProtocolError, Settled, StoreFailure,
};
use payments_idempotency::{IdempotencyPolicy, SchemaVersion, StoredResponse};
use payments_idempotency_axum::{
    Attempts, IdempotencyKeyHeader, JsonBody, PreferWait, Problem, ProtocolProblem, respond,
};
use payments_idempotency_sql::{Database, PoolSettings, Transaction, Upkeep, UpkeepSettings};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The one table, plain enough to be the same SQL on PostgreSQL and SQLite. The order's id is
/// its record's generation, so every attempt of one order writes the same row.
const ORDERS_TABLE: &str = "
CREATE TABLE IF NOT EXISTS orders (
    id         text    PRIMARY KEY,
    email      text    NOT NULL,
    item       text    NOT NULL,
    quantity   integer NOT NULL CHECK (quantity > 0),
    message_id text    NOT NULL UNIQUE)";

const INSERT_ORDER: &str =
    "INSERT INTO orders (id, email, item, quantity, message_id) VALUES ($1, $2, $3, $4, $5)";

/// The statuses this service stores as final answers: an order placed, a mail refused, and a
/// mail sent whose order the database refused for good (kept for an operator).
const STORED_STATUSES: [u16; 3] = [201, 422, 500];

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Order {
    email: String,
    item: String,
    quantity: u32,
}

/// `POST /orders`: the mail is the effect; the order row is written in the transaction the
/// engine completes the record in.
#[derive(Debug)]
struct PlaceOrder {
    mail: reqwest::Client,
    mail_url: String,
}

#[async_trait]
impl Operation for PlaceOrder {
    type Request = Order;
    type Plan = Order;
    /// The mail service's id of the message.
    type Effect = String;
    type Transaction = Transaction;

    const FAMILY: &'static str = "orders.place";
    const VERSION: SchemaVersion = SchemaVersion::new(1);
    const EFFECT: &'static str = "mail";
    const ROUTE: (&'static str, &'static str) = ("POST", "/orders");

    fn canonical_request(order: &Order) -> Value {
        json!(order)
    }

    fn stored_request(&self, body: &[u8]) -> Option<Order> {
        serde_json::from_slice(body).ok()
    }

    async fn prepare(
        &self,
        _: &mut Preparing<'_, Transaction>,
        _: Owner<'_>,
        order: &Order,
    ) -> Result<Prepared<Order>, ProtocolError> {
        Ok(Prepared::Ready(order.clone()))
    }

    /// Sends the confirmation under the effect key: the mail service sends one message per key.
    async fn effect(&self, order: &Order, effect_key: &str) -> Result<String, EffectError> {
        let mail = json!({ "to": order.email, "subject": format!("Your order: {}", order.item) });
        let url = format!("{}/messages", self.mail_url);
        let request = self.mail.post(url).header("idempotency-key", effect_key);
        let sent = request.json(&mail).send().await.map_err(unavailable)?;
        match sent.status() {
            status if status.is_success() => message_id(sent).await,
            status if status.is_client_error() => Err(EffectError::Declined {
                code: "mail_refused".to_owned(),
                message: format!("the mail service refused the message ({status})"),
            }),
            status => Err(unavailable(status)),
        }
    }

    /// What the mail service made under the key; it tombstones a key it never saw.
    async fn settle(&self, effect_key: &str) -> Result<Settled<String>, EffectError> {
        let url = format!("{}/messages/{effect_key}", self.mail_url);
        let found = self.mail.get(url).send().await.map_err(unavailable)?;
        match found.status() {
            StatusCode::OK => Ok(Settled::Exists(message_id(found).await?)),
            StatusCode::ACCEPTED => Ok(Settled::StillProcessing),
            StatusCode::NOT_FOUND => Ok(Settled::Tombstoned),
            status => Err(unavailable(status)),
        }
    }

    fn effect_id(message_id: &String) -> String {
        message_id.clone()
    }

    async fn finish(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        order: &Order,
        message_id: String,
    ) -> Result<StoredResponse, ProtocolError> {
        let id = format!("ord_{}", owner.fence.generation.simple());
        let (email, item, quantity) = (&order.email, &order.item, i64::from(order.quantity));
        let insert = sqlx::query(INSERT_ORDER).bind(&id).bind(email).bind(item);
        let insert = insert.bind(quantity).bind(&message_id);
        // A row the database refuses for good (a constraint) is a store failure the engine
        // ends the record on, with its `unrecorded` answer: no retry could write it.
        transaction
            .execute(insert)
            .await
            .map_err(StoreFailure::from)?;
        let body = json!({ "id": id, "status": "confirmed", "email": order.email,
            "item": order.item, "quantity": order.quantity, "message_id": message_id });
        let (json, body) = ([("content-type", "application/json")], body.to_string());
        let body = body.into_bytes();
        Ok(StoredResponse::new(Self::VERSION, 201, json, body))
    }
}

fn unavailable(reason: impl ToString) -> EffectError {
    let reason = reason.to_string();
    EffectError::Unavailable { reason }
}

async fn message_id(answer: reqwest::Response) -> Result<String, EffectError> {
    let body: Value = answer.json().await.map_err(unavailable)?;
    let id = body["id"].as_str().map(str::to_owned);
    id.ok_or_else(|| unavailable("no message id"))
}

#[derive(Debug, Clone)]
struct App {
    engine: Arc<Engine<Transaction>>,
    place: Arc<Idempotent<PlaceOrder>>,
    attempts: Attempts,
}

async fn place_order(
    State(app): State<App>,
    IdempotencyKeyHeader(key): IdempotencyKeyHeader,
    PreferWait(wait): PreferWait,
    JsonBody(body): JsonBody,
) -> Response {
    let order = match serde_json::from_slice(&body) {
        Ok(order @ Order { quantity: 1.., .. }) => order,
        Ok(_) => return invalid("the quantity must be at least 1".to_owned()),
        Err(e) => return invalid(e.to_string()),
    };
    // One tenant: this service's keys are all its own.
    let request = KeyedRequest::of::<PlaceOrder>("orders".into(), key, order, wait);
    // On a task of its own: a client that goes away ends only its wait, and the mail it asked
    // for is still recorded as its order.
    let (engine, place) = (Arc::clone(&app.engine), Arc::clone(&app.place));
    let attempt = async move { engine.run(&place, request).await };
    match app.attempts.run(attempt).await {
        Ok(Ok(answer)) => respond(answer, &STORED_STATUSES),
        Ok(Err(error)) => ProtocolProblem(error).into_response(),
        Err(stopped) => {
            let status = StatusCode::SERVICE_UNAVAILABLE;
            Problem::new(status, "shutting_down", stopped.to_string()).into_response()
        }
    }
}

fn invalid(detail: String) -> Response {
    Problem::new(StatusCode::BAD_REQUEST, "invalid_request", detail).into_response()
}

/// A setting from the environment; a start-up error names it.
fn setting(name: &str, default: Option<&str>) -> Result<String, String> {
    let value = std::env::var(name).ok().or(default.map(str::to_owned));
    value.ok_or(format!("{name} is not set"))
}

/// A duration setting, in milliseconds, more than zero.
fn millis(name: &str, default: u64) -> Result<Duration, String> {
    let value = setting(name, Some(&default.to_string()))?;
    match value.parse() {
        Ok(0) => Err(format!("{name}: must be more than 0")),
        Ok(ms) => Ok(Duration::from_millis(ms)),
        Err(e) => Err(format!("{name}: {e}")),
    }
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .unwrap_or_else(|e| panic!("cannot listen for SIGTERM: {e}"));
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let url = setting("ORDERS_DATABASE_URL", None)?;
    let database = Database::parse(&url).map_err(|e| format!("ORDERS_DATABASE_URL: {e}"))?;
    let lock = millis("ORDERS_LOCK_TIMEOUT_MS", 30_000)?;
    let retention = millis("ORDERS_RETENTION_MS", 86_400_000)?;
    let policy = IdempotencyPolicy::new(retention, lock, retention);
    let policy = policy.map_err(|e| format!("ORDERS_RETENTION_MS: {e}"))?;
    // The completer asks the mail service about an order only once any send made under the
    // order's lock has ended: the mail client gives up after `mail_timeout`.
    let mail_timeout = millis("ORDERS_MAIL_TIMEOUT_MS", 10_000)?;
    let completer = CompleterSettings {
        interval: millis("ORDERS_COMPLETER_INTERVAL_MS", 1_000)?,
        settle_after: millis("ORDERS_SETTLE_AFTER_MS", 15_000)?,
        ..CompleterSettings::default()
    };
    if completer.settle_after <= mail_timeout {
        let reason = "must be longer than ORDERS_MAIL_TIMEOUT_MS";
        return Err(format!("ORDERS_SETTLE_AFTER_MS: {reason}"));
    }
    let upkeep = UpkeepSettings {
        reap_interval: millis("ORDERS_REAPER_INTERVAL_MS", 60_000)?,
        ..UpkeepSettings::default()
    };
    let settings = PoolSettings {
        max_connections: 16,
        acquire_timeout: Duration::from_secs(5),
        statement_timeout: Duration::from_secs(10),
        lock_timeout: Duration::from_secs(1),
        idle_in_transaction_timeout: Duration::from_secs(10),
    };
    let records = database.open(&settings, policy).await;
    let records = records.map_err(|e| format!("ORDERS_DATABASE_URL: {e}"))?;
    records
        .create_schema()
        .await
        .map_err(|e| format!("the records table: {e}"))?;
    let mut write = records.begin_write().await.map_err(|e| e.to_string())?;
    let created = write.execute(sqlx::query(ORDERS_TABLE)).await;
    created.map_err(|e| format!("the orders table: {e}"))?;
    write.commit().await.map_err(|e| e.to_string())?;
    let mail_url = setting("ORDERS_MAIL_URL", None)?;
    let mail = reqwest::Client::builder().timeout(mail_timeout).build();
    let mail = mail.map_err(|e| format!("ORDERS_MAIL_URL: {e}"))?;
    let place = Arc::new(Idempotent::new(PlaceOrder { mail, mail_url }));
    let engine = records.engine().with_operation(Arc::clone(&place));
    let engine = Arc::new(engine);

    // The kit's background work, until shutdown: the completer and the records' upkeep.
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let completer = Completer::new(Arc::clone(&engine), completer);
    let upkeep = Upkeep::new(records, upkeep);
    let background = tokio::spawn(async move {
        tokio::join!(completer.run(shutdown.clone()), upkeep.run(shutdown));
    });

    let attempts = Attempts::new();
    let app = App {
        engine,
        place,
        attempts: attempts.clone(),
    };
    let router = axum::Router::new()
        .route("/orders", axum::routing::post(place_order))
        .with_state(app);
    let listen = setting("ORDERS_LISTEN", Some("127.0.0.1:8090"))?;
    let listener = tokio::net::TcpListener::bind(&listen).await;
    let listener = listener.map_err(|e| format!("ORDERS_LISTEN {listen}: {e}"))?;
    println!("orders listening on {listen}");
    let served = axum::serve(listener, router).with_graceful_shutdown(shutdown_signal());
    served.await.map_err(|e| e.to_string())?;
    // The requests are drained; the attempts whose clients left run to their end.
    attempts.wait_for_all().await;
    let _ = stop.send(true);
    background.await.map_err(|e| e.to_string())?;
    println!("orders stopped");
    Ok(())
}
