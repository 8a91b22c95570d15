//! The steps of a claim under the lock (`RecordRepository::claim_exclusive` in
//! `records.rs`), running the statements both backends share (`crate::claiming`).

use payments_idempotency::{Fingerprint, IdempotencyKey, Scope};
use sqlx::{PgConnection, Postgres};

use super::PgStore;
use crate::StoreError;
use crate::claiming;
use crate::model::{Claimed, Generation, TakenOver};
use crate::rows::RecordWithClock;

impl PgStore {
    /// Inserts a fresh pending record, unless the key exists: `None` then.
    pub(super) async fn insert_pending(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
    ) -> Result<Option<Claimed>, StoreError> {
        let new = Generation::new();
        let mut sql = claiming::insert_pending::<Postgres>(
            scope,
            key,
            fingerprint,
            request_body,
            &new,
            self.policy,
        );
        let inserted: Option<i32> = sql.build_query_scalar().fetch_optional(&self.pool).await?;
        Ok(inserted.map(|attempts| Claimed::fresh(attempts, new)))
    }

    /// Takes a stale or failed record over (see [`claiming::take_over`]).
    pub(super) async fn take_over(
        &self,
        conn: &mut PgConnection,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<TakenOver, StoreError> {
        let mut sql = claiming::take_over::<Postgres>(scope, key, self.policy.lock_timeout);
        Ok(sql.build_query_as().fetch_one(conn).await?)
    }

    /// Starts a new generation in an expired or failed record's row (see
    /// [`claiming::replace`]).
    pub(super) async fn replace_expired(
        &self,
        conn: &mut PgConnection,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
    ) -> Result<Claimed, StoreError> {
        let new = Generation::new();
        let mut sql =
            claiming::replace::<Postgres>(scope, key, fingerprint, request_body, &new, self.policy);
        let attempts: i32 = sql.build_query_scalar().fetch_one(conn).await?;
        Ok(Claimed::replacing(attempts, new))
    }
}

/// Reads the record under a row lock (`FOR UPDATE`): concurrent claims of one existing key
/// queue here, so exactly one of them can take a stale record over.
pub(super) async fn lock_record(
    conn: &mut PgConnection,
    scope: &Scope,
    key: &IdempotencyKey,
) -> Result<Option<RecordWithClock>, StoreError> {
    let mut sql = claiming::read_record::<Postgres>(scope, key, true);
    Ok(sql.build_query_as().fetch_optional(conn).await?)
}
