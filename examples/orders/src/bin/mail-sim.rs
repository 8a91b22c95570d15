//! The mail service the order example sends its confirmations through, as a process of its
//! own. Like a card processor, it makes one message per idempotency key: a second send under a
//! key answers the first message, and a key that was looked up and never used is tombstoned,
//! so that nothing can be sent under it afterwards.
//!
//! A subject with `slow` in it is slow as a real service can be: the message exists only
//! after its processing time, and its answer then takes longer still (an answer held up on
//! its way back), which leaves a sender time to die after the mail went out.
//!
//!     MAIL_SIM_LISTEN=127.0.0.1:8025 cargo run -p orders-example --bin mail-sim

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use serde_json::{Value, json};

#[derive(Debug, Clone)]
enum Key {
    /// A send under the key is being processed.
    Processing,
    Sent(String),
    Tombstoned,
}

#[derive(Debug, Default)]
struct Mailbox {
    keys: HashMap<String, Key>,
    sent: usize,
}

type Shared = Arc<Mutex<Mailbox>>;

fn mailbox(shared: &Shared) -> std::sync::MutexGuard<'_, Mailbox> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn send(
    State(shared): State<Shared>,
    headers: HeaderMap,
    Json(mail): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({ "error": "no idempotency key" })),
        );
    };
    let key = key.to_owned();
    let slow = mail["subject"].as_str().is_some_and(|s| s.contains("slow"));
    {
        let mut mailbox = mailbox(&shared);
        match mailbox.keys.get(&key) {
            Some(Key::Sent(id)) => return (StatusCode::OK, Json(json!({ "id": id }))),
            Some(Key::Processing) => {
                return (
                    StatusCode::CONFLICT,
                    Json(json!({ "error": "in progress" })),
                );
            }
            Some(Key::Tombstoned) => {
                return (StatusCode::CONFLICT, Json(json!({ "error": "tombstoned" })));
            }
            None => mailbox.keys.insert(key.clone(), Key::Processing),
        };
    }
    if slow {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let id = {
        let mut mailbox = mailbox(&shared);
        mailbox.sent += 1;
        let id = format!("msg_{}", mailbox.sent);
        mailbox.keys.insert(key, Key::Sent(id.clone()));
        id
    };
    if slow {
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    (StatusCode::CREATED, Json(json!({ "id": id })))
}

/// What was made under `key`: the message (200), a send still being processed (202), or
/// nothing, and then never anything (404: the key is tombstoned).
async fn find(State(shared): State<Shared>, Path(key): Path<String>) -> (StatusCode, Json<Value>) {
    let mut mailbox = mailbox(&shared);
    match mailbox.keys.get(&key) {
        Some(Key::Sent(id)) => (StatusCode::OK, Json(json!({ "id": id }))),
        Some(Key::Processing) => (StatusCode::ACCEPTED, Json(json!({}))),
        Some(Key::Tombstoned) | None => {
            mailbox.keys.insert(key, Key::Tombstoned);
            (StatusCode::NOT_FOUND, Json(json!({})))
        }
    }
}

/// How many messages were sent: what an exactly-once test counts.
async fn stats(State(shared): State<Shared>) -> Json<Value> {
    Json(json!({ "sent": mailbox(&shared).sent }))
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let listen = std::env::var("MAIL_SIM_LISTEN").unwrap_or_else(|_| "127.0.0.1:8025".into());
    let router = axum::Router::new()
        .route("/messages", post(send))
        .route("/messages/{key}", get(find))
        .route("/stats", get(stats))
        .with_state(Shared::default());
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|e| format!("MAIL_SIM_LISTEN {listen}: {e}"))?;
    println!("mail-sim listening on {listen}");
    axum::serve(listener, router)
        .await
        .map_err(|e| e.to_string())
}
