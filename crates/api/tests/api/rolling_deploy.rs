//! A fleet mid-deploy: the release build (schema version 1) and the `next-version` build
//! (schema version 2, the same shapes) as two instances on one PostgreSQL database and one
//! card-sim, each request and retry sent to either. Whichever build answers, a key makes one
//! effect: a charge, a refund or a payout answered by one build and retried on the other, in
//! flight on one and duplicated on the other, or made by one that is killed (SIGKILL) after the
//! processor call and retried on the other, is made once at the processor and recorded once in
//! the ledger and the outbox; every answer names the same object and the version that wrote it.
//!
//! The `next-version` build is the program `PAYMENTS_NEXT_VERSION_BIN` names, which
//! `scripts/test.sh` builds (`--features next-version,failpoints`).

use std::path::PathBuf;
use std::time::Duration;

use reqwest::Response;
use serde_json::{Value, json};

use crate::card_sim::CardSim;
use crate::crash::{post_to, post_until_final_to, record_state, settings, start_program};
use crate::helpers::{Backend, Service, TestDatabase, count_rows, new_key, payout, visa};

/// The two builds of the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Build {
    Release,
    NextVersion,
}

use Build::{NextVersion, Release};

impl Build {
    /// Which build answers first and which one gets the retry: a deploy, then a rollback.
    const BOTH_WAYS: [(Build, Build); 2] = [(Release, NextVersion), (NextVersion, Release)];

    /// The schema version its answers name (`Idempotent-Schema-Version`).
    fn schema_version(self) -> &'static str {
        match self {
            Release => "1",
            NextVersion => "2",
        }
    }

    async fn start(
        self,
        db: &TestDatabase,
        settings: &[(&'static str, String)],
        extra: &[(&'static str, &str)],
    ) -> Service {
        match self {
            Release => crate::crash::start(db, settings, extra).await,
            NextVersion => start_program(next_version_program(), db, settings, extra).await,
        }
    }
}

/// The `next-version` build of the service. Never skipped: without it these tests fail.
fn next_version_program() -> PathBuf {
    let program = std::env::var_os("PAYMENTS_NEXT_VERSION_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "PAYMENTS_NEXT_VERSION_BIN names no program: the rolling-deploy tests run the \
                 next-version build beside this one (scripts/test.sh builds it with \
                 `cargo build -p payments-api --features next-version,failpoints`)"
            )
        });
    assert!(
        program.is_file(),
        "PAYMENTS_NEXT_VERSION_BIN={}: no such program",
        program.display()
    );
    program
}

/// The effects a key can make, each at the processor, in the ledger and in the outbox.
#[derive(Debug, Clone, Copy)]
enum Effect {
    Charge,
    Refund,
    Payout,
}

impl Effect {
    /// What the processor made of this effect so far.
    async fn made(self, card_sim: &CardSim) -> i64 {
        match self {
            Self::Charge => card_sim.charges_created().await,
            Self::Refund => card_sim.refunds_created().await,
            Self::Payout => card_sim.payouts_created().await,
        }
    }

    /// The event its finish writes to the outbox.
    fn event_type(self) -> &'static str {
        match self {
            Self::Charge => "payment.completed",
            Self::Refund => "payment.refunded",
            Self::Payout => "payout.paid",
        }
    }

    /// The path and body of one request that makes it, once what it needs exists (a charge
    /// to refund, funds to pay out), made through `service` under keys of their own.
    async fn request(self, service: &Service) -> (String, Value) {
        match self {
            Self::Charge => ("/charges".to_owned(), visa(1_999)),
            Self::Refund => {
                let charge =
                    answered(post_to(service, "/charges", &new_key(), &visa(5_000)).await).await;
                let id = charge["id"].as_str().expect("the charge's id");
                (format!("/charges/{id}/refunds"), json!({ "amount": 1_500 }))
            }
            Self::Payout => {
                answered(post_to(service, "/charges", &new_key(), &visa(5_000)).await).await;
                ("/payouts".to_owned(), payout(1_500))
            }
        }
    }
}

/// The body of a 201.
async fn answered(response: reqwest::Result<Response>) -> Value {
    let response = response.expect("an answer");
    assert_eq!(response.status().as_u16(), 201, "created");
    response.json().await.expect("JSON")
}

/// What one effect left behind: (at the processor, ledger transactions, its outbox events).
async fn footprint(effect: Effect, db: &TestDatabase, card_sim: &CardSim) -> (i64, i64, i64) {
    let events: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_events WHERE event_type = $1")
            .bind(effect.event_type())
            .fetch_one(&db.pool)
            .await
            .expect("count events");
    (
        effect.made(card_sim).await,
        count_rows(&db.pool, "ledger_transactions").await,
        events,
    )
}

/// One more of `effect` than `before`: made once, posted once, announced once.
fn one_more(before: (i64, i64, i64)) -> (i64, i64, i64) {
    (before.0 + 1, before.1 + 1, before.2 + 1)
}

/// The schema version a response names.
fn schema_version(response: &Response) -> &str {
    response.headers()["idempotent-schema-version"]
        .to_str()
        .expect("a version")
}

/// Answered by one build, retried on the other: the same object, replayed as the first build
/// wrote it, and one effect, both ways.
async fn an_answer_of_one_build_is_replayed_by_the_other(effect: Effect) {
    let card_sim = CardSim::start().await;
    let db = TestDatabase::create(Backend::Postgres).await;
    let settings = settings(&card_sim);
    let release = Release.start(&db, &settings, &[]).await;
    let next = NextVersion.start(&db, &settings, &[]).await;
    let instance = |build| if build == Release { &release } else { &next };

    for (first, second) in Build::BOTH_WAYS {
        let (path, body) = effect.request(instance(first)).await;
        let before = footprint(effect, &db, &card_sim).await;
        let key = new_key();

        let answer = post_to(instance(first), &path, &key, &body)
            .await
            .expect("answer");
        assert_eq!(answer.status().as_u16(), 201);
        assert_eq!(
            schema_version(&answer),
            first.schema_version(),
            "a fresh answer names its build"
        );
        let answer = answer.bytes().await.expect("body");
        let retry = post_to(instance(second), &path, &key, &body)
            .await
            .expect("answer");

        assert_eq!(retry.status().as_u16(), 201);
        assert_eq!(retry.headers()["idempotent-replayed"], "true");
        assert_eq!(
            schema_version(&retry),
            first.schema_version(),
            "{first:?} wrote it"
        );
        assert_eq!(
            retry.bytes().await.expect("body"),
            answer,
            "the same object, byte for byte"
        );
        assert_eq!(
            footprint(effect, &db, &card_sim).await,
            one_more(before),
            "{first:?} then {second:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_answered_by_one_build_is_replayed_by_the_other() {
    an_answer_of_one_build_is_replayed_by_the_other(Effect::Charge).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_answered_by_one_build_is_replayed_by_the_other() {
    an_answer_of_one_build_is_replayed_by_the_other(Effect::Refund).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payout_answered_by_one_build_is_replayed_by_the_other() {
    an_answer_of_one_build_is_replayed_by_the_other(Effect::Payout).await;
}

/// In flight on one build (two seconds at the processor), duplicated on the other meanwhile:
/// 409 with `Retry-After`, one effect, and the retry names the same object, both ways. A
/// charge is slow by its token, `tok_slow`; a refund and a payout by the processor's latency.
async fn an_effect_in_flight_on_one_build_is_a_duplicate_on_the_other(effect: Effect) {
    let latency_ms = match effect {
        Effect::Charge => 0,
        Effect::Refund | Effect::Payout => 2_000,
    };
    let card_sim = CardSim::start_with_latency_ms(latency_ms).await;
    let db = TestDatabase::create(Backend::Postgres).await;
    let settings = vec![("PAYMENTS__PROCESSOR__URL", card_sim.url.clone())];
    let release = Release.start(&db, &settings, &[]).await;
    let next = NextVersion.start(&db, &settings, &[]).await;
    let instance = |build| if build == Release { &release } else { &next };

    for (first, second) in Build::BOTH_WAYS {
        let (path, body) = match effect {
            Effect::Charge => (
                "/charges".to_owned(),
                json!({ "amount": 700, "currency": "usd", "source": "tok_slow" }),
            ),
            Effect::Refund | Effect::Payout => effect.request(instance(first)).await,
        };
        let before = footprint(effect, &db, &card_sim).await;
        let key = new_key();
        let in_flight = post_to(instance(first), &path, &key, &body);
        let duplicate = async {
            while record_state(&db, &key).await.as_deref() != Some("pending") {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            post_to(instance(second), &path, &key, &body)
                .await
                .expect("answer")
        };
        let (answer, duplicate) = tokio::join!(in_flight, duplicate);

        assert_eq!(duplicate.status().as_u16(), 409, "{first:?} holds the key");
        assert!(duplicate.headers().contains_key("retry-after"));
        let answer = answered(answer).await;
        let retry = answered(post_to(instance(second), &path, &key, &body).await).await;
        assert_eq!(retry["id"], answer["id"], "the same object");
        assert_eq!(
            footprint(effect, &db, &card_sim).await,
            one_more(before),
            "{first:?} then {second:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_charge_in_flight_on_one_build_is_a_duplicate_on_the_other() {
    an_effect_in_flight_on_one_build_is_a_duplicate_on_the_other(Effect::Charge).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_in_flight_on_one_build_is_a_duplicate_on_the_other() {
    an_effect_in_flight_on_one_build_is_a_duplicate_on_the_other(Effect::Refund).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payout_in_flight_on_one_build_is_a_duplicate_on_the_other() {
    an_effect_in_flight_on_one_build_is_a_duplicate_on_the_other(Effect::Payout).await;
}

/// Made by one build, which is killed (SIGKILL) once the processor made the effect and before
/// its finish; retried on the other: finished once, under the record's own effect key.
async fn an_effect_of_a_killed_build_is_finished_once_by_the_other(effect: Effect) {
    let card_sim = CardSim::start().await;
    let db = TestDatabase::create(Backend::Postgres).await;
    let settings = settings(&card_sim);

    for (first, second) in Build::BOTH_WAYS {
        let survivor = second.start(&db, &settings, &[]).await;
        let (path, body) = effect.request(&survivor).await;
        let before = footprint(effect, &db, &card_sim).await;
        let key = new_key();
        // Held after the processor call for longer than the test takes: killed there.
        let mut dying = first
            .start(
                &db,
                &settings,
                &[("PAYMENTS_PAUSE_AT", "after_charge:600000")],
            )
            .await;
        let request = tokio::spawn({
            let url = dying.url(&path);
            let (key, body) = (key.clone(), body.clone());
            async move {
                crate::helpers::http_client()
                    .post(url)
                    .bearer_auth(crate::helpers::ACME)
                    .header("Idempotency-Key", key)
                    .json(&body)
                    .send()
                    .await
            }
        });
        while !dying
            .log_lines()
            .iter()
            .any(|line| line.contains("failpoint: pausing"))
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            effect.made(&card_sim).await,
            before.0 + 1,
            "the processor made it"
        );
        dying.kill().await;
        assert!(
            request.await.expect("the request task").is_err(),
            "{first:?} never answered"
        );

        let (status, retried) = post_until_final_to(&survivor, &path, &key, &body).await;

        assert_eq!(status, 201, "{second:?} finished it");
        let retried: Value = serde_json::from_slice(&retried).expect("JSON");
        let again = answered(post_to(&survivor, &path, &key, &body).await).await;
        assert_eq!(
            again["id"], retried["id"],
            "every retry names the same object"
        );
        assert_eq!(
            footprint(effect, &db, &card_sim).await,
            one_more(before),
            "{first:?} killed, {second:?} retried"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_of_a_killed_build_is_finished_once_by_the_other() {
    an_effect_of_a_killed_build_is_finished_once_by_the_other(Effect::Charge).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_of_a_killed_build_is_finished_once_by_the_other() {
    an_effect_of_a_killed_build_is_finished_once_by_the_other(Effect::Refund).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payout_of_a_killed_build_is_finished_once_by_the_other() {
    an_effect_of_a_killed_build_is_finished_once_by_the_other(Effect::Payout).await;
}

/// The migration that took the schema version out of a key's identity.
const OPERATION_FAMILY: i64 = 20261206000001;

/// Brings a fresh database to the schema just before [`OPERATION_FAMILY`], as the builds
/// before it left it.
async fn migrate_to_before_the_family(db: &TestDatabase) {
    let all = match db.backend {
        Backend::Postgres => sqlx::migrate!("../../migrations/postgres"),
        Backend::Sqlite => sqlx::migrate!("../../migrations/sqlite"),
    };
    let before = sqlx::migrate::Migrator {
        migrations: std::borrow::Cow::Owned(
            all.iter()
                .filter(|m| m.version < OPERATION_FAMILY)
                .cloned()
                .collect(),
        ),
        ..sqlx::migrate::Migrator::DEFAULT
    };
    match db.backend {
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(&db.url).await.expect("connect");
            before.run(&pool).await.expect("the migrations before");
            pool.close().await;
        }
        Backend::Sqlite => {
            let options: sqlx::sqlite::SqliteConnectOptions = db.url.parse().expect("a SQLite URL");
            let file = options.get_filename().to_owned();
            std::fs::create_dir_all(file.parent().expect("a directory")).expect("its directory");
            let pool = sqlx::SqlitePool::connect_with(options.create_if_missing(true))
                .await
                .expect("open");
            before.run(&pool).await.expect("the migrations before");
            pool.close().await;
        }
    }
}

/// A completed charge record as the builds before the family wrote it: scoped by
/// `charges.create.v1`, its response with no version of its own.
async fn write_a_completed_v1_record(db: &TestDatabase, key: &str, body: &Value, answer: &str) {
    let fingerprint = payments_idempotency::Fingerprint::of_json_request("POST", "/charges", body);
    let request_body = payments_idempotency::canonical_json(body);
    let headers = r#"[["content-type","application/json"],["location","/charges/ch_00000000-0000-4000-8000-000000000001"]]"#;
    let (headers_param, day_later) = match db.backend {
        Backend::Postgres => ("$4::jsonb", "now() + interval '1 day'"),
        Backend::Sqlite => ("$4", "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '+1 day')"),
    };
    let now = db.now();
    let sql = format!(
        "INSERT INTO idempotency_records
             (tenant_id, operation, idempotency_key, fingerprint, state, recovery_point,
              attempts, resource_id, processor_key, effect_id, response_status, response_headers,
              response_body, request_body, created_at, expires_at, updated_at)
         VALUES ('acme', 'charges.create.v1', $1, $2, 'completed', 'finished', 1, {resource},
                 'pay_00000000000040008000000000000001', 'sim_before_the_upgrade', 201,
                 {headers_param}, $5, $6, {now}, {day_later}, {now})",
        resource = db.uuid_param("$3"),
    );
    sqlx::query(&sql)
        .bind(key)
        .bind(fingerprint.as_bytes().to_vec())
        .bind("00000000-0000-4000-8000-000000000001")
        .bind(headers)
        .bind(answer.as_bytes().to_vec())
        .bind(request_body.into_bytes())
        .execute(&db.pool)
        .await
        .expect("write the record as the old build did");
}

/// A database that holds records written before the upgrade (`charges.create.v1`, fingerprinted
/// over the body as it was sent) is migrated by the new build, and a retry of such a record
/// replays it: its answer as stored, named version 1, and no charge at the processor, even for
/// a body spelled unlike the request's canonical form (`"USD"`, `"description": null`).
async fn records_written_before_the_upgrade_replay_after_it(backend: Backend) {
    let card_sim = CardSim::start().await;
    let db = TestDatabase::create(backend).await;
    migrate_to_before_the_family(&db).await;
    let key = new_key();
    let body =
        json!({ "amount": 4_200, "currency": "USD", "source": "tok_visa", "description": null });
    let stored = r#"{"id":"ch_00000000-0000-4000-8000-000000000001","amount":4200}"#;
    write_a_completed_v1_record(&db, &key, &body, stored).await;

    let service = Release.start(&db, &settings(&card_sim), &[]).await;
    let retry = post_to(&service, "/charges", &key, &body)
        .await
        .expect("answer");

    assert_eq!(retry.status().as_u16(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(schema_version(&retry), "1", "written by version 1");
    assert_eq!(
        retry.text().await.expect("body"),
        stored,
        "replayed as stored"
    );
    assert_eq!(card_sim.charges_created().await, 0, "nothing charged again");
    let record: (String, Option<i32>) = sqlx::query_as(
        "SELECT operation, response_schema_version FROM idempotency_records
         WHERE idempotency_key = $1",
    )
    .bind(&key)
    .fetch_one(&db.pool)
    .await
    .expect("the record");
    assert_eq!(
        record,
        ("charges.create".to_owned(), Some(1)),
        "kept, under its family"
    );
    let other = post_to(&service, "/charges", &key, &visa(1))
        .await
        .expect("answer");
    assert_eq!(
        other.status().as_u16(),
        422,
        "still the key of that request"
    );
}

on_every_backend!(records_written_before_the_upgrade_replay_after_it);
