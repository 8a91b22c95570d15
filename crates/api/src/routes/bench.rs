//! Bench-only endpoints (cargo feature `bench`): the floors the hot paths are measured
//! against. They skip authentication and idempotency on purpose and never exist in a
//! deployment build.

use std::sync::Mutex;
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use chrono::Utc;
use payments_domain::{Charge, ChargeId, TenantId};
use payments_idempotency::engine::{self, Begin, Completion, End, Owner, RecordStore};
use payments_idempotency::{Fingerprint, IdempotencyKey, Scope};
use payments_idempotency_sql::in_batches;
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::extract::{ApiQuery, JsonBytes};
use crate::operations::charge::CreateChargeBody;
use crate::operations::charge::{CreateCharge, created_response};
use crate::{ApiError, AppState};

/// The tenant every floor writes and reads as (the bench scripts' API key is acme's).
const TENANT: &str = "acme";

/// One Redis GET: the floor of a cached replay.
pub(super) async fn redis(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let cache = state
        .cache
        .as_ref()
        .ok_or_else(|| ApiError::NotFound("Redis is disabled.".into()))?;
    cache
        .probe()
        .await
        .map_err(|e| ApiError::Internal(e.into()))?;
    Ok(Json(json!({ "ok": true })))
}

#[derive(Debug, Deserialize)]
pub(super) struct ReadParams {
    key: String,
}

/// One primary-key SELECT of a whole record, through the service's pool (`find_record`, the
/// claim's own lock-free read), answered with the
/// record's stored response body: the floor of a replay from the database.
pub(super) async fn read(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<ReadParams>,
) -> Result<impl IntoResponse, ApiError> {
    let key =
        IdempotencyKey::parse(&params.key).map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    let (record, _) = state
        .store
        .records()
        .find_record(&scope(), &key)
        .await?
        .ok_or_else(|| ApiError::NotFound("No record with this key.".into()))?;
    let body = record.response.map(|r| r.body).unwrap_or_default();
    Ok(([(header::CONTENT_TYPE, "application/json")], body))
}

/// The charge, ledger and outbox writes in one statement, without idempotency: the floor of
/// a first charge.
pub(super) async fn charge(
    State(state): State<AppState>,
    JsonBytes(body): JsonBytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let charge = new_charge(&body)?;
    state.store.floors().write_charge_unguarded(&charge).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "id": charge.id.to_string() })),
    ))
}

/// The same writes split into the two commits a first charge cannot do without: a pending
/// record inserted in a statement of its own (the claim's insert), then the service's own
/// finishing statement (the completion of that record as the gate of the floor's inserts).
/// No processor, no `charged` recovery point, no decision, no cache: an honest ceiling for a
/// flow of two commits.
pub(super) async fn charge_in_two_commits(
    State(state): State<AppState>,
    JsonBytes(body): JsonBytes,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let charge = new_charge(&body)?;
    let scope = scope();
    let key = IdempotencyKey::parse(&format!("bench-{}", charge.id.as_uuid().simple()))
        .map_err(|e| ApiError::Internal(e.into()))?;
    // The fingerprint's 32 bytes, without the canonical JSON the service hashes.
    let fingerprint =
        Fingerprint::stored(1, &Sha256::digest(&body)).map_err(|e| ApiError::Internal(e.into()))?;
    let fence = state
        .store
        .floors()
        .insert_pending_unguarded(&scope, &key, &fingerprint, &body, charge.id.as_uuid())
        .await?;
    let response = created_response(&charge)?;
    // The finish's transaction, as the engine writes it.
    let owner = Owner::new(&scope, &key, fence);
    let taken = || ApiError::Internal("the record inserted a statement ago is not its own".into());
    let records = state.store.records();
    let mut transaction = records
        .begin(owner, Begin::ENDING)
        .await?
        .ok_or_else(taken)?;
    state.store.insert_charge(&mut transaction, &charge).await?;
    let end = End::Made(&response);
    match records.end(&mut transaction, owner, end).await? {
        Completion::Stored { .. } => records.commit(transaction).await?,
        Completion::Fenced => return Err(taken()),
    }
    Ok((
        StatusCode::CREATED,
        Json(json!({ "id": charge.id.to_string() })),
    ))
}

/// The default of `workers.reaper_batch_size` (`defaults.toml`).
const DEFAULT_REAP_BATCH: i64 = 500;

#[derive(Debug, Deserialize)]
pub(super) struct ReapParams {
    /// Rows per statement; when absent, the default of `workers.reaper_batch_size`.
    batch: Option<i64>,
}

/// Runs the reaper's batches (the worker's own loop, its pauses included) until nothing
/// expired is left, timing every statement: the longest, and the median and 99th percentile,
/// which a single stall of the machine does not move.
pub(super) async fn reap(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<ReapParams>,
) -> Result<Json<Value>, ApiError> {
    let batch = params.batch.unwrap_or(DEFAULT_REAP_BATCH);
    if batch < 1 {
        return Err(ApiError::InvalidRequest("batch must be at least 1".into()));
    }
    // Never signalled: the reap runs to the end (the sender lives as long as the reap).
    let (_running, mut shutdown) = watch::channel(false);
    let times = Mutex::new(Vec::new());
    let (records, times_ref) = (&state.store.records(), &times);
    let started = Instant::now();
    let reaped = in_batches(batch, &mut shutdown, || async move {
        let statement = Instant::now();
        let deleted = records
            .reap_expired(batch)
            .await
            .map_err(payments_storage::StoreError::from);
        if let Ok(mut times) = times_ref.lock() {
            times.push(statement.elapsed().as_secs_f64() * 1e3);
        }
        deleted
    })
    .await;
    if let Some(error) = reaped.error {
        return Err(error.into());
    }
    let mut times = times.into_inner().unwrap_or_default();
    times.sort_by(f64::total_cmp);
    let percentile = |p: f64| {
        let rank = ((p * times.len() as f64).ceil() as usize).clamp(1, times.len().max(1));
        times.get(rank - 1).copied().unwrap_or_default()
    };
    Ok(Json(json!({
        "deleted": reaped.deleted,
        "elapsed_ms": started.elapsed().as_secs_f64() * 1e3,
        "statements": reaped.statements,
        "batch": batch,
        "longest_statement_ms": reaped.longest.as_secs_f64() * 1e3,
        "p50_statement_ms": percentile(0.50),
        "p99_statement_ms": percentile(0.99),
    })))
}

fn scope() -> Scope {
    engine::scope_of::<CreateCharge>(TENANT)
}

/// The charge a valid request body makes, as the charge flow would make it (minus the
/// processor, whose charge id is made up here).
fn new_charge(body: &[u8]) -> Result<Charge, ApiError> {
    let request = CreateChargeBody::parse(body)?;
    let id = ChargeId::generate();
    Ok(Charge {
        id,
        tenant: TenantId::new(TENANT),
        money: request.money,
        source: request.source,
        description: request.description,
        processor_charge_id: format!("bench_{}", id.as_uuid().simple()),
        created_at: Utc::now(),
        amount_refunded: 0,
        capture: payments_domain::Capture::Automatic,
    })
}
