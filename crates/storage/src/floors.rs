//! The benchmark floors (`FloorRepository`): a pending record inserted on its own, as the
//! claim's insert does but with none of its conflict handling, and the finish's inserts without
//! a record, which each backend writes as its finish does (`insert_charge`), committed on their
//! own. Compiled only with the `bench` feature; the read floor is the claim's own lock-free read,
//! `find_record`.

use async_trait::async_trait;
use payments_domain::Charge;
use payments_idempotency::engine::Fence;
use payments_idempotency::{Attempt, Fingerprint, IdempotencyKey, Scope};
use payments_idempotency_sql::SqlRecords;
use uuid::Uuid;

use crate::database::DatabaseStore;
use crate::sql::{Each, Sql};
use crate::{StoreError, postgres, sqlite};

/// The floors of the benchmarks: the least work each path of the service can be made of, with
/// none of its protection. Not part of the service: compiled only with this crate's `bench`
/// feature, which the api's `bench` feature (its bench-only routes) turns on.
#[cfg(feature = "bench")]
#[async_trait]
pub trait FloorRepository: Send + Sync {
    /// Writes a charge, its ledger transaction and its event with no idempotency record at
    /// all: the floor of a first charge (the same writes as its finish, one commit).
    async fn write_charge_unguarded(&self, charge: &Charge) -> Result<(), StoreError>;

    /// Inserts a fresh pending record for `key` in one statement of its own, with
    /// `resource_id` as its generation and attempt 1, and returns its fence; no conflict
    /// handling, no decision. Followed by the finish's transaction over it
    /// ([`RecordRepository::begin_over`], [`ChargeRepository::insert_charge`],
    /// [`RecordRepository::end_record`]) it is the floor of a flow of two commits (the claim's
    /// insert, then the finish).
    async fn insert_pending_unguarded(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
        resource_id: uuid::Uuid,
    ) -> Result<payments_idempotency::engine::Fence, StoreError>;
}

/// A fresh pending record at attempt 1, locked for `$6` seconds and kept for `$9`.
const INSERT_PENDING: Each = Each {
    postgres: "
INSERT INTO idempotency_records
    (tenant_id, operation, idempotency_key, fingerprint, request_version, state, recovery_point,
     locked_until, attempts, resource_id, processor_key, created_at, expires_at, updated_at,
     request_body)
VALUES ($1, $2, $3, $4, $5, 'pending', 'started', now() + make_interval(secs => $6), 1, $7, $8,
        now(), now() + make_interval(secs => $9), now(), $10)",
    sqlite: "
INSERT INTO idempotency_records
    (tenant_id, operation, idempotency_key, fingerprint, request_version, state, recovery_point,
     locked_until, attempts, resource_id, processor_key, created_at, expires_at, updated_at,
     request_body)
VALUES ($1, $2, $3, $4, $5, 'pending', 'started',
        strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '+' || $6 || ' seconds'), 1, $7, $8,
        strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
        strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '+' || $9 || ' seconds'),
        strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), $10)",
};

#[async_trait]
impl FloorRepository for DatabaseStore {
    /// The finish's very inserts, committed on their own.
    async fn write_charge_unguarded(&self, charge: &Charge) -> Result<(), StoreError> {
        match self.record_store() {
            SqlRecords::Postgres(records) => {
                let mut connection = records.pool().acquire().await?;
                postgres::insert_charge(&mut connection, charge).await
            }
            SqlRecords::Sqlite(records) => {
                let mut write = records.begin_write().await?;
                sqlite::insert_charge(&mut write, charge).await?;
                Ok(write.commit().await?)
            }
        }
    }

    async fn insert_pending_unguarded(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
        generation: Uuid,
    ) -> Result<Fence, StoreError> {
        let policy = self.record_store().policy();
        let effect_key = format!("effect_{}", generation.simple());
        let insert = Sql::new(INSERT_PENDING)
            .bind(scope.tenant.as_str())
            .bind(scope.operation.as_str())
            .bind(key.as_str())
            .bind(fingerprint.as_bytes().as_slice())
            .bind(i64::from(fingerprint.request_version()))
            .bind(policy.lock_timeout.as_secs_f64())
            .bind(generation)
            .bind(effect_key.as_str())
            .bind(policy.ttl.as_secs_f64());
        self.write_one(insert.bind(request_body)).await?;
        Ok(Fence {
            attempt: Attempt(1),
            generation,
        })
    }
}
