//! No card number, however it is spelt and wherever a client or an operator writes it, is
//! stored or logged.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::header::HeaderValue;
use serde_json::{Value, json};
use sqlx::Row;

use super::header;
use crate::helpers::{
    ACME, Backend, TestApp, new_key, problem, redis_key_prefix, spawn_app_with, test_redis_url,
    visa,
};

/// The card number every spelling below writes.
const NUMBER: &str = "4242424242424242";

/// Every spelling of it that got past the first filter (and three it always caught).
const SPELLINGS: [&str; 13] = [
    "4242.4242.4242.4242",
    "4242/4242/4242/4242",
    "4242\t4242\t4242\t4242",
    "4242\n4242\n4242\n4242",
    "4242\u{a0}4242\u{a0}4242\u{a0}4242",
    "4242\u{200b}4242\u{200b}4242\u{200b}4242",
    "4242    4242    4242    4242",
    "4242_4242_4242_4242",
    "42424242-42424242",
    "４２４２４２４２４２４２４２４２",
    "4242424242424242",
    "4242 4242 4242 4242",
    "4242-4242-4242-4242",
];

/// The demo's public operator key, which serves beside the demo tenant keys.
const DEMO_OPERATOR: &str = "sk_test_ops";

/// The digits of `text`, in ASCII, full-width, Arabic-Indic or mathematical digits, run
/// together with everything between them dropped: a cell or a log line holds the number if
/// these hold it, whatever separated its digits.
fn digits(text: &str) -> String {
    text.chars()
        .filter_map(|c| {
            ['0', '０', '٠', '𝟎'].into_iter().find_map(|zero| {
                let value = u32::from(c).checked_sub(u32::from(zero))?;
                char::from_digit(value, 10)
            })
        })
        .collect()
}

/// Whether `text` holds the number's digits, however they are written and separated.
fn holds_the_number(text: &str) -> bool {
    digits(text).contains(NUMBER)
}

/// Every byte but ASCII letters, digits and `.-_~` percent-encoded, as a client puts text in
/// a path.
fn path_segment(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'~') {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Rows in every table of the service's database.
async fn row_counts(app: &TestApp) -> BTreeMap<String, i64> {
    let mut tables: Vec<String> = columns(app).await.into_iter().map(|(t, _, _)| t).collect();
    tables.dedup();
    let mut counts = BTreeMap::new();
    for table in tables {
        let count: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM \"{table}\""))
            .fetch_one(app.db())
            .await
            .expect("count rows");
        counts.insert(table, count);
    }
    counts
}

/// Every (table, column) of the service's database, and whether it holds bytes.
async fn columns(app: &TestApp) -> Vec<(String, String, bool)> {
    let listing = match app.database.backend {
        Backend::Postgres => {
            "SELECT CAST(table_name AS TEXT), CAST(column_name AS TEXT), \
             CAST(data_type AS TEXT) \
             FROM information_schema.columns WHERE table_schema = 'public' \
             ORDER BY table_name, ordinal_position"
        }
        Backend::Sqlite => {
            "SELECT m.name, p.name, p.type \
             FROM sqlite_master m JOIN pragma_table_info(m.name) p \
             WHERE m.type = 'table' ORDER BY m.name, p.cid"
        }
    };
    sqlx::query(listing)
        .fetch_all(app.db())
        .await
        .expect("list the columns")
        .iter()
        .map(|row| {
            let kind: String = row.get(2);
            let bytes = kind.eq_ignore_ascii_case("bytea") || kind.eq_ignore_ascii_case("blob");
            (row.get(0), row.get(1), bytes)
        })
        .collect()
}

/// Every value of every column of every table, as text: stored bodies (bytea, BLOB) as the
/// text they hold, everything else as the text it prints as.
async fn every_cell(app: &TestApp) -> Vec<(String, String, String)> {
    let mut cells = Vec::new();
    for (table, column, bytes) in columns(app).await {
        let select = match (app.database.backend, bytes) {
            (Backend::Postgres, true) => format!("SELECT \"{column}\" FROM \"{table}\""),
            (Backend::Postgres, false) => {
                format!("SELECT convert_to(CAST(\"{column}\" AS TEXT), 'UTF8') FROM \"{table}\"")
            }
            (Backend::Sqlite, _) => format!("SELECT CAST(\"{column}\" AS BLOB) FROM \"{table}\""),
        };
        let values: Vec<Option<Vec<u8>>> = sqlx::query_scalar(&select)
            .fetch_all(app.db())
            .await
            .unwrap_or_else(|e| panic!("{select}: {e}"));
        for value in values.into_iter().flatten() {
            let text = String::from_utf8_lossy(&value).into_owned();
            cells.push((table.clone(), column.clone(), text));
        }
    }
    cells
}

/// Every name and value the service keeps in Redis: the replay cache's keys and entries and
/// the event stream's entries, as text.
async fn everything_in_redis(app: &TestApp) -> Vec<String> {
    let mut redis = redis::Client::open(test_redis_url())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to redis");
    let pattern = format!("{}:*", redis_key_prefix(&app.database.url));
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(&pattern)
        .query_async(&mut redis)
        .await
        .expect("KEYS");
    assert!(
        !keys.is_empty(),
        "nothing under {pattern}: the scan would prove nothing"
    );
    let mut found = Vec::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(&mut redis)
            .await
            .expect("TYPE");
        let command = if kind == "stream" { "XRANGE" } else { "GET" };
        let mut value = redis::cmd(command);
        value.arg(&key);
        if kind == "stream" {
            value.arg("-").arg("+");
        }
        let value: redis::Value = value.query_async(&mut redis).await.expect(command);
        let mut text = key.clone();
        text_of(&value, &mut text);
        found.push(text);
    }
    found
}

/// The bytes and strings of a Redis reply, appended to `out` as text.
fn text_of(value: &redis::Value, out: &mut String) {
    match value {
        redis::Value::BulkString(bytes) => out.push_str(&String::from_utf8_lossy(bytes)),
        redis::Value::SimpleString(text) => out.push_str(text),
        redis::Value::Array(values) | redis::Value::Set(values) => {
            for value in values {
                out.push('\n');
                text_of(value, out);
            }
        }
        redis::Value::Map(pairs) => {
            for (key, value) in pairs {
                out.push('\n');
                text_of(key, out);
                out.push('\n');
                text_of(value, out);
            }
        }
        _ => {}
    }
}

/// A POST of `body` to `path` as `api_key` under `key`.
async fn post(app: &TestApp, path: &str, api_key: &str, key: &str, body: &Value) -> (u16, Value) {
    let response = app
        .client
        .post(app.url(path))
        .bearer_auth(api_key)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .expect("POST");
    problem(response).await
}

/// An open reconciliation exception, for the operator's note: a charge the processor made
/// for another amount, found by the day's run.
async fn an_open_exception(app: &TestApp) -> String {
    let mismatched = json!({ "amount": 500, "currency": "usd", "source": "tok_amountMismatch" });
    let (status, _) = problem(app.post_charge(ACME, &new_key(), &mismatched).await).await;
    assert_eq!(status, 503);
    let today = json!({ "date": chrono::Utc::now().date_naive().to_string() });
    let run = app
        .client
        .post(app.url("/ops/reconciliations"))
        .bearer_auth(DEMO_OPERATOR)
        .json(&today)
        .send()
        .await
        .expect("POST /ops/reconciliations");
    assert_eq!(run.status().as_u16(), 200);
    let open = app.get_json(DEMO_OPERATOR, "/ops/exceptions").await;
    open["data"][0]["id"]
        .as_str()
        .expect("an exception")
        .to_owned()
}

/// The second security review sent a card number in a dozen spellings through every field a
/// client or an operator writes, and most were stored: in a charge's or a payout's
/// description, a source, a destination, an operator's note, an `Idempotency-Key`; and logged,
/// from an `X-Request-Id` or a URL path. Every write with one is now a 400 before the claim,
/// which changes no row of any table; a request id holding one is replaced and never logged
/// as sent; a path holding one is logged masked. Afterwards no cell of any table and no log
/// line (at debug level) holds the number's digits, in any script.
async fn no_spelling_of_a_card_number_is_stored_or_logged(backend: Backend) {
    let app = spawn_app_with(
        backend,
        &[
            ("RUST_LOG", "debug"),
            ("PAYMENTS__WORKERS__COMPLETER_INTERVAL_MS", "3600000"),
        ],
    )
    .await;
    let exception = an_open_exception(&app).await;
    let resolve = format!("/ops/exceptions/{exception}/resolve");
    let charge = app.charged(5_000, "tok_visa").await;
    let before = row_counts(&app).await;

    for spelling in SPELLINGS {
        let charge_with = |field: &str, value: String| {
            let mut body = visa(100);
            body[field] = json!(value);
            body
        };
        let writes = [
            (
                "/charges",
                ACME,
                charge_with("description", spelling.into()),
            ),
            (
                "/charges",
                ACME,
                charge_with("source", format!("tok_{spelling}")),
            ),
            (
                "/payouts",
                ACME,
                json!({ "amount": 100, "currency": "usd", "destination": format!("ba_{spelling}") }),
            ),
            (
                "/payouts",
                ACME,
                json!({ "amount": 100, "currency": "usd", "destination": "ba_checking",
                        "description": spelling }),
            ),
            (
                resolve.as_str(),
                DEMO_OPERATOR,
                json!({ "action": "accept", "note": spelling }),
            ),
        ];
        for (path, api_key, body) in writes {
            let (status, answer) = post(&app, path, api_key, &new_key(), &body).await;
            assert_eq!(
                (status, answer["code"].as_str()),
                (400, Some("card_number_not_allowed")),
                "{path} {body}"
            );
            assert!(!holds_the_number(&answer.to_string()), "{answer}");
            assert_eq!(row_counts(&app).await, before, "{path} {body}");
        }

        // As the key itself. A spelling a header cannot carry (a newline) is not sent; one
        // with spaces or other than visible ASCII is no key at all.
        if let Ok(value) = HeaderValue::from_bytes(spelling.as_bytes()) {
            let response = app
                .client
                .post(app.url("/charges"))
                .bearer_auth(ACME)
                .header("Idempotency-Key", value)
                .json(&visa(100))
                .send()
                .await
                .expect("POST");
            let (status, answer) = problem(response).await;
            let visible_ascii = spelling.bytes().all(|b| b.is_ascii_graphic());
            let code = if visible_ascii {
                "card_number_not_allowed"
            } else {
                "idempotency_key_invalid"
            };
            assert_eq!(
                (status, answer["code"].as_str()),
                (400, Some(code)),
                "{spelling:?}"
            );
            assert_eq!(row_counts(&app).await, before, "key {spelling:?}");
        }

        // In the path of a read and of a write: no such resource, nothing written.
        let segment = path_segment(spelling);
        let read = app.get(ACME, &format!("/charges/{segment}")).await;
        assert_eq!(read.status().as_u16(), 404, "{spelling:?}");
        let refund = format!("/charges/{segment}/refunds");
        let (status, _) = post(&app, &refund, ACME, &new_key(), &json!({})).await;
        assert_eq!(status, 404, "{spelling:?}");
        assert_eq!(row_counts(&app).await, before, "path {spelling:?}");
    }

    // As a request id: the charge is made, under an id of the service's own.
    let mut charged_with_request_ids = 0;
    for spelling in SPELLINGS {
        let Ok(value) = HeaderValue::from_bytes(spelling.as_bytes()) else {
            continue;
        };
        let response = app
            .charge(ACME, &new_key(), &visa(100))
            .header("X-Request-Id", value)
            .send()
            .await
            .expect("POST");
        assert_eq!(response.status().as_u16(), 201, "{spelling:?}");
        let id = header(&response, "x-request-id").expect("a request id");
        assert!(uuid::Uuid::parse_str(&id).is_ok(), "{id}");
        charged_with_request_ids += 1;
    }
    assert_eq!(charged_with_request_ids, SPELLINGS.len() - 1);
    // A refund of the first charge, so that the refunds table has a row to read too.
    let refunded = app
        .post_refund(ACME, &charge, &new_key(), &json!({ "amount": 100 }))
        .await;
    assert_eq!(refunded.status().as_u16(), 201);

    let holding: Vec<_> = every_cell(&app)
        .await
        .into_iter()
        .filter(|(_, _, text)| holds_the_number(text))
        .collect();
    assert!(holding.is_empty(), "cells holding the number: {holding:?}");
    // The replay cache (whose key names held the Idempotency-Key) and the event stream.
    let cached: Vec<_> = everything_in_redis(&app)
        .await
        .into_iter()
        .filter(|text| holds_the_number(text))
        .collect();
    assert!(
        cached.is_empty(),
        "Redis entries holding the number: {cached:?}"
    );

    // Every line is in once a request sent after all the others has been logged.
    let marker = format!("/after-everything-{}", uuid::Uuid::new_v4().simple());
    assert_eq!(app.get(ACME, &marker).await.status().as_u16(), 404);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let log = loop {
        let log = app.log_lines();
        if log.iter().any(|line| line.contains(&marker)) {
            break log;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the marker request was never logged"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let logged: Vec<_> = log.iter().filter(|line| holds_the_number(line)).collect();
    assert!(
        logged.is_empty(),
        "log lines holding the number: {logged:?}"
    );
    // The log did see the requests: the masked paths are there.
    assert!(
        log.iter()
            .any(|line| line.contains("/charges/****.****.****.****")),
        "no masked path in the log"
    );
}

// ---------------------------------------------------------------------------------------------

on_every_backend!(no_spelling_of_a_card_number_is_stored_or_logged);
