//! Shutdown: the service stops promptly even while its completer has records in hand.

use std::time::{Duration, Instant};

use futures::future::join_all;
use tokio::net::TcpListener;

use crate::helpers::{Backend, Service, TestDatabase, new_key, visa};

/// A processor that accepts connections and never answers: every call runs into the timeout.
async fn black_hole() -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (url, task)
}

async fn the_service_exits_within_two_seconds_of_sigterm_with_records_in_the_completers_hands(
    backend: Backend,
) {
    let (processor_url, _black_hole) = black_hole().await;
    let db = TestDatabase::create(backend).await;
    let mut service = Service::start(
        &db.url,
        &[
            ("PAYMENTS__PROCESSOR__URL", processor_url.as_str()),
            // Long enough that a completer waiting out the call in hand could not exit in time.
            ("PAYMENTS__PROCESSOR__TIMEOUT_MS", "4000"),
            ("PAYMENTS__PROCESSOR__SETTLE_AFTER_MS", "4100"),
            ("PAYMENTS__WORKERS__COMPLETER_INTERVAL_MS", "100"),
        ],
    )
    .await;
    // Five charges whose outcome is unknown: each call times out, each record is released.
    let keys: Vec<String> = (0..5).map(|_| new_key()).collect();
    let body = visa(100);
    let answers = join_all(keys.iter().map(|key| service.post_charge(key, &body))).await;
    assert!(answers.iter().all(|r| r.status().as_u16() == 503));

    // Wait until the completer has taken a record over and is waiting on the processor.
    let mut in_hand = 0;
    for _ in 0..100 {
        in_hand = sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM idempotency_records WHERE attempts >= 2",
        )
        .fetch_one(&db.pool)
        .await
        .expect("count");
        if in_hand > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(in_hand > 0, "the completer holds a record");

    let asked = Instant::now();
    service.terminate();
    assert!(service.wait_exit().await, "a clean exit");
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "exited {took:?} after SIGTERM, with the completer mid-call"
    );
    // Nothing was lost: every record is still pending, to be settled after a restart.
    let pending: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_records WHERE state = 'pending'")
            .fetch_one(&db.pool)
            .await
            .expect("count");
    assert_eq!(pending, 5);
}

on_every_backend!(
    the_service_exits_within_two_seconds_of_sigterm_with_records_in_the_completers_hands,
);
