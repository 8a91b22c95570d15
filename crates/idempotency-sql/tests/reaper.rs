//! The reaper deletes the records past their retention, never one whose effect is not in its
//! operation's rows: a record completed with its rows refused for good (`End::Unrecorded`)
//! stays for an operator, however old.

mod common;

use std::time::Duration;

use payments_idempotency::engine::conformance::Subject;
use payments_idempotency::engine::{Begin, Claim, Completion, End, Owner, RecordStore};
use payments_idempotency::{Fingerprint, IdempotencyKey, SchemaVersion, Scope, StoredResponse};
use payments_idempotency_sql::Backend;

fn scope() -> Scope {
    Scope {
        tenant: "acme".to_owned(),
        operation: "reaper.check".to_owned(),
    }
}

fn answer() -> StoredResponse {
    let version = SchemaVersion::new(1);
    StoredResponse::new(
        version,
        201,
        [("content-type", "application/json")],
        b"{}".to_vec(),
    )
}

/// Claims `key` and ends its record as `end` says, in a transaction of its own.
async fn claim_and_end(fresh: &common::Fresh, key: &str, end: fn(&StoredResponse) -> End<'_>) {
    let (scope, key) = (scope(), IdempotencyKey::parse(key).expect("key"));
    let fingerprint = Fingerprint::of_json_request("POST", "/checks", &serde_json::json!({}));
    let records = fresh.store();
    let claim = records.claim(&scope, &key, &fingerprint, b"{}").await;
    let Ok(Claim::Owned(claimed)) = claim else {
        panic!("the claim should own the record, got {claim:?}");
    };
    let owner = Owner::new(&scope, &key, claimed.fence());
    let begun = records.begin(owner, Begin::ENDING.alone()).await;
    let mut transaction = begun.expect("begin").expect("not fenced");
    let response = answer();
    let ended = records.end(&mut transaction, owner, end(&response)).await;
    assert!(matches!(ended, Ok(Completion::Stored { .. })), "{ended:?}");
    records.commit(transaction).await.expect("commit");
}

async fn an_unrecorded_effect_outlives_its_retention(backend: Backend) {
    let fresh = common::on(backend).await;
    claim_and_end(&fresh, "made", |response| End::Made(response)).await;
    claim_and_end(&fresh, "unrecorded", |response| End::Unrecorded {
        effect_id: "effect_1",
        response,
    })
    .await;
    fresh
        .advance(fresh.policy().ttl + Duration::from_secs(60))
        .await;

    let reaped = fresh.records.reap_expired(10).await.expect("reap");
    assert_eq!(
        reaped, 1,
        "only the record whose effect is in its rows is reaped"
    );
    let unrecorded = IdempotencyKey::parse("unrecorded").expect("key");
    let kept = fresh.store().find_record(&scope(), &unrecorded).await;
    let (record, _) = kept.expect("find").expect("the unrecorded record is kept");
    assert_eq!(record.effect_id.as_deref(), Some("effect_1"));
}

#[tokio::test]
async fn postgres_keeps_an_unrecorded_effect_past_its_retention() {
    an_unrecorded_effect_outlives_its_retention(Backend::Postgres).await;
}

#[tokio::test]
async fn sqlite_keeps_an_unrecorded_effect_past_its_retention() {
    an_unrecorded_effect_outlives_its_retention(Backend::Sqlite).await;
}
