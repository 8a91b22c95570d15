//! The retry policy as a caller lives it: against a scripted server that answers each request
//! with the next answer of its script, the client retries what is not final under one key,
//! honours `Retry-After`, keeps its deadline, and stops at a final answer.

mod support;

use std::time::{Duration, Instant, SystemTime};

use payments_client::{Client, Error, Operation, Origin, RetryPolicy};
use support::{charge, serve};

fn policy(deadline: Duration) -> RetryPolicy {
    RetryPolicy {
        attempt_timeout: Duration::from_secs(1),
        deadline,
        base_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
        prefer_wait_secs: None,
    }
}

const CHARGE: &str = r#"{"id":"ch_1","object":"charge","amount":100,"currency":"USD","source":"tok_visa","description":null,"status":"succeeded","processor_charge_id":"sim_1","amount_refunded":0,"created_at":"2026-12-01T12:00:00.000000Z"}"#;
const IN_USE: &str = r#"{"type":"/problems/idempotency_key_in_use","title":"Conflict","status":409,"detail":"in flight","code":"idempotency_key_in_use"}"#;
const UNAVAILABLE: &str = r#"{"type":"/problems/processor_unavailable","title":"Service Unavailable","status":503,"detail":"unknown","code":"processor_unavailable"}"#;
const REUSED: &str = r#"{"type":"/problems/idempotency_key_reused","title":"Unprocessable Content","status":422,"detail":"another request","code":"idempotency_key_reused"}"#;
const INVALID: &str = r#"{"type":"/problems/invalid_request","title":"Bad Request","status":400,"detail":"amount","code":"invalid_request"}"#;

#[tokio::test]
async fn what_is_not_final_is_retried_under_one_key_until_the_answer() {
    let server = serve(vec![
        None,
        Some((409, "retry-after: 0\r\n", IN_USE)),
        Some((503, "", UNAVAILABLE)),
        Some((201, "idempotent-replayed: true\r\n", CHARGE)),
    ])
    .await;
    let client = Client::new(&server.url, "sk").expect("client");
    let client = client.with_policy(policy(Duration::from_secs(10)));
    let operation = Operation::with_key("order-1");
    let answer = client
        .create_charge(&charge(), &operation)
        .await
        .expect("charged");
    assert_eq!((answer.attempts, answer.origin), (4, Origin::Replayed));
    assert_eq!(answer.value.id, "ch_1");
    assert_eq!(*server.keys.lock().expect("keys"), ["order-1"; 4]);
}

#[tokio::test]
async fn prefer_wait_is_sent_when_asked_for() {
    let server = serve(vec![Some((201, "", CHARGE))]).await;
    let policy = RetryPolicy {
        prefer_wait_secs: Some(5),
        ..policy(Duration::from_secs(10))
    };
    let client = Client::new(&server.url, "sk")
        .expect("client")
        .with_policy(policy);
    let answer = client
        .create_charge(&charge(), &Operation::with_key("k"))
        .await
        .expect("charged");
    assert_eq!(answer.origin, Origin::Executed);
    assert_eq!(*server.keys.lock().expect("keys"), ["k (wait=5)"]);
}

#[tokio::test]
async fn a_final_answer_is_never_retried_and_a_changed_request_says_so() {
    let server = serve(vec![Some((422, "", REUSED)), Some((400, "", INVALID))]).await;
    let client = Client::new(&server.url, "sk").expect("client");
    let client = client.with_policy(policy(Duration::from_secs(10)));
    let error = client
        .create_charge(&charge(), &Operation::with_key("k"))
        .await
        .expect_err("422");
    assert!(matches!(&error, Error::RequestChanged { key, .. } if key == "k"));
    assert!(
        error.to_string().contains("changed under one key"),
        "{error}"
    );
    let invalid = client.create_charge(&charge(), &Operation::new()).await;
    match invalid.expect_err("400") {
        Error::Problem { problem } => assert_eq!(problem.code, "invalid_request"),
        other => panic!("{other:?}"),
    }
    assert_eq!(server.keys.lock().expect("keys").len(), 2, "each sent once");
}

#[tokio::test]
async fn retry_after_is_honoured_and_the_deadline_kept() {
    // Retry-After: 1 every time, and 2.5 s to go: attempts at about 0, 1 and 2 s; a third wait
    // would end past the deadline, so the client stops there instead of waiting.
    let unavailable = Some((503, "retry-after: 1\r\n", UNAVAILABLE));
    let server = serve(vec![unavailable; 10]).await;
    let client = Client::new(&server.url, "sk").expect("client");
    let client = client.with_policy(policy(Duration::from_millis(2_500)));
    let (started, sent_at) = (Instant::now(), SystemTime::now());
    let error = client
        .create_charge(&charge(), &Operation::with_key("k"))
        .await
        .expect_err("no final answer");
    let elapsed = started.elapsed();
    match &error {
        Error::OutcomeUnknown {
            key,
            attempts,
            last,
            resend_before,
        } => {
            assert_eq!((key.as_deref(), *attempts), (Some("k"), 3));
            assert!(last.starts_with("503"), "{last}");
            // A day's retention from the first send, less a minute's margin and the deadline
            // of the resend.
            let before = resend_before.expect("until when a resend is covered");
            let expected = sent_at + Duration::from_millis(86_400_000 - 60_000 - 2_500);
            let off = before
                .duration_since(expected)
                .unwrap_or_else(|early| early.duration());
            assert!(off < Duration::from_secs(1), "{before:?}, {expected:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        elapsed >= Duration::from_secs(2),
        "waited as told: {elapsed:?}"
    );
    assert!(elapsed < Duration::from_millis(2_500), "{elapsed:?}");

    // A server that never answers: each attempt times out, and the deadline ends them (the
    // third attempt's timeout cut to what is left).
    let silent = serve(vec![None; 20]).await;
    let client = Client::new(&silent.url, "sk").expect("client");
    let client = client.with_policy(policy(Duration::from_millis(2_500)));
    let started = Instant::now();
    let error = client
        .create_charge(&charge(), &Operation::with_key("k"))
        .await
        .expect_err("no answer");
    assert!(
        matches!(&error, Error::OutcomeUnknown { last, .. } if last.starts_with("timed out")),
        "{error:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(3_000),
        "{:?}",
        started.elapsed()
    );
    assert!(
        error
            .to_string()
            .contains("send it again under the key \"k\" before "),
        "{error}"
    );
}
