//! A test operation for the group commits' tests on both backends: `Check`, whose rows
//! reference a parent row, checked only at the commit (a deferred foreign key), so that a
//! request naming a parent that does not exist fails the commit it is in. Its effect port makes
//! one effect per effect key, and holds every call until the test lets them go.

use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use payments_idempotency::engine::{
    EffectError, FinishesInBatches, Operation, Owner, Prepared, Preparing, ProtocolError, Settled,
};
use payments_idempotency::{SchemaVersion, StoredResponse};
use payments_idempotency_sql::{Connection, Transaction};
use serde_json::{Value, json};
use tokio::sync::watch;

#[derive(Debug)]
pub(crate) struct Check {
    /// The calls that reached the effect port.
    pub(crate) arrived: AtomicUsize,
    /// The finishes whose rows were made, each just before it queues.
    pub(crate) rows_made: AtomicUsize,
    go: watch::Receiver<bool>,
}

impl Check {
    /// A `Check` whose effect calls wait until `go` is true.
    pub(crate) fn new(go: watch::Receiver<bool>) -> Self {
        Self {
            arrived: AtomicUsize::new(0),
            rows_made: AtomicUsize::new(0),
            go,
        }
    }
}

/// Its tables, and the one parent that exists.
pub(crate) const TABLES: [&str; 3] = [
    "CREATE TABLE parents (id text PRIMARY KEY)",
    "CREATE TABLE checks (effect_id text PRIMARY KEY,
                          parent text NOT NULL REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED)",
    "INSERT INTO parents (id) VALUES ('present')",
];

/// One check's row.
const INSERT_CHECK: &str = "INSERT INTO checks (effect_id, parent) VALUES ($1, $2)";

/// The rows of a batch of checks, in one statement (PostgreSQL).
const INSERT_CHECKS: &str = "
INSERT INTO checks (effect_id, parent)
SELECT effect_id, parent FROM UNNEST($1::text[], $2::text[]) AS c(effect_id, parent)";

/// A 201 with `body`.
pub(crate) fn response(body: &Value) -> StoredResponse {
    let json = [("content-type", "application/json")];
    StoredResponse::new(
        SchemaVersion::new(1),
        201,
        json,
        body.to_string().into_bytes(),
    )
}

fn internal(error: sqlx::Error) -> ProtocolError {
    ProtocolError::Internal(error.into())
}

#[async_trait]
impl Operation for Check {
    type Request = String;
    type Plan = String;
    type Effect = String;
    type Transaction = Transaction;

    const FAMILY: &'static str = "checks.create";
    const VERSION: SchemaVersion = SchemaVersion::new(1);
    const EFFECT: &'static str = "check";
    const ROUTE: (&'static str, &'static str) = ("POST", "/checks");

    fn canonical_request(parent: &String) -> Value {
        json!({ "parent": parent })
    }

    fn stored_request(&self, body: &[u8]) -> Option<String> {
        let body: Value = serde_json::from_slice(body).ok()?;
        Some(body["parent"].as_str()?.to_owned())
    }

    async fn prepare(
        &self,
        _: &mut Preparing<'_, Transaction>,
        _: Owner<'_>,
        parent: &String,
    ) -> Result<Prepared<String>, ProtocolError> {
        Ok(Prepared::Ready(parent.clone()))
    }

    async fn effect(&self, _: &String, effect_key: &str) -> Result<String, EffectError> {
        self.arrived.fetch_add(1, Ordering::SeqCst);
        let mut go = self.go.clone();
        let _ = go.wait_for(|go| *go).await;
        Ok(format!("effect-{effect_key}"))
    }

    async fn settle(&self, effect_key: &str) -> Result<Settled<String>, EffectError> {
        Ok(Settled::Exists(format!("effect-{effect_key}")))
    }

    fn effect_id(id: &String) -> String {
        id.clone()
    }

    fn confirms(_: &String, _: &String) -> Result<(), String> {
        Ok(())
    }

    fn declined(&self, code: String, _: String) -> StoredResponse {
        response(&json!({ "declined": code }))
    }

    async fn finish(
        &self,
        transaction: &mut Transaction,
        owner: Owner<'_>,
        parent: &String,
        effect_id: String,
    ) -> Result<StoredResponse, ProtocolError> {
        let (rows, response) = self.rows(owner, parent, effect_id)?;
        self.write_rows(transaction, &[&rows]).await?;
        Ok(response)
    }
}

#[async_trait]
impl FinishesInBatches for Check {
    /// The effect id and the parent.
    type Rows = (String, String);

    fn rows(
        &self,
        _: Owner<'_>,
        parent: &String,
        effect_id: String,
    ) -> Result<((String, String), StoredResponse), ProtocolError> {
        self.rows_made.fetch_add(1, Ordering::SeqCst);
        let response = response(&json!({ "effect_id": effect_id }));
        Ok(((effect_id, parent.clone()), response))
    }

    async fn write_rows(
        &self,
        transaction: &mut Transaction,
        rows: &[&(String, String)],
    ) -> Result<(), ProtocolError> {
        match transaction.connection() {
            Connection::Postgres(connection) => {
                let (effect_ids, parents): (Vec<&str>, Vec<&str>) = rows
                    .iter()
                    .map(|(effect_id, parent)| (effect_id.as_str(), parent.as_str()))
                    .unzip();
                sqlx::query(INSERT_CHECKS)
                    .bind(effect_ids)
                    .bind(parents)
                    .execute(connection)
                    .await
                    .map_err(internal)?;
            }
            Connection::Sqlite(connection) => {
                for (effect_id, parent) in rows {
                    sqlx::query(INSERT_CHECK)
                        .bind(effect_id)
                        .bind(parent)
                        .execute(&mut *connection)
                        .await
                        .map_err(internal)?;
                }
            }
        }
        Ok(())
    }
}
