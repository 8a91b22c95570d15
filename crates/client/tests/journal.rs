//! The journal as a caller that starts again lives it, against a scripted server: an answer
//! is kept only when it answers the request sent, a redirection is followed nowhere, and an
//! operation past its key's retention is sent again only while the service says it holds the
//! key.

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use payments_client::{
    Client, Error, FileJournal, Journal, JournalEntry, Operation, Origin, RetryPolicy,
    api_key_fingerprint,
};
use support::{charge, serve};

const EXPIRES: &str = "idempotency-key-expires: Tue, 01 Dec 2026 12:00:00 GMT\r\n";
const CHARGE: &str = r#"{"id":"ch_1","object":"charge","amount":100,"currency":"usd","source":"tok_visa","description":null,"status":"succeeded","processor_charge_id":"sim_1","amount_refunded":0,"created_at":"2026-12-01T12:00:00.000000Z"}"#;
/// What another request's answer looks like: a charge of one minor unit.
const ONE_UNIT: &str = r#"{"id":"ch_9","object":"charge","amount":1,"currency":"usd","source":"tok_visa","description":null,"status":"succeeded","processor_charge_id":"sim_9","amount_refunded":0,"created_at":"2026-12-01T12:00:00.000000Z"}"#;
const NOT_FOUND: &str = r#"{"type":"/problems/not_found","title":"Not Found","status":404,"detail":"No such idempotency key","code":"not_found"}"#;

/// A journal in a directory of its own.
fn journal() -> (PathBuf, Arc<FileJournal>) {
    let dir = std::env::temp_dir().join(format!("journal-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    let journal = FileJournal::open(dir.join("journal")).expect("journal");
    (dir, Arc::new(journal))
}

fn client(url: &str, journal: &Arc<FileJournal>) -> Client {
    let policy = RetryPolicy {
        attempt_timeout: Duration::from_secs(1),
        deadline: Duration::from_secs(5),
        base_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
        prefer_wait_secs: None,
    };
    Client::new(url, "sk_test_acme")
        .expect("client")
        .with_policy(policy)
        .with_journal(Arc::clone(journal) as Arc<dyn Journal>)
}

/// `text` for as long as the test runs, as the script takes it.
fn leak(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

#[tokio::test]
async fn an_answer_to_another_request_is_an_error_and_never_journaled() {
    // First a 201 for one minor unit, with all a stored answer carries, to a charge of 100.
    let server = serve(vec![
        Some((201, EXPIRES, ONE_UNIT)),
        Some((201, EXPIRES, CHARGE)),
    ])
    .await;
    let (dir, journal) = journal();
    let client = client(&server.url, &journal);
    let operation = Operation::new().journaled("order-1");
    let error = client
        .create_charge(&charge(), &operation)
        .await
        .expect_err("another request's answer");
    assert!(
        matches!(
            &error,
            Error::AnswerMismatch {
                field: "amount",
                ..
            }
        ),
        "{error:?}"
    );
    let entry = journal.entry("order-1").expect("read").expect("recorded");
    assert_eq!(entry.answer, None, "not journaled");

    // Started again, it resumes under its key and keeps the answer that answers it.
    let answer = client
        .create_charge(&charge(), &operation)
        .await
        .expect("charged");
    assert_eq!(
        (answer.value.amount, answer.origin),
        (100, Origin::Executed)
    );
    assert_eq!(*server.keys.lock().expect("keys"), [entry.key.as_str(); 2]);
    let entry = journal.entry("order-1").expect("read").expect("recorded");
    assert_eq!(entry.answer.expect("journaled").body["amount"], 100);
    std::fs::remove_dir_all(dir).expect("clean up");
}

#[tokio::test]
async fn a_redirection_is_an_error_followed_nowhere_and_never_journaled() {
    let elsewhere = serve(vec![Some((201, EXPIRES, ONE_UNIT))]).await;
    let location = leak(format!("location: {}/charges\r\n", elsewhere.url));
    let server = serve(vec![Some((307, location, ""))]).await;
    let (dir, journal) = journal();
    let error = client(&server.url, &journal)
        .create_charge(&charge(), &Operation::new().journaled("order-1"))
        .await
        .expect_err("a redirection");
    assert!(
        matches!(&error, Error::Redirected { status: 307, .. }),
        "{error:?}"
    );
    assert_eq!(server.keys.lock().expect("keys").len(), 1, "sent once");
    assert!(elsewhere.keys.lock().expect("keys").is_empty(), "and there");
    let entry = journal.entry("order-1").expect("read").expect("recorded");
    assert_eq!(entry.answer, None);
    std::fs::remove_dir_all(dir).expect("clean up");
}

/// An entry of a charge first sent two days ago (past a day's retention) and never answered.
fn two_days_old(url: &str, name: &str) -> JournalEntry {
    let sent = SystemTime::now() - Duration::from_secs(2 * 86_400);
    let request = serde_json::to_vec(&charge()).expect("JSON");
    JournalEntry {
        name: name.to_owned(),
        request: format!("POST /charges sha256:{}", sha256_hex(&request)),
        key: format!("key-{name}"),
        base_url: format!("{url}/"),
        api_key_fingerprint: api_key_fingerprint("sk_test_acme"),
        recorded_at: Some(sent.duration_since(UNIX_EPOCH).expect("now").as_secs()),
        key_retention_secs: Some(86_400),
        answer: None,
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// `GET /idempotency-keys/{key}`'s answer for a completed key expiring `in_secs` from now.
fn completed(key: &str, in_secs: i64) -> &'static str {
    let expires = chrono::Utc::now() + chrono::Duration::seconds(in_secs);
    leak(
        serde_json::json!({
            "object": "idempotency_key", "key": key, "operation": "charges.create",
            "state": "completed", "recovery_point": "finished", "attempts": 1,
            "response_status": 201, "response_schema_version": 1, "fingerprint": "00",
            "locked_until": null, "created_at": "2026-12-01T12:00:00.000000Z",
            "expires_at": expires.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        })
        .to_string(),
    )
}

#[tokio::test]
async fn an_entry_past_the_retention_is_sent_again_only_while_the_service_holds_its_key() {
    let server = serve(vec![
        // gone: the service holds no such key.
        Some((404, "", NOT_FOUND)),
        // held: an hour to go, so it is sent again and replayed.
        Some((200, "", completed("key-held", 3_600))),
        Some((
            201,
            leak(format!("{EXPIRES}idempotent-replayed: true\r\n")),
            CHARGE,
        )),
        // expiring: thirty seconds to go, less than the margin before its end.
        Some((200, "", completed("key-expiring", 30))),
    ])
    .await;
    let (dir, journal) = journal();
    for name in ["gone", "held", "expiring"] {
        journal
            .record(&two_days_old(&server.url, name))
            .expect("record");
    }
    let client = client(&server.url, &journal);
    let resume = |name: &str| {
        let operation = Operation::new().journaled(name);
        let client = client.clone();
        async move { client.create_charge(&charge(), &operation).await }
    };

    let gone = resume("gone").await.expect_err("the key is gone");
    match &gone {
        Error::KeyGone { key, list, .. } => {
            assert_eq!((key.as_str(), list.as_str()), ("key-gone", "GET /charges"));
        }
        other => panic!("{other:?}"),
    }
    assert!(gone.to_string().contains("nothing was sent"), "{gone}");
    let held = resume("held").await.expect("resumed");
    assert_eq!(
        (held.value.id.as_str(), held.origin),
        ("ch_1", Origin::Replayed)
    );
    let expiring = resume("expiring").await.expect_err("too late to send");
    assert!(matches!(expiring, Error::KeyGone { .. }), "{expiring:?}");

    let asked = |key: &str| format!("GET /idempotency-keys/{key}?operation=charges.create");
    assert_eq!(
        *server.requests.lock().expect("requests"),
        [
            asked("key-gone"),
            asked("key-held"),
            "POST /charges".to_owned(),
            asked("key-expiring"),
        ],
        "nothing sent under a key the service no longer holds"
    );
    std::fs::remove_dir_all(dir).expect("clean up");
}

/// A hold of 5000 captured for 2000, as `POST /charges/ch_1/capture` answers.
const CAPTURED: &str = r#"{"id":"ch_1","object":"charge","amount":5000,"currency":"usd","source":"tok_visa","description":null,"status":"succeeded","processor_charge_id":"sim_1","created_at":"2026-12-01T12:00:00.000000Z","amount_refunded":0,"captured":true,"amount_capturable":0,"amount_captured":2000,"capture_before":"2026-12-08T12:00:00.000000Z"}"#;
/// Another hold, captured for all of its 5000.
const CAPTURED_ELSEWHERE: &str = r#"{"id":"ch_9","object":"charge","amount":5000,"currency":"usd","source":"tok_visa","description":null,"status":"succeeded","processor_charge_id":"sim_9","created_at":"2026-12-01T12:00:00.000000Z","amount_refunded":0,"captured":true,"amount_capturable":0,"amount_captured":5000,"capture_before":"2026-12-08T12:00:00.000000Z"}"#;
const CANCELED: &str = r#"{"id":"ch_2","object":"charge","amount":5000,"currency":"usd","source":"tok_visa","description":null,"status":"canceled","processor_charge_id":"sim_2","created_at":"2026-12-01T12:00:00.000000Z","amount_refunded":0,"captured":false,"amount_capturable":0,"amount_captured":0,"capture_before":"2026-12-08T12:00:00.000000Z","cancellation_reason":"abandoned"}"#;
const UNAVAILABLE: &str = r#"{"type":"/problems/processor_unavailable","title":"Service Unavailable","status":503,"detail":"unknown","code":"processor_unavailable"}"#;

#[tokio::test]
async fn a_capture_and_a_cancel_are_journaled_under_one_key_as_their_charge_answers() {
    use payments_client::types::{
        CancelRequest, CanceledBecause, CancellationReason, CaptureRequest, ChargeStatus,
    };
    let server = serve(vec![
        // The capture: lost once, then another charge's capture (not this one's answer),
        Some((503, "", UNAVAILABLE)),
        Some((200, EXPIRES, CAPTURED_ELSEWHERE)),
        // then, started again, its own.
        Some((200, EXPIRES, CAPTURED)),
        Some((200, EXPIRES, CANCELED)),
    ])
    .await;
    let (dir, journal) = journal();
    let client = client(&server.url, &journal);
    let capture = CaptureRequest {
        amount_to_capture: Some(2000),
    };
    let operation = Operation::new().journaled("capture-1");
    let error = client
        .capture_charge("ch_1", &capture, &operation)
        .await
        .expect_err("another charge's answer");
    assert!(
        matches!(&error, Error::AnswerMismatch { field: "id", .. }),
        "{error:?}"
    );
    let entry = journal.entry("capture-1").expect("read").expect("recorded");
    assert_eq!(entry.answer, None, "not journaled");
    assert!(
        entry
            .request
            .starts_with("POST /charges/ch_1/capture sha256:"),
        "{}",
        entry.request
    );

    let captured = client
        .capture_charge("ch_1", &capture, &operation)
        .await
        .expect("captured");
    assert_eq!(
        (captured.value.status, captured.value.amount_captured),
        (ChargeStatus::Succeeded, Some(2000))
    );
    assert_eq!(*server.keys.lock().expect("keys"), [entry.key.as_str(); 3]);
    // Asked again, the journal answers and nothing is sent.
    let again = client
        .capture_charge("ch_1", &capture, &operation)
        .await
        .expect("from the journal");
    assert_eq!(
        (again.origin, again.value),
        (Origin::Journal, captured.value)
    );

    let cancel = CancelRequest {
        cancellation_reason: Some(CancellationReason::Abandoned),
    };
    let canceled = client
        .cancel_charge("ch_2", &cancel, &Operation::new().journaled("cancel-2"))
        .await
        .expect("canceled");
    assert_eq!(
        (canceled.value.status, canceled.value.cancellation_reason),
        (ChargeStatus::Canceled, Some(CanceledBecause::Abandoned))
    );
    let cancel_entry = journal.entry("cancel-2").expect("read").expect("recorded");
    assert_eq!(cancel_entry.answer.expect("journaled").body["id"], "ch_2");
    assert_eq!(
        *server.requests.lock().expect("requests"),
        [
            "POST /charges/ch_1/capture",
            "POST /charges/ch_1/capture",
            "POST /charges/ch_1/capture",
            "POST /charges/ch_2/cancel",
        ]
    );
    std::fs::remove_dir_all(dir).expect("clean up");
}

#[tokio::test]
async fn a_capture_whose_key_is_gone_is_never_sent_and_its_charge_says_whether_it_was_made() {
    use payments_client::types::CaptureRequest;
    let server = serve(vec![Some((404, "", NOT_FOUND))]).await;
    let (dir, journal) = journal();
    let body = serde_json::to_vec(&CaptureRequest::default()).expect("JSON");
    let entry = JournalEntry {
        request: format!("POST /charges/ch_1/capture sha256:{}", sha256_hex(&body)),
        ..two_days_old(&server.url, "capture-1")
    };
    journal.record(&entry).expect("record");
    let error = client(&server.url, &journal)
        .capture_charge(
            "ch_1",
            &CaptureRequest::default(),
            &Operation::new().journaled("capture-1"),
        )
        .await
        .expect_err("the key is gone");
    match &error {
        Error::KeyGone { list, .. } => assert_eq!(list, "GET /charges/ch_1"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        *server.requests.lock().expect("requests"),
        ["GET /idempotency-keys/key-capture-1?operation=charges.capture"],
        "asked about the key under its operation, and nothing sent"
    );
    std::fs::remove_dir_all(dir).expect("clean up");
}
