//! Two schema versions of one operation over one store, as the two builds of a fleet
//! mid-deploy (or mid-rollback) run them: whichever version meets the other's record, in
//! whichever state, no second effect is made under the key, every retry gets the same answer,
//! and that answer names the version that wrote it.
//!
//! Each guarantee is checked both ways: version 1's record met by version 2, and version 2's
//! met by version 1.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use payments_idempotency::engine::memory::{EffectRow, MemoryRecords, MemoryTransaction};
use payments_idempotency::engine::{
    Answer, Checkpoint, EffectError, Engine, Idempotent, KeyedRequest, Observer, Operation, Owner,
    Prepared, Preparing, ProtocolError, SettleOutcome, Settled,
};
use payments_idempotency::{IdempotencyKey, IdempotencyPolicy, SchemaVersion, StoredResponse};
use serde_json::json;
use tokio::sync::{Notify, Semaphore};
use uuid::Uuid;

const POLICY: IdempotencyPolicy = IdempotencyPolicy {
    ttl: Duration::from_secs(24 * 60 * 60),
    lock_timeout: Duration::from_secs(30),
};
const SETTLE_AFTER: Duration = Duration::from_secs(5);

/// A gateway that, like a card processor, makes one effect per key, and can be held shut so
/// that a call stays in flight.
#[derive(Debug, Default)]
struct Gateway {
    sent: Mutex<HashMap<String, String>>,
    /// While set, a call waits for a permit before it makes its effect.
    gate: Mutex<Option<Arc<Semaphore>>>,
    /// Told when a call reaches the gateway.
    called: Notify,
}

impl Gateway {
    fn sent(&self) -> MutexGuard<'_, HashMap<String, String>> {
        self.sent.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn effects(&self) -> usize {
        self.sent().len()
    }

    /// Holds every call until [`open`](Self::open).
    fn hold(&self) -> Arc<Semaphore> {
        let gate = Arc::new(Semaphore::new(0));
        *self.gate.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&gate));
        gate
    }

    async fn send(&self, key: &str, text: &str) -> String {
        self.called.notify_one();
        let gate = self.gate.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(gate) = gate {
            let _permit = gate.acquire().await;
        }
        let mut sent = self.sent();
        let next = format!("msg_{}_{}", sent.len() + 1, text.len());
        sent.entry(key.to_owned()).or_insert(next).clone()
    }
}

/// `POST /messages`, schema version `V`, request version `R`: its answer names its version in
/// its body, so that an answer of one version can never pass for the other's.
#[derive(Debug)]
struct SendMessage<const V: u32, const R: u32 = 1> {
    gateway: Arc<Gateway>,
}

#[async_trait]
impl<const V: u32, const R: u32> Operation for SendMessage<V, R> {
    type Request = String;
    type Plan = String;
    type Effect = String;
    type Transaction = MemoryTransaction;

    const FAMILY: &'static str = "messages.send";
    const VERSION: SchemaVersion = SchemaVersion::new(V);
    const REQUEST_VERSION: u32 = R;
    const EFFECT: &'static str = "message";
    const ROUTE: (&'static str, &'static str) = ("POST", "/messages");

    fn canonical_request(text: &String) -> serde_json::Value {
        json!({ "text": text })
    }

    fn stored_request(&self, body: &[u8]) -> Option<String> {
        let body: serde_json::Value = serde_json::from_slice(body).ok()?;
        Some(body["text"].as_str()?.to_owned())
    }

    async fn prepare(
        &self,
        _: &mut Preparing<'_, MemoryTransaction>,
        _: Owner<'_>,
        text: &String,
    ) -> Result<Prepared<String>, ProtocolError> {
        Ok(Prepared::Ready(text.clone()))
    }

    async fn effect(&self, text: &String, effect_key: &str) -> Result<String, EffectError> {
        Ok(self.gateway.send(effect_key, text).await)
    }

    async fn settle(&self, effect_key: &str) -> Result<Settled<String>, EffectError> {
        Ok(self
            .gateway
            .sent()
            .get(effect_key)
            .cloned()
            .map_or(Settled::Tombstoned, Settled::Exists))
    }

    fn effect_id(id: &String) -> String {
        id.clone()
    }

    fn declined(&self, code: String, _: String) -> StoredResponse {
        StoredResponse::new(Self::VERSION, 402, [], code.into_bytes())
    }

    async fn finish(
        &self,
        transaction: &mut MemoryTransaction,
        owner: Owner<'_>,
        _: &String,
        message_id: String,
    ) -> Result<StoredResponse, ProtocolError> {
        let body = json!({ "id": message_id, "version": V }).to_string();
        let headers = [("content-type", "application/json")];
        transaction.insert_row(EffectRow::of(owner, message_id));
        Ok(StoredResponse::new(
            Self::VERSION,
            201,
            headers,
            body.into_bytes(),
        ))
    }
}

/// An instance that dies once the effect is made, before its finish: its attempt never ends.
#[derive(Debug)]
struct DiesAfterEffect;

#[async_trait]
impl Observer for DiesAfterEffect {
    async fn reached(&self, point: Checkpoint) {
        if point == Checkpoint::AfterEffect {
            std::future::pending::<()>().await;
        }
    }
}

/// One build of the fleet: its engine over the shared store, with its version of the operation.
struct Instance<const V: u32, const R: u32 = 1> {
    engine: Engine<MemoryTransaction>,
    op: Arc<Idempotent<SendMessage<V, R>>>,
}

impl<const V: u32, const R: u32> Instance<V, R> {
    fn new(fleet: &Fleet) -> Self {
        Self::observed(fleet, Arc::new(payments_idempotency::engine::Unobserved))
    }

    fn observed(fleet: &Fleet, observer: Arc<dyn Observer>) -> Self {
        let op = Arc::new(Idempotent::new(SendMessage::<V, R> {
            gateway: Arc::clone(&fleet.gateway),
        }));
        let engine = Engine::new(Arc::clone(&fleet.records) as _)
            .with_operation(Arc::clone(&op))
            .with_observer(observer);
        Self { engine, op }
    }

    async fn send(&self, text: &str) -> Result<Answer, ProtocolError> {
        let request = KeyedRequest::of_sent::<SendMessage<V, R>>(
            "acme".to_owned(),
            IdempotencyKey::parse("welcome-42").unwrap_or_else(|e| panic!("{e}")),
            text.to_owned(),
            &json!({ "text": text }),
            None,
        );
        self.engine.run(&self.op, request).await
    }

    /// The completer of this instance, once: takes over an abandoned record and settles it.
    async fn complete(&self) -> Option<SettleOutcome> {
        let record = self
            .engine
            .take_over_abandoned(SETTLE_AFTER)
            .await
            .unwrap_or_else(|e| panic!("{e}"))?;
        Some(
            self.engine
                .settle_abandoned(&record)
                .await
                .unwrap_or_else(|e| panic!("{e}")),
        )
    }
}

/// What the instances share: the store and the gateway.
struct Fleet {
    records: Arc<MemoryRecords>,
    gateway: Arc<Gateway>,
}

impl Fleet {
    fn new() -> Self {
        Self {
            records: Arc::new(MemoryRecords::new(POLICY, Utc::now())),
            gateway: Arc::new(Gateway::default()),
        }
    }

    /// Exactly one effect, recorded once, under the key's one record.
    fn assert_one_effect(&self) {
        assert_eq!(self.gateway.effects(), 1, "effects made");
        assert_eq!(self.records.rows().len(), 1, "rows recorded");
        assert_eq!(self.records.records().len(), 1, "records under the key");
    }

    /// Moves the store's clock past the lock and the settle grace.
    fn abandon(&self) {
        self.records
            .advance(POLICY.lock_timeout + SETTLE_AFTER + Duration::from_secs(1));
    }
}

fn answered(answer: Result<Answer, ProtocolError>) -> Answer {
    answer.unwrap_or_else(|e| panic!("an answer, got {e}"))
}

/// A response as it was written by `version`.
fn written_by(answer: &Answer, version: u32) -> bool {
    answer.written_by == SchemaVersion::new(version)
        && answer.response.schema_version == SchemaVersion::new(version)
}

/// Completed under `From`, retried on `To`: the stored answer, as stored, naming `From`.
async fn a_completed_record_is_replayed_as_stored<const FROM: u32, const TO: u32>() {
    let fleet = Fleet::new();
    let (from, to) = (Instance::<FROM>::new(&fleet), Instance::<TO>::new(&fleet));

    let first = answered(from.send("Welcome!").await);
    let retry = answered(to.send("Welcome!").await);

    assert!(!first.replayed && retry.replayed);
    assert_eq!(
        retry.response, first.response,
        "the same answer, byte for byte"
    );
    assert!(
        written_by(&retry, FROM),
        "the retry names the version that wrote it"
    );
    fleet.assert_one_effect();
    let changed = to.send("Something else").await;
    assert!(
        matches!(changed, Err(ProtocolError::KeyReused)),
        "{changed:?}"
    );
}

#[tokio::test]
async fn a_completed_record_of_version_1_is_replayed_as_stored_by_version_2() {
    a_completed_record_is_replayed_as_stored::<1, 2>().await;
}

#[tokio::test]
async fn a_completed_record_of_version_2_is_replayed_as_stored_by_version_1() {
    a_completed_record_is_replayed_as_stored::<2, 1>().await;
}

/// In flight under `From`, duplicated on `To`: 409 with a wait, no second call; once the
/// first ends, every retry on either version gets its answer.
async fn a_record_in_flight_is_a_duplicate<const FROM: u32, const TO: u32>() {
    let fleet = Fleet::new();
    let (from, to) = (Instance::<FROM>::new(&fleet), Instance::<TO>::new(&fleet));
    let gate = fleet.gateway.hold();
    let first = from.send("Welcome!");
    tokio::pin!(first);
    tokio::select! {
        biased;
        answer = &mut first => panic!("the first call was held at the gateway, got {answer:?}"),
        () = fleet.gateway.called.notified() => {}
    }

    // Bounded: a duplicate that makes a call of its own would wait at the held gateway.
    let duplicate = tokio::time::timeout(Duration::from_secs(5), to.send("Welcome!")).await;
    gate.add_permits(2);
    let first = first.await;

    assert!(
        matches!(duplicate, Ok(Err(ProtocolError::KeyInUse { retry_after_secs })) if retry_after_secs >= 1),
        "a 409 at once, got {duplicate:?}"
    );
    let first = answered(first);
    assert!(written_by(&first, FROM));
    for retry in [
        answered(to.send("Welcome!").await),
        answered(from.send("Welcome!").await),
    ] {
        assert_eq!(retry.response, first.response);
        assert!(retry.replayed && written_by(&retry, FROM));
    }
    fleet.assert_one_effect();
}

#[tokio::test]
async fn a_record_of_version_1_in_flight_is_a_duplicate_on_version_2() {
    a_record_in_flight_is_a_duplicate::<1, 2>().await;
}

#[tokio::test]
async fn a_record_of_version_2_in_flight_is_a_duplicate_on_version_1() {
    a_record_in_flight_is_a_duplicate::<2, 1>().await;
}

/// `From`'s instance dies after the effect, before its finish: the record is left pending.
async fn abandon_after_the_effect<const FROM: u32>(fleet: &Fleet) {
    let dying = Instance::<FROM>::observed(fleet, Arc::new(DiesAfterEffect));
    let attempt = tokio::time::timeout(Duration::from_millis(200), dying.send("Welcome!")).await;
    assert!(attempt.is_err(), "the dying instance never answers");
    assert_eq!(fleet.gateway.effects(), 1, "the effect was made");
    assert!(fleet.records.rows().is_empty(), "and never recorded");
    fleet.abandon();
}

/// Abandoned by `From` after its effect, settled by `To`'s completer: recorded once under the
/// record's own effect key, and every retry on either version replays it.
async fn an_abandoned_record_is_settled_once_by_the_completer<const FROM: u32, const TO: u32>() {
    let fleet = Fleet::new();
    abandon_after_the_effect::<FROM>(&fleet).await;
    let (from, to) = (Instance::<FROM>::new(&fleet), Instance::<TO>::new(&fleet));

    assert_eq!(to.complete().await, Some(SettleOutcome::Finished));
    fleet.abandon();
    assert_eq!(from.complete().await, None, "nothing is left to settle");
    assert_eq!(to.complete().await, None);

    let retries = [
        answered(from.send("Welcome!").await),
        answered(to.send("Welcome!").await),
    ];
    for retry in &retries {
        assert!(
            retry.replayed && written_by(retry, TO),
            "the completer of {TO} wrote it"
        );
        assert_eq!(retry.response, retries[0].response);
    }
    fleet.assert_one_effect();
}

#[tokio::test]
async fn a_record_version_1_abandoned_is_settled_once_by_version_2s_completer() {
    an_abandoned_record_is_settled_once_by_the_completer::<1, 2>().await;
}

#[tokio::test]
async fn a_record_version_2_abandoned_is_settled_once_by_version_1s_completer() {
    an_abandoned_record_is_settled_once_by_the_completer::<2, 1>().await;
}

/// Abandoned by `From` after its effect, retried on `To`: the retry resumes under the same
/// effect key (the gateway finds the effect, makes none), and the completer has nothing left.
async fn an_abandoned_record_is_resumed_once_by_a_retry<const FROM: u32, const TO: u32>() {
    let fleet = Fleet::new();
    abandon_after_the_effect::<FROM>(&fleet).await;
    let (from, to) = (Instance::<FROM>::new(&fleet), Instance::<TO>::new(&fleet));

    let resumed = answered(to.send("Welcome!").await);
    assert!(!resumed.replayed && written_by(&resumed, TO));
    fleet.abandon();
    assert_eq!(from.complete().await, None, "nothing is left to settle");
    let replay = answered(from.send("Welcome!").await);
    assert!(replay.replayed && written_by(&replay, TO));
    assert_eq!(replay.response, resumed.response);
    fleet.assert_one_effect();
}

#[tokio::test]
async fn a_record_version_1_abandoned_is_resumed_once_by_a_retry_on_version_2() {
    an_abandoned_record_is_resumed_once_by_a_retry::<1, 2>().await;
}

#[tokio::test]
async fn a_record_version_2_abandoned_is_resumed_once_by_a_retry_on_version_1() {
    an_abandoned_record_is_resumed_once_by_a_retry::<2, 1>().await;
}

/// An operation that renders another version's record in its own shape: the body is its own,
/// and the answer still names the version that wrote the record.
#[derive(Debug)]
struct RendersInItsOwnShape(SendMessage<2>);

#[async_trait]
impl Operation for RendersInItsOwnShape {
    type Request = String;
    type Plan = String;
    type Effect = String;
    type Transaction = MemoryTransaction;

    const FAMILY: &'static str = SendMessage::<2>::FAMILY;
    const VERSION: SchemaVersion = SendMessage::<2>::VERSION;
    const EFFECT: &'static str = SendMessage::<2>::EFFECT;
    const ROUTE: (&'static str, &'static str) = SendMessage::<2>::ROUTE;

    fn canonical_request(text: &String) -> serde_json::Value {
        SendMessage::<2>::canonical_request(text)
    }

    fn stored_request(&self, body: &[u8]) -> Option<String> {
        self.0.stored_request(body)
    }

    async fn prepare(
        &self,
        preparing: &mut Preparing<'_, MemoryTransaction>,
        owner: Owner<'_>,
        text: &String,
    ) -> Result<Prepared<String>, ProtocolError> {
        self.0.prepare(preparing, owner, text).await
    }

    async fn effect(&self, text: &String, effect_key: &str) -> Result<String, EffectError> {
        self.0.effect(text, effect_key).await
    }

    async fn settle(&self, effect_key: &str) -> Result<Settled<String>, EffectError> {
        self.0.settle(effect_key).await
    }

    fn effect_id(id: &String) -> String {
        id.clone()
    }

    fn declined(&self, code: String, message: String) -> StoredResponse {
        self.0.declined(code, message)
    }

    async fn finish(
        &self,
        transaction: &mut MemoryTransaction,
        owner: Owner<'_>,
        text: &String,
        message_id: String,
    ) -> Result<StoredResponse, ProtocolError> {
        self.0.finish(transaction, owner, text, message_id).await
    }

    async fn replay_other_version(
        &self,
        generation: Uuid,
        stored: StoredResponse,
    ) -> Result<StoredResponse, ProtocolError> {
        let body = json!({ "message": generation.to_string(), "version": 2 }).to_string();
        Ok(StoredResponse::new(
            Self::VERSION,
            stored.status,
            [],
            body.into_bytes(),
        ))
    }
}

#[tokio::test]
async fn an_operation_may_render_another_versions_record_in_its_own_shape() {
    let fleet = Fleet::new();
    let v1 = Instance::<1>::new(&fleet);
    let first = answered(v1.send("Welcome!").await);
    let renders = Arc::new(Idempotent::new(RendersInItsOwnShape(SendMessage::<2> {
        gateway: Arc::clone(&fleet.gateway),
    })));
    let engine = Engine::new(Arc::clone(&fleet.records) as _).with_operation(Arc::clone(&renders));
    let request = KeyedRequest::of_sent::<RendersInItsOwnShape>(
        "acme".to_owned(),
        IdempotencyKey::parse("welcome-42").unwrap_or_else(|e| panic!("{e}")),
        "Welcome!".to_owned(),
        &json!({ "text": "Welcome!" }),
        None,
    );

    let rendered = answered(engine.run(&renders, request).await);

    assert!(rendered.replayed && rendered.written_by == SchemaVersion::new(1));
    assert_eq!(rendered.response.status, first.response.status);
    assert_ne!(
        rendered.response.body, first.response.body,
        "in version 2's shape"
    );
    fleet.assert_one_effect();
}

/// A request of another request version (a field changed meaning between the versions) is
/// never compared with the record's: 409 incomparable, never an effect nor a replay, whichever
/// came first; the record's own version still replays it.
async fn a_request_of_another_request_version_is_never_compared<const FROM: u32, const TO: u32>() {
    let fleet = Fleet::new();
    let from = Instance::<FROM, FROM>::new(&fleet);
    let to = Instance::<TO, TO>::new(&fleet);

    let first = answered(from.send("Welcome!").await);
    let other = to.send("Welcome!").await;

    assert!(
        matches!(other, Err(ProtocolError::KeyIncomparable)),
        "{other:?}"
    );
    let replay = answered(from.send("Welcome!").await);
    assert!(replay.replayed);
    assert_eq!(replay.response, first.response);
    fleet.assert_one_effect();
}

#[tokio::test]
async fn a_request_of_request_version_2_is_never_compared_with_a_record_of_1() {
    a_request_of_another_request_version_is_never_compared::<1, 2>().await;
}

#[tokio::test]
async fn a_request_of_request_version_1_is_never_compared_with_a_record_of_2() {
    a_request_of_another_request_version_is_never_compared::<2, 1>().await;
}
