//! An order service built only on the idempotency engine and its two reusable crates, the SQL
//! record store and the axum adapter: `POST /orders` with an `Idempotency-Key` sends one
//! confirmation mail and writes one order row, and every retry gets the same answer, on
//! PostgreSQL or SQLite, through concurrent duplicates and a crash after the mail was sent.
//!
//!     ORDERS_DATABASE_URL=sqlite://data/orders.db ORDERS_MAIL_URL=http://127.0.0.1:8025 \
//!       cargo run -p orders-example --bin orders
//!
//! What it writes itself: its operation (the mail is the effect, sent under the engine's
//! effect key, so that the mail service sends it at most once), its table and its route.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use payments_idempotency::engine::{
    EffectError, Engine, Idempotent, KeyedRequest, Operation, Owner, Prepared, Preparing,
    ProtocolError, Settled,
};
use payments_idempotency::{IdempotencyPolicy, SchemaVersion, StoredResponse};
use payments_idempotency_axum::{
    IdempotencyKeyHeader, JsonBody, PROBLEM_JSON, PreferWait, Problem, ProtocolProblem, respond,
};
use payments_idempotency_sql::{Connection, Database, PoolSettings, Transaction};
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

/// Runs a statement with its values on either backend's connection: the SQL is the same.
macro_rules! on_either {
    ($connection:expr, $sql:expr $(, $value:expr)*) => {
        match $connection {
            Connection::Postgres(c) => sqlx::query($sql)$(.bind($value))*.execute(c).await.map(drop),
            Connection::Sqlite(c) => sqlx::query($sql)$(.bind($value))*.execute(c).await.map(drop),
        }
    };
}

/// The statuses this service stores as final answers: an order placed, a mail refused.
const STORED_STATUSES: [u16; 2] = [201, 422];

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

    fn confirms(_: &String, _: &Order) -> Result<(), String> {
        Ok(())
    }

    fn declined(&self, _: String, message: String) -> StoredResponse {
        let problem = Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "mail_refused", message);
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        StoredResponse::new(Self::VERSION, 422, [("content-type", PROBLEM_JSON)], body)
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
        let tx = transaction.connection();
        let inserted = on_either!(tx, INSERT_ORDER, &id, email, item, quantity, &message_id);
        inserted.map_err(|e| ProtocolError::Internal(e.into()))?;
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

type App = (Arc<Engine<Transaction>>, Arc<Idempotent<PlaceOrder>>);

async fn place_order(
    State((engine, place)): State<App>,
    IdempotencyKeyHeader(key): IdempotencyKeyHeader,
    PreferWait(wait): PreferWait,
    JsonBody(body): JsonBody,
) -> Response {
    let (sent, order) = match (serde_json::from_slice(&body), serde_json::from_slice(&body)) {
        (Ok(sent), Ok(order @ Order { quantity: 1.., .. })) => (sent, order),
        (_, Err(e)) => return invalid(e.to_string()),
        _ => return invalid("the quantity must be at least 1".to_owned()),
    };
    // One tenant: this service's keys are all its own.
    let request = KeyedRequest::of::<PlaceOrder>("orders".into(), key, order, &sent, wait);
    match engine.run(&place, request).await {
        Ok(answer) => respond(answer, &STORED_STATUSES),
        Err(error) => ProtocolProblem(error).into_response(),
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

#[tokio::main]
async fn main() -> Result<(), String> {
    let url = setting("ORDERS_DATABASE_URL", None)?;
    let database = Database::parse(&url).map_err(|e| format!("ORDERS_DATABASE_URL: {e}"))?;
    let lock = setting("ORDERS_LOCK_TIMEOUT_SECS", Some("30"))?;
    let lock = lock
        .parse()
        .map_err(|e| format!("ORDERS_LOCK_TIMEOUT_SECS: {e}"));
    let day = Duration::from_secs(86_400);
    let policy = IdempotencyPolicy::new(day, Duration::from_secs(lock?), 7 * day);
    let policy = policy.map_err(|e| format!("ORDERS_LOCK_TIMEOUT_SECS: {e}"))?;
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
    let created = on_either!(write.connection(), ORDERS_TABLE);
    created.map_err(|e| format!("the orders table: {e}"))?;
    write.commit().await.map_err(|e| e.to_string())?;
    let mail_url = setting("ORDERS_MAIL_URL", None)?;
    let place = PlaceOrder {
        mail: reqwest::Client::new(),
        mail_url,
    };
    let place = Arc::new(Idempotent::new(place));
    let engine = Engine::new(Arc::new(records)).with_operation(Arc::clone(&place));
    let router = axum::Router::new()
        .route("/orders", axum::routing::post(place_order))
        .with_state((Arc::new(engine), place));
    let listen = setting("ORDERS_LISTEN", Some("127.0.0.1:8090"))?;
    let listener = tokio::net::TcpListener::bind(&listen).await;
    let listener = listener.map_err(|e| format!("ORDERS_LISTEN {listen}: {e}"))?;
    println!("orders listening on {listen}");
    let served = axum::serve(listener, router).await;
    served.map_err(|e| e.to_string())
}
