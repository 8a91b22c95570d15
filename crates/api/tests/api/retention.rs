//! Retention: counted from a key's final answer, visible in every stored or replayed answer
//! and in key inspection, and never outlived by a cached copy.

use std::time::Duration;

use serde_json::json;

use crate::helpers::{
    Backend, Service, TWO_SECOND_RETENTION, TestDatabase, http_client, new_key, snapshot,
    test_redis_url, visa,
};

/// Every answer that stores or replays a result says until when its key replays it, and key
/// inspection shows the same time; retention is counted from the completion.
async fn the_retention_header_is_on_a_201_and_its_replay_and_matches_key_inspection(
    backend: Backend,
) {
    let db = TestDatabase::create(backend).await;
    let service = Service::start(&db.url, &[]).await;
    let key = new_key();
    let header = ["idempotency-key-expires"];

    let (status, first, _) = snapshot(service.post_charge(&key, &visa(300)).await, &header).await;
    assert_eq!(status, 201);
    let (status, replayed, _) =
        snapshot(service.post_charge(&key, &visa(300)).await, &header).await;
    assert_eq!(status, 201);
    let first = first[0]
        .clone()
        .expect("Idempotency-Key-Expires on the 201");
    assert_eq!(
        replayed[0].as_deref(),
        Some(first.as_str()),
        "and on its replay"
    );

    let view: serde_json::Value = http_client()
        .get(service.url(&format!("/idempotency-keys/{key}")))
        .bearer_auth(crate::helpers::ACME)
        .send()
        .await
        .expect("inspect")
        .json()
        .await
        .expect("key view");
    let inspected =
        chrono::DateTime::parse_from_rfc3339(view["expires_at"].as_str().expect("expires_at"))
            .expect("an RFC 3339 time")
            .with_timezone(&chrono::Utc);
    assert_eq!(
        first,
        inspected.format("%a, %d %b %Y %H:%M:%S GMT").to_string(),
        "the header and key inspection name the same expiry"
    );
    let from_now = inspected - chrono::Utc::now();
    assert!(
        from_now > chrono::Duration::hours(23) && from_now <= chrono::Duration::hours(24),
        "a day from the completion: {from_now}"
    );

    // A decline is a stored answer too.
    let declined = json!({ "amount": 300, "currency": "usd", "source": "tok_chargeDeclined" });
    let response = service.post_charge(&new_key(), &declined).await;
    assert_eq!(response.status().as_u16(), 402);
    assert!(response.headers().get("idempotency-key-expires").is_some());
}

/// A Redis whose clock runs behind could keep a replay entry past its record's expiry. The
/// entry carries that expiry, so the service treats it as a miss, and the claim that starts
/// the key's next generation deletes it.
async fn a_cached_replay_never_outlives_its_record(backend: Backend) {
    let db = TestDatabase::create(backend).await;
    // Expired records stay in place, to be replaced by the next claim.
    let mut env = TWO_SECOND_RETENTION.to_vec();
    env.push(("PAYMENTS__WORKERS__REAPER_INTERVAL_MS", "600000"));
    let service = Service::start(&db.url, &env).await;
    let mut redis = redis::Client::open(test_redis_url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let prefix = format!("test:{}", db.url.rsplit('/').next().unwrap_or_default());
    let entry_of = |key: &str| format!("{prefix}:replay:{{acme:charges.create:{key}}}");

    let (replayed_key, forgotten_key) = (new_key(), new_key());
    let mut stale = Vec::new();
    for key in [&replayed_key, &forgotten_key] {
        let (status, _, _) = snapshot(service.post_charge(key, &visa(100)).await, &[]).await;
        assert_eq!(status, 201);
        let entry: Vec<u8> = redis::cmd("GET")
            .arg(entry_of(key))
            .query_async(&mut redis)
            .await
            .expect("the response is cached");
        stale.push(entry);
    }
    // The records expire; their entries, put back for another minute, outlive them.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    for (key, entry) in [&replayed_key, &forgotten_key].iter().zip(&stale) {
        let _: () = redis::cmd("SET")
            .arg(entry_of(key))
            .arg(entry)
            .arg("PX")
            .arg(60_000)
            .query_async(&mut redis)
            .await
            .expect("SET");
    }

    // The same payload is a new request now, not the old generation's replay.
    let fresh = service.post_charge(&replayed_key, &visa(100)).await;
    assert_eq!(fresh.status().as_u16(), 201);
    assert!(fresh.headers().get("idempotent-replayed").is_none());

    // A new generation that stores no answer leaves no stale entry behind either.
    let failing = json!({ "amount": 100, "currency": "usd", "source": "tok_processingError" });
    let response = service.post_charge(&forgotten_key, &failing).await;
    assert_eq!(response.status().as_u16(), 503);
    let exists: i64 = redis::cmd("EXISTS")
        .arg(entry_of(&forgotten_key))
        .query_async(&mut redis)
        .await
        .expect("EXISTS");
    assert_eq!(exists, 0, "the replaced generation's entry was deleted");
}

on_every_backend!(
    the_retention_header_is_on_a_201_and_its_replay_and_matches_key_inspection,
    a_cached_replay_never_outlives_its_record,
);
