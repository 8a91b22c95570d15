//! The build people deploy has no failpoints: the crash, pause and fail variables do nothing in it.
//! `scripts/test.sh` runs this module against a build without the `failpoints` feature.

use crate::helpers::{Backend, Footprint, Service, TestDatabase, new_key, visa};

async fn a_build_without_failpoints_ignores_the_crash_pause_and_fail_variables(backend: Backend) {
    let db = TestDatabase::create(backend).await;
    let service = Service::start(
        &db.url,
        &[
            ("PAYMENTS_CRASH_AT", "after_claim"),
            ("PAYMENTS_PAUSE_AT", "after_charge:60000"),
            ("PAYMENTS_FAIL_AT", "finish"),
        ],
    )
    .await;
    let response = service.post_charge(&new_key(), &visa(100)).await;
    assert_eq!(
        response.status().as_u16(),
        201,
        "no crash, no pause, no failed finish"
    );
    assert_eq!(Footprint::of(&db.pool).await, Footprint::charged(1));
}

on_every_backend!(a_build_without_failpoints_ignores_the_crash_pause_and_fail_variables);
