//! The replay cache is never trusted: an entry that this service did not write, or that was
//! edited in Redis, is never served. The services here hold no recent answers of their own, so
//! that every replay reaches the cache.

use payments_idempotency::engine::ResponseCache;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use payments_idempotency::{Fingerprint, IdempotencyKey, SchemaVersion, Scope, StoredResponse};
use payments_redis::{CacheSecret, RedisLink, ReplayCache};
use reqwest::Response;
use serde_json::{Value, json};

use super::header;
use crate::events::sample;
use crate::helpers::{
    ACME, Backend, CACHE_SECRET, Footprint, NO_RECENT_ANSWERS, TestApp, metrics_text, new_key,
    problem, redis_key_prefix, snapshot, spawn_app_with, test_redis_url, visa,
};

/// A secret that is not the service's: what an attacker with write access to Redis, but not
/// to the service's configuration, seals entries with.
const WRONG_SECRET: &[u8] = b"an-attackers-secret-that-is-also-longer-than-32-bytes";

/// The headers a replay must repeat exactly as the first answer had them.
const REPLAY_HEADERS: [&str; 3] = ["content-type", "location", "idempotency-key-expires"];

/// A response's status, [`REPLAY_HEADERS`] and body bytes.
type Snapshot = (u16, Vec<Option<String>>, Vec<u8>);

/// The prefix of the service's Redis keys (`redis.key_prefix` as the helpers set it).
fn key_prefix(app: &TestApp) -> String {
    redis_key_prefix(&app.database.url)
}

/// The operation `POST /charges` is stored under.
const CHARGES_CREATE: &str = "charges.create";

/// The scope of acme's charges.
fn acme_charges() -> Scope {
    Scope {
        tenant: "acme".into(),
        operation: CHARGES_CREATE.into(),
    }
}

/// The Redis key of acme's cached charge under `key`.
fn replay_key(app: &TestApp, key: &str) -> String {
    format!(
        "{}:replay:{{acme:{}:{key}}}",
        key_prefix(app),
        CHARGES_CREATE
    )
}

/// The fingerprint the service computes for a `POST /charges` with `body`, a body already in
/// the charge's canonical form (its request version 1).
fn charge_fingerprint(body: &Value) -> Fingerprint {
    Fingerprint::of_request(1, "POST", "/charges", body, body)
}

/// A replay cache on the service's Redis keys, sealing entries with `secret`.
fn cache_sealed_with(app: &TestApp, secret: &[u8]) -> ReplayCache {
    let link = RedisLink::new(&test_redis_url(), Duration::from_secs(2)).expect("redis url");
    let secret = CacheSecret::new(secret).expect("a secret of at least 32 bytes");
    ReplayCache::new(link, key_prefix(app), secret)
}

async fn redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open(test_redis_url())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to redis")
}

/// The raw bytes stored under a Redis key.
async fn raw_entry(redis_key: &str) -> Option<Vec<u8>> {
    redis::cmd("GET")
        .arg(redis_key)
        .query_async(&mut redis().await)
        .await
        .expect("GET")
}

/// Overwrites a Redis key with `bytes`, as an attacker with access to Redis would.
async fn write_raw_entry(redis_key: &str, bytes: &[u8]) {
    let () = redis::cmd("SET")
        .arg(redis_key)
        .arg(bytes)
        .arg("PX")
        .arg(3_600_000)
        .query_async(&mut redis().await)
        .await
        .expect("SET");
}

/// Waits (bounded) for the service to cache the response of `key` and returns its bytes.
async fn genuine_entry(app: &TestApp, key: &str) -> Vec<u8> {
    let redis_key = replay_key(app, key);
    for _ in 0..50 {
        if let Some(bytes) = raw_entry(&redis_key).await {
            return bytes;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the service never cached {redis_key}");
}

/// A replay-cache entry, version 4, split into its fields: `[4][generation: 16]
/// [request version: u32 BE][fingerprint: 32][expires_at: i64 BE ms][status: u16 BE]
/// [schema version: u32 BE][headers_len: u32 BE][headers JSON][body][mac: 32]`.
#[derive(Debug, Clone)]
struct Entry {
    /// Version, generation, fingerprint (its request version and digest) and expiry:
    /// everything before the status.
    head: Vec<u8>,
    status: u16,
    schema_version: u32,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    mac: Vec<u8>,
}

/// Bytes before the status: version (1), generation (16), fingerprint (4 + 32), expiry (8).
const HEAD: usize = 1 + 16 + 4 + 32 + 8;
const MAC: usize = 32;

impl Entry {
    fn parse(bytes: &[u8]) -> Self {
        assert_eq!(bytes.first(), Some(&4), "a version 4 entry");
        assert!(
            bytes.len() >= HEAD + 2 + 4 + 4 + MAC,
            "{} bytes",
            bytes.len()
        );
        let status = u16::from_be_bytes([bytes[HEAD], bytes[HEAD + 1]]);
        let version: [u8; 4] = bytes[HEAD + 2..HEAD + 6].try_into().expect("4 bytes");
        let length: [u8; 4] = bytes[HEAD + 6..HEAD + 10].try_into().expect("4 bytes");
        let headers_end = HEAD + 10 + u32::from_be_bytes(length) as usize;
        let mac_start = bytes.len() - MAC;
        Self {
            head: bytes[..HEAD].to_vec(),
            status,
            schema_version: u32::from_be_bytes(version),
            headers: serde_json::from_slice(&bytes[HEAD + 10..headers_end]).expect("headers JSON"),
            body: bytes[headers_end..mac_start].to_vec(),
            mac: bytes[mac_start..].to_vec(),
        }
    }

    /// The entry's bytes, with `headers_len` matching the headers as they are now.
    fn encode(&self) -> Vec<u8> {
        let headers = serde_json::to_vec(&self.headers).expect("headers JSON");
        let mut out = self.head.clone();
        out.extend_from_slice(&self.status.to_be_bytes());
        out.extend_from_slice(&self.schema_version.to_be_bytes());
        out.extend_from_slice(&u32::try_from(headers.len()).expect("short").to_be_bytes());
        out.extend_from_slice(&headers);
        out.extend_from_slice(&self.body);
        out.extend_from_slice(&self.mac);
        out
    }

    fn generation(&self) -> uuid::Uuid {
        uuid::Uuid::from_slice(&self.head[1..17]).expect("16 bytes")
    }

    fn expires_at(&self) -> DateTime<Utc> {
        let millis = i64::from_be_bytes(self.head[53..61].try_into().expect("8 bytes"));
        DateTime::from_timestamp_millis(millis).expect("a valid expiry")
    }

    fn response(&self) -> StoredResponse {
        StoredResponse {
            schema_version: SchemaVersion::from_stored(self.schema_version).expect("a version"),
            status: self.status,
            headers: self.headers.clone(),
            body: self.body.clone(),
        }
    }
}

/// What an attacker would like a replay to say: a page with a script, a cookie for the
/// client, and a redirect to their own site.
fn hostile_response() -> StoredResponse {
    StoredResponse {
        schema_version: SchemaVersion::new(1),
        status: 201,
        headers: vec![
            ("content-type".into(), "text/html".into()),
            ("location".into(), "https://evil.example/x".into()),
            ("set-cookie".into(), "a=b".into()),
        ],
        body: b"<script>alert(document.cookie)</script>".to_vec(),
    }
}

/// An entry in the version 2 layout, which had no MAC: `[2][fingerprint][expires_at][status]
/// [headers_len][headers JSON][body]`.
fn version_2_entry(fingerprint: &Fingerprint, response: &StoredResponse) -> Vec<u8> {
    let headers = serde_json::to_vec(&response.headers).expect("headers JSON");
    let mut out = vec![2];
    out.extend_from_slice(fingerprint.as_bytes());
    out.extend_from_slice(&in_an_hour().timestamp_millis().to_be_bytes());
    out.extend_from_slice(&response.status.to_be_bytes());
    out.extend_from_slice(&u32::try_from(headers.len()).expect("short").to_be_bytes());
    out.extend_from_slice(&headers);
    out.extend_from_slice(&response.body);
    out
}

fn in_an_hour() -> DateTime<Utc> {
    Utc::now() + TimeDelta::hours(1)
}

fn idempotency_key(key: &str) -> IdempotencyKey {
    IdempotencyKey::parse(key).expect("a valid key")
}

/// The cache entries the service refused to serve, and its replays by source.
#[derive(Debug, Clone, Copy, PartialEq)]
struct CacheCounts {
    rejected: f64,
    replayed_cache: f64,
    replayed_db: f64,
}

async fn cache_counts(app: &TestApp) -> CacheCounts {
    let metrics = metrics_text(&app.metrics_url).await;
    let outcome = |name| sample(&metrics, "idempotency_outcomes_total", &[("outcome", name)]);
    CacheCounts {
        rejected: sample(&metrics, "replay_cache_rejected_total", &[]),
        replayed_cache: outcome("replayed_cache"),
        replayed_db: outcome("replayed_db"),
    }
}

/// Asserts `response` replays `first` exactly (status, headers, bytes), marked as a replay and
/// carrying nothing a forged entry could have added.
async fn assert_replays(response: Response, first: &Snapshot, what: &str) {
    let replayed = header(&response, "idempotent-replayed");
    let cookie = header(&response, "set-cookie");
    let answer = snapshot(response, &REPLAY_HEADERS).await;
    assert_eq!(&answer, first, "{what}: the first answer, byte for byte");
    assert_eq!(replayed.as_deref(), Some("true"), "{what}");
    assert_eq!(cookie, None, "{what}: no cookie");
}

/// The first answer to a `visa(100)` charge under a fresh key, and the key.
async fn first_charge(app: &TestApp) -> (String, Snapshot) {
    let key = new_key();
    let first = snapshot(
        app.post_charge(ACME, &key, &visa(100)).await,
        &REPLAY_HEADERS,
    )
    .await;
    assert_eq!(first.0, 201);
    assert_eq!(first.1[0].as_deref(), Some("application/json"));
    assert!(
        first.1[1]
            .as_deref()
            .is_some_and(|l| l.starts_with("/charges/ch_")),
        "{:?}",
        first.1
    );
    (key, first)
}

/// Whoever can write to Redis (a shared instance, a leaked password, an SSRF to port 6379) can
/// put any bytes under a key's cache entry. An entry in the right layout for the right request
/// but sealed with another secret, the same with its MAC cut off or cut short, and one in the
/// old layout that had no MAC are all refused: the retry gets the database's replay, byte for
/// byte the first answer, not the attacker's status, content type, cookie, redirect or script.
async fn a_forged_cache_entry_for_a_completed_key_is_refused_and_the_database_replays(
    backend: Backend,
) {
    let app = spawn_app_with(backend, &[NO_RECENT_ANSWERS]).await;
    let (key, first) = first_charge(&app).await;
    let redis_key = replay_key(&app, &key);
    let generation = Entry::parse(&genuine_entry(&app, &key).await).generation();
    let fingerprint = charge_fingerprint(&visa(100));
    let before = cache_counts(&app).await;

    // Sealed with another secret: the right layout, generation and fingerprint, a wrong MAC.
    cache_sealed_with(&app, WRONG_SECRET)
        .put(
            &acme_charges(),
            &idempotency_key(&key),
            generation,
            &fingerprint,
            &hostile_response(),
            in_an_hour(),
        )
        .await
        .expect("forge an entry");
    let forged = raw_entry(&redis_key).await.expect("the forged entry");
    assert_eq!(Entry::parse(&forged).generation(), generation);
    let retry = app.post_charge(ACME, &key, &visa(100)).await;
    assert_replays(retry, &first, "sealed with another secret").await;

    // The same forgery without its MAC, and with half of it.
    for (what, cut) in [("without its MAC", MAC), ("with half its MAC", MAC / 2)] {
        write_raw_entry(&redis_key, &forged[..forged.len() - cut]).await;
        let retry = app.post_charge(ACME, &key, &visa(100)).await;
        assert_replays(retry, &first, what).await;
    }

    // The old layout, which carried no MAC at all, is no way around it.
    write_raw_entry(
        &redis_key,
        &version_2_entry(&fingerprint, &hostile_response()),
    )
    .await;
    let retry = app.post_charge(ACME, &key, &visa(100)).await;
    assert_replays(retry, &first, "a version 2 entry").await;

    let after = cache_counts(&app).await;
    assert_eq!(
        after,
        CacheCounts {
            rejected: before.rejected + 4.0,
            replayed_cache: before.replayed_cache,
            replayed_db: before.replayed_db + 4.0,
        },
        "each forged entry was refused and the database answered"
    );

    // The control: the same forger with the service's own secret writes an entry the service
    // serves, so the entries above were refused for their MAC alone.
    let genuine = Entry::parse(&genuine_entry(&app, &key).await);
    cache_sealed_with(&app, CACHE_SECRET.as_bytes())
        .put(
            &acme_charges(),
            &idempotency_key(&key),
            genuine.generation(),
            &fingerprint,
            &genuine.response(),
            genuine.expires_at(),
        )
        .await
        .expect("seal an entry with the service's secret");
    let before_control = cache_counts(&app).await;
    let retry = app.post_charge(ACME, &key, &visa(100)).await;
    assert_replays(retry, &first, "sealed with the service's secret").await;
    let after_control = cache_counts(&app).await;
    assert_eq!(
        (after_control.replayed_cache, after_control.rejected),
        (before_control.replayed_cache + 1.0, before_control.rejected),
        "an entry sealed with the service's secret is served from the cache"
    );
}

/// An attacker who pre-seeds the cache for a key the client has not used yet could make a
/// declined card read as a successful charge: the shop ships, nobody paid. A forged
/// "succeeded" entry for a never used key is refused, and the request runs as the first one
/// it is: declined (402), not marked as a replay, and recorded once.
async fn a_forged_success_for_an_unused_key_is_refused_and_the_charge_runs(backend: Backend) {
    let app = spawn_app_with(backend, &[NO_RECENT_ANSWERS]).await;
    let key = new_key();
    let declining = json!({ "amount": 100, "currency": "usd", "source": "tok_chargeDeclined" });
    let succeeded = json!({
        "id": "ch_forged",
        "object": "charge",
        "amount": 100,
        "currency": "USD",
        "status": "succeeded",
    });
    cache_sealed_with(&app, WRONG_SECRET)
        .put(
            &acme_charges(),
            &idempotency_key(&key),
            uuid::Uuid::new_v4(),
            &charge_fingerprint(&declining),
            &StoredResponse {
                schema_version: SchemaVersion::new(1),
                status: 201,
                headers: vec![
                    ("content-type".into(), "application/json".into()),
                    ("location".into(), "/charges/ch_forged".into()),
                ],
                body: succeeded.to_string().into_bytes(),
            },
            in_an_hour(),
        )
        .await
        .expect("forge an entry");
    let before = cache_counts(&app).await;

    let response = app.post_charge(ACME, &key, &declining).await;
    assert_eq!(header(&response, "idempotent-replayed"), None);
    let (status, body) = problem(response).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (402, Some("card_declined"))
    );

    assert_eq!(
        app.footprint().await,
        Footprint {
            records: 1,
            ..Footprint::EMPTY
        },
        "one record, no charge"
    );
    assert_eq!(
        app.record_state("acme", &key).await,
        Some(("completed".into(), "finished".into(), 1)),
        "executed once"
    );
    let after = cache_counts(&app).await;
    assert_eq!(after.rejected, before.rejected + 1.0);
    assert_eq!(after.replayed_cache, before.replayed_cache);
}

/// The MAC covers the whole entry, not only the body: an attacker who edits a genuine entry's
/// headers (adding a cookie, pointing the location elsewhere) or its status, keeping the
/// service's own MAC and a valid layout, gets it refused. The genuine bytes put back are
/// served from the cache again (the control).
async fn a_genuine_cache_entry_edited_in_redis_is_refused(backend: Backend) {
    let app = spawn_app_with(backend, &[NO_RECENT_ANSWERS]).await;
    let (key, first) = first_charge(&app).await;
    let redis_key = replay_key(&app, &key);
    let genuine_bytes = genuine_entry(&app, &key).await;
    let genuine = Entry::parse(&genuine_bytes);
    assert_eq!(
        genuine.encode(),
        genuine_bytes,
        "the test reads and writes entries exactly"
    );
    assert_eq!(
        genuine.response(),
        StoredResponse {
            schema_version: SchemaVersion::new(1),
            status: first.0,
            headers: vec![
                (
                    "content-type".into(),
                    first.1[0].clone().unwrap_or_default()
                ),
                ("location".into(), first.1[1].clone().unwrap_or_default()),
            ],
            body: first.2.clone(),
        },
        "the entry holds the first answer"
    );
    let before = cache_counts(&app).await;

    let mut with_cookie = genuine.clone();
    with_cookie
        .headers
        .push(("set-cookie".into(), "a=b".into()));
    let mut elsewhere = genuine.clone();
    for (name, value) in &mut elsewhere.headers {
        if name == "location" {
            *value = "https://evil.example/x".into();
        }
    }
    let mut other_status = genuine.clone();
    other_status.status = 200;
    for (what, edited) in [
        ("a cookie added", with_cookie),
        ("the location changed", elsewhere),
        ("the status changed", other_status),
    ] {
        write_raw_entry(&redis_key, &edited.encode()).await;
        let retry = app.post_charge(ACME, &key, &visa(100)).await;
        assert_replays(retry, &first, what).await;
    }
    let after = cache_counts(&app).await;
    assert_eq!(
        (after.rejected, after.replayed_db, after.replayed_cache),
        (
            before.rejected + 3.0,
            before.replayed_db + 3.0,
            before.replayed_cache
        ),
        "each edited entry was refused and the database answered"
    );

    write_raw_entry(&redis_key, &genuine_bytes).await;
    let retry = app.post_charge(ACME, &key, &visa(100)).await;
    assert_replays(retry, &first, "the genuine entry").await;
    let control = cache_counts(&app).await;
    assert_eq!(
        (control.replayed_cache, control.rejected),
        (after.replayed_cache + 1.0, after.rejected),
        "the unedited bytes are served from the cache"
    );
}

// ---------------------------------------------------------------------------------------------

on_every_backend!(
    a_forged_cache_entry_for_a_completed_key_is_refused_and_the_database_replays,
    a_forged_success_for_an_unused_key_is_refused_and_the_charge_runs,
    a_genuine_cache_entry_edited_in_redis_is_refused,
);
