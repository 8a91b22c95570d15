//! Each tenant's rate: a token bucket per tenant, checked before anything else.

use std::time::Duration;

use super::header;
use crate::helpers::{ACME, Backend, Footprint, GLOBEX, new_key, problem, spawn_app_with, visa};

/// A tenant that sends requests faster than its rate (a runaway retry loop, or an attacker with
/// one tenant's key) would otherwise take the instance's capacity from every other tenant. At
/// one request a second with a burst of two, acme's third charge in a row is 429
/// `rate_limited` with `Retry-After`, as problem+json, and stores nothing: the key is not
/// consumed, so the same request succeeds once acme waits as told. globex, with a bucket of its
/// own, is served meanwhile.
async fn a_tenant_over_its_rate_gets_429_and_its_key_stays_free(backend: Backend) {
    let app = spawn_app_with(
        backend,
        &[
            ("PAYMENTS__AUTH__RATE_LIMIT_PER_SEC", "1"),
            ("PAYMENTS__AUTH__RATE_LIMIT_BURST", "2"),
        ],
    )
    .await;
    for _ in 0..2 {
        let within = app.post_charge(ACME, &new_key(), &visa(100)).await;
        assert_eq!(within.status().as_u16(), 201, "within acme's burst");
    }
    let key = new_key();
    let over = app.post_charge(ACME, &key, &visa(100)).await;
    let retry_after = header(&over, "retry-after");
    let (status, body) = problem(over).await;
    assert_eq!((status, body["code"].as_str()), (429, Some("rate_limited")));
    assert_eq!(retry_after.as_deref(), Some("1"), "{body}");

    let globex = app.post_charge(GLOBEX, &new_key(), &visa(100)).await;
    assert_eq!(
        globex.status().as_u16(),
        201,
        "globex has a bucket of its own"
    );
    assert_eq!(
        app.footprint().await,
        Footprint::charged(3),
        "nothing of the 429"
    );

    // Waiting as long as the answer said is enough: a client that obeys Retry-After is
    // served.
    let wait = retry_after
        .and_then(|secs| secs.parse().ok())
        .unwrap_or(u64::MAX);
    tokio::time::sleep(Duration::from_secs(wait)).await;
    let retried = app.post_charge(ACME, &key, &visa(100)).await;
    assert_eq!(retried.status().as_u16(), 201, "the key was not consumed");
    assert_eq!(app.footprint().await, Footprint::charged(4));
}

on_every_backend!(a_tenant_over_its_rate_gets_429_and_its_key_stays_free);
