//! A service on PostgreSQL alone: its operation runs on `PgRecords` and writes its rows with
//! plain sqlx in PostgreSQL's own transaction, which the engine begins, ends the record in and
//! commits. And a finish the database refuses for good (a NUL, which PostgreSQL's `text` cannot
//! hold), after the effect was made, ends the record with a stable answer kept for an operator,
//! whether the attempt or the completer meets it.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use payments_idempotency::engine::conformance::Subject;
use payments_idempotency::engine::{
    Completer, CompleterSettings, EffectError, Engine, Idempotent, KeyedRequest, Operation, Owner,
    Prepared, Preparing, ProtocolError, RecordStore, Settled, StoreFailure, scope_of,
};
use payments_idempotency::{
    IdempotencyKey, RecordState, RecoveryPoint, SchemaVersion, StoredResponse,
};
use payments_idempotency_sql::{Error, PgRecords};
use serde_json::{Value, json};
use sqlx::Postgres;

type PgTransaction = sqlx::Transaction<'static, Postgres>;

/// An effect port that makes one effect per key, and may lose the answer of the next call.
#[derive(Debug, Default)]
struct Port {
    made: Mutex<HashMap<String, String>>,
    lose_next_answer: AtomicBool,
}

impl Port {
    fn made(&self) -> usize {
        self.made.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// `POST /notes`: the note is the effect; its row is written in the record's transaction.
#[derive(Debug)]
struct WriteNote {
    port: Arc<Port>,
}

#[async_trait]
impl Operation for WriteNote {
    type Request = String;
    type Plan = String;
    type Effect = String;
    type Transaction = PgTransaction;

    const FAMILY: &'static str = "notes.write";
    const VERSION: SchemaVersion = SchemaVersion::new(1);
    const EFFECT: &'static str = "note";
    const ROUTE: (&'static str, &'static str) = ("POST", "/notes");

    fn canonical_request(text: &String) -> Value {
        json!({ "text": text })
    }

    fn stored_request(&self, body: &[u8]) -> Option<String> {
        let body: Value = serde_json::from_slice(body).ok()?;
        Some(body["text"].as_str()?.to_owned())
    }

    async fn prepare(
        &self,
        _: &mut Preparing<'_, PgTransaction>,
        _: Owner<'_>,
        text: &String,
    ) -> Result<Prepared<String>, ProtocolError> {
        Ok(Prepared::Ready(text.clone()))
    }

    async fn effect(&self, _: &String, effect_key: &str) -> Result<String, EffectError> {
        let id = {
            let mut made = self.port.made.lock().unwrap_or_else(|p| p.into_inner());
            let next = format!("note_{}", made.len() + 1);
            made.entry(effect_key.to_owned()).or_insert(next).clone()
        };
        if self.port.lose_next_answer.swap(false, Ordering::SeqCst) {
            let reason = "the answer was lost".to_owned();
            return Err(EffectError::Unavailable { reason });
        }
        Ok(id)
    }

    async fn settle(&self, effect_key: &str) -> Result<Settled<String>, EffectError> {
        let made = self.port.made.lock().unwrap_or_else(|p| p.into_inner());
        let found = made.get(effect_key).cloned();
        Ok(found.map_or(Settled::Tombstoned, Settled::Exists))
    }

    fn effect_id(id: &String) -> String {
        id.clone()
    }

    /// Plain sqlx, on PostgreSQL's own transaction.
    async fn finish(
        &self,
        transaction: &mut PgTransaction,
        _: Owner<'_>,
        text: &String,
        note_id: String,
    ) -> Result<StoredResponse, ProtocolError> {
        sqlx::query("INSERT INTO notes (id, text) VALUES ($1, $2)")
            .bind(&note_id)
            .bind(text)
            .execute(&mut **transaction)
            .await
            .map_err(|e| StoreFailure::from(Error::from(e)))?;
        let body = json!({ "id": note_id }).to_string().into_bytes();
        let json = [("content-type", "application/json")];
        Ok(StoredResponse::new(Self::VERSION, 201, json, body))
    }
}

struct Service {
    fresh: common::Own<PgRecords>,
    port: Arc<Port>,
    engine: Arc<Engine<PgTransaction>>,
    notes: Arc<Idempotent<WriteNote>>,
}

impl Service {
    async fn start() -> Self {
        let fresh = common::postgres_store().await;
        let records = fresh.store();
        let table = "CREATE TABLE notes (id text PRIMARY KEY, text text NOT NULL)";
        let created = sqlx::query(table).execute(records.pool()).await;
        created.unwrap_or_else(|e| panic!("{table}: {e}"));
        let port = Arc::new(Port::default());
        let notes = Arc::new(Idempotent::new(WriteNote {
            port: Arc::clone(&port),
        }));
        let engine = Arc::new(records.engine().with_operation(Arc::clone(&notes)));
        Self {
            fresh,
            port,
            engine,
            notes,
        }
    }

    async fn write(&self, key: &str, text: &str) -> Result<StoredResponse, ProtocolError> {
        let key = IdempotencyKey::parse(key).unwrap_or_else(|e| panic!("{e}"));
        let request = KeyedRequest::of::<WriteNote>("acme".into(), key, text.to_owned(), None);
        let answer = self.engine.run(&self.notes, request).await?;
        Ok(answer.response)
    }

    async fn notes(&self) -> i64 {
        let counted = sqlx::query_as("SELECT count(*) FROM notes");
        let n = counted.fetch_one(self.fresh.store().pool()).await;
        let (n,): (i64,) = n.unwrap_or_else(|e| panic!("{e}"));
        n
    }

    async fn record(&self, key: &str) -> (RecordState, RecoveryPoint, Option<String>) {
        let (scope, key) = (
            scope_of::<WriteNote>("acme"),
            IdempotencyKey::parse(key).unwrap_or_else(|e| panic!("{e}")),
        );
        let found = self.fresh.store().find_record(&scope, &key).await;
        let record = found.unwrap_or_else(|e| panic!("{e}"));
        let (record, _) = record.unwrap_or_else(|| panic!("no record under the key"));
        (record.state, record.recovery_point, record.effect_id)
    }
}

#[tokio::test]
async fn a_postgres_only_operation_writes_its_rows_with_plain_sqlx() {
    let service = Service::start().await;
    let first = service
        .write("note-1", "hello")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let again = service
        .write("note-1", "hello")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((first.status, &first.body), (201, &again.body));
    assert_eq!((service.port.made(), service.notes().await), (1, 1));
}

/// A NUL reaches the database (nothing refused it earlier): the note was made, its row never
/// can be. The attempt ends the record with the `unrecorded` answer, and a retry gets it again.
#[tokio::test]
async fn a_finish_refused_for_good_ends_with_a_stable_answer() {
    let service = Service::start().await;
    let first = service
        .write("note-2", "nul\u{0}here")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(first.status, 500);
    let problem: Value = serde_json::from_slice(&first.body).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(problem["code"], "effect_unrecorded", "{problem}");
    let again = service
        .write("note-2", "nul\u{0}here")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again, first);
    assert_eq!((service.port.made(), service.notes().await), (1, 0));
    let kept = service.record("note-2").await;
    let note = Some("note_1".to_owned());
    assert_eq!(
        kept,
        (RecordState::Completed, RecoveryPoint::EffectMade, note)
    );
}

/// The same refusal met by the completer, settling a record whose attempt lost the effect's
/// answer: the record ends the same way, and the client's retry gets the stored answer.
#[tokio::test]
async fn the_completer_ends_a_finish_refused_for_good_the_same_way() {
    let service = Service::start().await;
    service.port.lose_next_answer.store(true, Ordering::SeqCst);
    let lost = service.write("note-3", "nul\u{0}here").await;
    assert!(
        matches!(lost, Err(ProtocolError::EffectUnavailable)),
        "{lost:?}"
    );
    let settle_after = Duration::from_secs(5);
    service
        .fresh
        .advance(settle_after + Duration::from_secs(1))
        .await;
    let settings = CompleterSettings {
        settle_after,
        ..CompleterSettings::default()
    };
    let completer = Completer::new(Arc::clone(&service.engine), settings);
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    completer.run_round(&shutdown).await;

    let kept = service.record("note-3").await;
    let note = Some("note_1".to_owned());
    assert_eq!(
        kept,
        (RecordState::Completed, RecoveryPoint::EffectMade, note)
    );
    let retry = service
        .write("note-3", "nul\u{0}here")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(retry.status, 500);
    assert_eq!((service.port.made(), service.notes().await), (1, 0));
}
