//! `idempotency.recent_answers_bytes` is memory: filled to its capacity with the answers of
//! charges, the recent answers grow the process's heap by about that capacity, and the bytes
//! they count (the `recent_answers_bytes` gauge) are about what they take.
//!
//! A test binary of its own, with the service's allocator, so that nothing else allocates
//! while the heap is measured. The workspace forbids unsafe code, and with it a counting
//! allocator: the heap is measured as the kernel sees it, the process's anonymous resident
//! memory (less what was freed lazily), before and after.
#![cfg(target_os = "linux")]

use chrono::{Duration, Utc};
use payments_idempotency::engine::{CachedReplay, RecentAnswers};
use payments_idempotency::{
    Fingerprint, IdempotencyKey, SchemaVersion, Scope, StoredResponse, Verbatim,
};
use serde_json::json;
use uuid::Uuid;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The setting's default (`crates/api/src/defaults.toml`).
const CAPACITY: usize = 32 * 1024 * 1024;

/// The process's anonymous resident memory, in bytes, less what it freed lazily (resident
/// until the kernel needs it back).
fn anonymous_resident() -> usize {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").expect("smaps_rollup");
    let kib = |field: &str| -> usize {
        rollup
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{field} in smaps_rollup"))
    };
    (kib("Anonymous:") - kib("LazyFree:")) * 1024
}

/// A charge's 201, as the service stores it (`operations::created`) and remembers it
/// (`Engine::remember` holds a copy), with the request that made it.
fn charge_answer(tenant: &str) -> (Scope, IdempotencyKey, CachedReplay, Verbatim) {
    let id = format!("ch_{}", Uuid::new_v4());
    let view = json!({
        "id": id,
        "object": "charge",
        "amount": 2500,
        "currency": "USD",
        "source": "tok_visa",
        "description": "Order 1042",
        "status": "succeeded",
        "processor_charge_id": format!("sim_{}", Uuid::new_v4().simple()),
        "amount_refunded": 0,
        "created_at": Utc::now().format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
    });
    let request = json!({ "amount": 2500, "currency": "usd", "source": "tok_visa" });
    let body = serde_json::to_vec(&view).expect("serialise");
    let location = format!("/charges/{id}");
    let headers = [
        ("content-type", "application/json"),
        ("location", location.as_str()),
    ];
    let response = StoredResponse::new(SchemaVersion::new(1), 201, headers, body);
    let scope = Scope {
        tenant: tenant.to_owned(),
        operation: "charges.create".to_owned(),
    };
    let key = IdempotencyKey::parse(&Uuid::new_v4().to_string()).expect("key");
    let replay = CachedReplay {
        generation: Uuid::new_v4(),
        fingerprint: Fingerprint::of_json_request("POST", "/charges", &request).to_stored(),
        response: response.clone(),
        expires_at: Utc::now() + Duration::hours(24),
    };
    let verbatim = Verbatim::of(&[b"/charges", request.to_string().as_bytes()]);
    (scope, key, replay, verbatim)
}

#[test]
fn answers_filling_the_capacity_take_about_the_capacity_from_the_heap() {
    const TENANTS: [&str; 4] = ["acme", "globex", "initech", "umbrella"];
    // Whatever the first answer and the first measurement bring in once.
    let _ = charge_answer("acme");
    let _ = anonymous_resident();

    let before = anonymous_resident();
    let recent = RecentAnswers::new(CAPACITY);
    // Until the capacity is reached, and as many answers again as that took, so that the
    // tables have grown as far as they will and old answers have made room for new ones.
    let mut puts = 0;
    let mut full_at = None;
    while full_at.is_none_or(|full_at| puts < 2 * full_at) {
        assert!(puts < 1_000_000, "the capacity is never reached");
        let (scope, key, replay, verbatim) = charge_answer(TENANTS[puts % TENANTS.len()]);
        let generation = replay.generation;
        let held = recent.put(&scope, &key, replay);
        recent.vouch(&scope, &key, generation, verbatim);
        puts += 1;
        if full_at.is_none() && held.entries < puts {
            full_at = Some(puts);
        }
    }
    let grown = anonymous_resident().saturating_sub(before);
    let held = recent.held_now();

    let (grown_mib, counted_mib) = (grown as f64 / 1048576.0, held.bytes as f64 / 1048576.0);
    let ratio = grown as f64 / CAPACITY as f64;
    println!(
        "{} answers held of {puts} put: {counted_mib:.1} MiB counted, the heap grew by \
         {grown_mib:.1} MiB, {ratio:.2} x the capacity",
        held.entries
    );
    assert!(held.bytes <= CAPACITY, "{} bytes counted", held.bytes);
    assert!(
        (0.75..=1.25).contains(&ratio),
        "the heap grew by {ratio:.2} x the capacity"
    );
    assert!(
        held.bytes as f64 >= 0.75 * grown as f64,
        "{counted_mib:.1} MiB counted of {grown_mib:.1} MiB taken"
    );
}
