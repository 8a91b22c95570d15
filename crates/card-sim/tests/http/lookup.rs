//! `find_charge` through `HttpCardProcessor`: it finds, and it never creates.

use payments_domain::CardProcessor;

use crate::helpers::{PATIENT, request, spawn_sim, usd};

#[tokio::test]
async fn find_charge_returns_the_charge_made_under_the_key_and_never_creates() {
    let sim = spawn_sim().await;
    let processor = sim.processor(PATIENT);
    let charge = processor
        .charge(request("order-1", "tok_visa"))
        .await
        .expect("charge");
    assert_eq!(sim.charges_created().await, 1);

    let found = processor.find_charge("order-1").await;
    let unknown = processor.find_charge("order-unknown").await;

    assert_eq!(found, Ok(Some(charge)));
    assert_eq!(found.ok().flatten().map(|c| c.money), Some(usd(1999)));
    assert_eq!(unknown, Ok(None));
    assert_eq!(sim.charges_created().await, 1);
}

#[tokio::test]
async fn a_declined_key_has_no_charge_to_find() {
    let sim = spawn_sim().await;
    let processor = sim.processor(PATIENT);
    let declined = processor.charge(request("k", "tok_chargeDeclined")).await;
    assert!(declined.is_err());

    assert_eq!(processor.find_charge("k").await, Ok(None));
    assert_eq!(sim.charges_created().await, 0);
}

#[tokio::test]
async fn keys_with_reserved_characters_are_sent_intact() {
    let sim = spawn_sim().await;
    let processor = sim.processor(PATIENT);
    let key = "tenant/acme?order=1&retry#2";
    let charge = processor
        .charge(request(key, "tok_visa"))
        .await
        .expect("charge");

    assert_eq!(processor.find_charge(key).await, Ok(Some(charge)));
    assert_eq!(processor.find_charge("tenant/acme").await, Ok(None));
    assert_eq!(sim.charges_created().await, 1);
}
