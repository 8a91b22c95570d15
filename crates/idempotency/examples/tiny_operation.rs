//! The engine used by a tiny operation, over the in-memory store: sending a text message
//! exactly once per idempotency key, however often the client retries.
//!
//!     cargo run -p payments-idempotency --features memory --example tiny_operation

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::Utc;
use payments_idempotency::engine::memory::{EffectRow, MemoryRecords, MemoryTransaction};
use payments_idempotency::engine::{
    EffectError, Engine, Idempotent, KeyedRequest, Operation, Owner, Prepared, Preparing,
    ProtocolError, Settled,
};
use payments_idempotency::{IdempotencyKey, IdempotencyPolicy, SchemaVersion, StoredResponse};
use serde_json::{Value, json};

/// The effect port: an SMS gateway that, like a card processor, deduplicates by key.
#[derive(Debug, Default)]
struct Gateway {
    sent: Mutex<HashMap<String, String>>,
}

impl Gateway {
    fn send(&self, key: &str, text: &str) -> String {
        let mut sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
        let next = format!("msg_{}", sent.len() + 1);
        println!("  gateway: sending {text:?} under {key}");
        sent.entry(key.to_owned()).or_insert(next).clone()
    }
}

/// `POST /messages {"text": ...}`.
#[derive(Debug)]
struct SendMessage {
    gateway: Arc<Gateway>,
}

#[async_trait]
impl Operation for SendMessage {
    type Request = String;
    type Plan = String;
    type Effect = String;
    /// Its rows live in the in-memory store.
    type Transaction = MemoryTransaction;

    const FAMILY: &'static str = "messages.send";
    const VERSION: SchemaVersion = SchemaVersion::new(1);
    const EFFECT: &'static str = "sms";
    const ROUTE: (&'static str, &'static str) = ("POST", "/messages");

    /// The request as every version of the operation spells it: what the fingerprint covers.
    fn canonical_request(text: &String) -> Value {
        json!({ "text": text })
    }

    fn stored_request(&self, body: &[u8]) -> Option<String> {
        let body: Value = serde_json::from_slice(body).ok()?;
        Some(body["text"].as_str()?.to_owned())
    }

    /// A message needs nothing but its text: no transaction is begun.
    async fn prepare(
        &self,
        _: &mut Preparing<'_, MemoryTransaction>,
        _: Owner<'_>,
        text: &String,
    ) -> Result<Prepared<String>, ProtocolError> {
        Ok(Prepared::Ready(text.clone()))
    }

    async fn effect(&self, text: &String, effect_key: &str) -> Result<String, EffectError> {
        Ok(self.gateway.send(effect_key, text))
    }

    async fn settle(&self, effect_key: &str) -> Result<Settled<String>, EffectError> {
        let sent = self.gateway.sent.lock().unwrap_or_else(|p| p.into_inner());
        Ok(sent
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

    /// The message's row, in the transaction the engine completes the record in.
    async fn finish(
        &self,
        transaction: &mut MemoryTransaction,
        owner: Owner<'_>,
        _: &String,
        message_id: String,
    ) -> Result<StoredResponse, ProtocolError> {
        let body = json!({ "id": message_id, "status": "sent" }).to_string();
        transaction.insert_row(EffectRow::of(owner, message_id));
        Ok(StoredResponse::new(
            Self::VERSION,
            201,
            [("content-type", "application/json")],
            body.into_bytes(),
        ))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let records = Arc::new(MemoryRecords::new(IdempotencyPolicy::default(), Utc::now()));
    let gateway = Arc::new(Gateway::default());
    let send = Arc::new(Idempotent::new(SendMessage {
        gateway: Arc::clone(&gateway),
    }));
    let engine = Engine::new(Arc::clone(&records) as _).with_operation(Arc::clone(&send));

    let request = |text: &str| {
        let key = IdempotencyKey::parse("welcome-42").expect("a valid key");
        KeyedRequest::of::<SendMessage>("acme".to_owned(), key, text.to_owned(), None)
    };

    for attempt in 1..=3 {
        let answer = engine.run(&send, request("Welcome!")).await?;
        println!(
            "attempt {attempt}: {} {} (replayed: {})",
            answer.response.status,
            String::from_utf8_lossy(&answer.response.body),
            answer.replayed
        );
    }
    match engine.run(&send, request("Something else")).await {
        Err(ProtocolError::KeyReused) => println!("another text under the same key: 422"),
        other => println!("unexpected: {other:?}"),
    }
    let sent = gateway.sent.lock().unwrap_or_else(|p| p.into_inner()).len();
    println!(
        "messages sent: {sent}, rows written: {}",
        records.rows().len()
    );
    Ok(())
}
