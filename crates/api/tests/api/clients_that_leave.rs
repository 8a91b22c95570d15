//! A client that goes away mid-request: its own timeout (the usual reason to retry), a closed
//! connection, a reset HTTP/2 stream. The attempt it started runs to its end all the same, so the
//! charge the processor makes is recorded at once and the retry replays it; and the attempt
//! keeps its tenant's in-flight slot until then, so leaving is no way around the tenant's share.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::card_sim::CardSim;
use crate::helpers::{
    Backend, Footprint, Service, TestDatabase, new_key, problem, record_state, visa,
};

/// The processor takes 2 s for a charge; the client gives up after 0.5 s.
const PROCESSOR_LATENCY_MS: u64 = 2_000;
const CLIENT_TIMEOUT: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy)]
enum Protocol {
    Http1,
    Http2,
}

impl Protocol {
    fn client(self) -> reqwest::Client {
        let builder = reqwest::Client::builder().timeout(CLIENT_TIMEOUT);
        match self {
            Self::Http1 => builder.http1_only(),
            Self::Http2 => builder.http2_prior_knowledge(),
        }
        .build()
        .expect("a client")
    }
}

async fn an_attempt_outlives_the_client_that_started_it(backend: Backend, protocol: Protocol) {
    let card_sim = CardSim::start_with_latency_ms(PROCESSOR_LATENCY_MS).await;
    let db = TestDatabase::create(backend).await;
    let service = Service::start(
        &db.url,
        &[
            ("PAYMENTS__PROCESSOR__URL", card_sim.url.as_str()),
            ("PAYMENTS__PROCESSOR__TIMEOUT_MS", "5000"),
            // The completer looks at a record only a minute after its lock ended: whatever
            // records this charge within the test, it is not the completer.
            ("PAYMENTS__PROCESSOR__SETTLE_AFTER_MS", "60000"),
            ("PAYMENTS__SERVER__MAX_IN_FLIGHT_PER_TENANT", "1"),
            // One connection at a time: the next request gets in only once the service has
            // closed the connection of the client that gave up, and dropped its request.
            ("PAYMENTS__SERVER__MAX_CONNECTIONS", "1"),
        ],
    )
    .await;
    let (key, other_key) = (new_key(), new_key());
    let request_id = uuid::Uuid::new_v4().to_string();

    let gave_up = service
        .charge(&protocol.client(), &key, &visa(700))
        .header("X-Request-Id", &request_id)
        .send()
        .await;
    assert!(
        gave_up.as_ref().is_err_and(reqwest::Error::is_timeout),
        "the client gave up before the processor answered: {gave_up:?}"
    );

    // The attempt still holds the tenant's one slot.
    let (status, body) = problem(once_let_in(&service, &other_key, &visa(800)).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (429, Some("tenant_in_flight_limit"))
    );

    // And it records the charge once the processor has made it, with nobody waiting for it.
    let mut footprint = Footprint::of(&db.pool).await;
    for _ in 0..100 {
        if footprint == Footprint::charged(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        footprint = Footprint::of(&db.pool).await;
    }
    assert_eq!(footprint, Footprint::charged(1), "the charge was recorded");
    assert_eq!(record_state(&db, &key).await, "completed");
    assert_eq!(card_sim.charges_created().await, 1);
    // Its log lines still carry the id of the request that started it (read from the
    // service's output as it comes, which may be a moment after the commit).
    let deadline = Instant::now() + Duration::from_secs(10);
    let recorded = loop {
        let recorded = service
            .log_lines()
            .into_iter()
            .find(|line| line.contains("effect recorded"));
        if recorded.is_some() || Instant::now() > deadline {
            break recorded;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        recorded
            .as_ref()
            .is_some_and(|line| line.contains(&request_id)),
        "{recorded:?}"
    );

    // The retry replays it once the slot has come back, when the attempt has ended: a moment
    // after its commit.
    let deadline = Instant::now() + Duration::from_secs(10);
    let retry = loop {
        let retry = once_let_in(&service, &key, &visa(700)).await;
        if retry.status().as_u16() != 429 || Instant::now() > deadline {
            break retry;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(retry.status().as_u16(), 201);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    let replayed: Value = retry.json().await.expect("a charge");
    assert_eq!(replayed["amount"], 700);
    let other = once_let_in(&service, &other_key, &visa(800)).await;
    assert_eq!(other.status().as_u16(), 201);
    assert_eq!(card_sim.charges_created().await, 2);
    assert_eq!(Footprint::of(&db.pool).await, Footprint::charged(2));
}

async fn a_stopping_service_finishes_the_attempts_whose_clients_left(backend: Backend) {
    let card_sim = CardSim::start_with_latency_ms(PROCESSOR_LATENCY_MS).await;
    let db = TestDatabase::create(backend).await;
    let mut service = Service::start(
        &db.url,
        &[
            ("PAYMENTS__PROCESSOR__URL", card_sim.url.as_str()),
            ("PAYMENTS__PROCESSOR__TIMEOUT_MS", "5000"),
            ("PAYMENTS__PROCESSOR__SETTLE_AFTER_MS", "60000"),
        ],
    )
    .await;
    let key = new_key();
    let gave_up = service
        .charge(&Protocol::Http1.client(), &key, &visa(700))
        .send()
        .await;
    assert!(gave_up.as_ref().is_err_and(reqwest::Error::is_timeout));

    // Stopped with the attempt waiting on the processor and nobody waiting on the attempt.
    service.terminate();
    assert!(service.wait_exit().await, "a clean exit");
    assert_eq!(Footprint::of(&db.pool).await, Footprint::charged(1));
    assert_eq!(record_state(&db, &key).await, "completed");
    assert_eq!(card_sim.charges_created().await, 1);
}

/// `POST /charges` of `body` under `key`, sent again while the service refuses the connection
/// (it holds its one connection for another client).
async fn once_let_in(service: &Service, key: &str, body: &Value) -> reqwest::Response {
    for _ in 0..100 {
        // A connection refused at once was never read: nothing of the request was claimed.
        match service
            .charge(&reqwest::Client::new(), key, body)
            .send()
            .await
        {
            Ok(response) => return response,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    panic!("the service never let a second connection in");
}

async fn an_attempt_outlives_a_client_that_timed_out_over_http1(backend: Backend) {
    an_attempt_outlives_the_client_that_started_it(backend, Protocol::Http1).await;
}

async fn an_attempt_outlives_a_client_that_reset_its_http2_stream(backend: Backend) {
    an_attempt_outlives_the_client_that_started_it(backend, Protocol::Http2).await;
}

on_every_backend!(
    an_attempt_outlives_a_client_that_timed_out_over_http1,
    an_attempt_outlives_a_client_that_reset_its_http2_stream,
    a_stopping_service_finishes_the_attempts_whose_clients_left,
);
