//! A slow processor, over raw HTTP: a charge comes into existence only once its latency has
//! passed; until then its key is processing, and nothing about it is definitive.

use std::time::Instant;

use reqwest::StatusCode;

use crate::helpers::{LATENCY, REACH, charge_body, spawn_slow_sim};

#[tokio::test]
async fn a_charge_does_not_exist_until_its_latency_has_passed() {
    let sim = spawn_slow_sim().await;
    let visa = charge_body("tok_visa");
    let began = Instant::now();
    let probes = async {
        tokio::time::sleep(REACH).await;
        let lookup = sim.lookup("k").await;
        let cancel = sim.post_cancel(Some("k")).await;
        let second = sim.post_charge(Some("k"), &visa).await;
        let created = sim.charges_created().await;
        (lookup, cancel, second, created, began.elapsed())
    };
    // `join!` polls the first charge first, so it is the call that registers the key.
    let ((status, first), (lookup, cancel, second, created, probed_after)) =
        tokio::join!(sim.post_charge(Some("k"), &visa), probes);

    assert!(probed_after < LATENCY, "probes took {probed_after:?}");
    assert_eq!(lookup.0, StatusCode::NOT_FOUND, "{}", lookup.1);
    for (status, body) in [&cancel, &second] {
        assert_eq!(*status, StatusCode::CONFLICT, "{body}");
        assert_eq!(body["error"]["type"], "api_error", "{body}");
        assert_eq!(body["error"]["code"], "processing", "{body}");
    }
    assert_eq!(created, 0);

    assert_eq!(status, StatusCode::OK, "{first}");
    assert!(began.elapsed() >= LATENCY, "{:?}", began.elapsed());
    assert_eq!(first["status"], "succeeded");
    assert_eq!(sim.lookup("k").await, (StatusCode::OK, first.clone()));
    assert_eq!(
        sim.post_charge(Some("k"), &visa).await,
        (StatusCode::OK, first)
    );
    assert_eq!(sim.charges_created().await, 1);
}
