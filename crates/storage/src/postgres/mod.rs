//! The PostgreSQL repositories: the backend for deployments with several instances.
//!
//! Row locks (`FOR UPDATE`, `SKIP LOCKED`) serialise what must be serialised and let
//! instances share the work of the background workers; the finish is one statement.

mod charges;
mod claim;
mod finish;
#[cfg(feature = "bench")]
mod floors;
mod ledger;
mod outbox;
mod recovery;

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use payments_domain::{Charge, ChargeId, TenantId};
use payments_idempotency::{
    Fingerprint, IdempotencyKey, IdempotencyPolicy, IdempotencyRecord, Scope, StoredResponse,
};
use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};

use crate::model::{Abandoned, Backlog, Balance, ChargePage, Claim, Completion, Fence, Finish};
use crate::repository::{Backend, ChargeRepository, RecordRepository, Store, WorkerRepository};
use crate::stream::{EventSink, RelayError};
use crate::{PoolSettings, StoreError};

/// The migrations under `migrations/postgres`, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

/// The PostgreSQL store. Cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    policy: IdempotencyPolicy,
}

impl PgStore {
    /// Connects lazily: the service starts even while the database is down, answers 503 until
    /// it is back, and recovers without a restart.
    pub fn connect_lazy(
        options: PgConnectOptions,
        settings: &PoolSettings,
        policy: IdempotencyPolicy,
    ) -> Self {
        // No ping before each acquire: it would add a round trip to every statement on the hot
        // path. A connection that died is found by its next statement, which fails as
        // `Unavailable` (503, nothing executed) and is dropped from the pool.
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(settings.acquire_timeout)
            .test_before_acquire(false)
            .connect_lazy_with(options);
        Self { pool, policy }
    }

    /// Creates the database named in `url` if it does not exist yet.
    pub async fn create_database_if_missing(url: &str) -> Result<(), StoreError> {
        if !sqlx::Postgres::database_exists(url).await? {
            sqlx::Postgres::create_database(url).await?;
        }
        Ok(())
    }

    /// Begins a transaction on a task of its own.
    ///
    /// The driver's BEGIN is not cancel-safe: a caller dropped while BEGIN is in flight (its
    /// client hung up, or it timed out) returns the connection to the pool inside a
    /// transaction that nothing will end, and every later statement on that connection runs
    /// in it, uncommitted and holding its locks, until something ends it, possibly with a
    /// rollback. On its own task the BEGIN always completes, and a transaction whose caller is
    /// gone is dropped there, which rolls it back. Once the caller holds the transaction,
    /// dropping it is safe.
    async fn begin(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        let pool = self.pool.clone();
        tokio::spawn(async move { pool.begin().await })
            .await
            .map_err(|_| StoreError::from(sqlx::Error::WorkerCrashed))?
            .map_err(StoreError::from)
    }
}

/// Seconds as a PostgreSQL interval argument (`make_interval(secs => $n)` takes a double).
fn secs(duration: Duration) -> f64 {
    duration.as_secs_f64()
}

// The trait methods forward to the inherent ones beside the SQL they run, module by module.

#[async_trait]
impl RecordRepository for PgStore {
    async fn claim_exclusive(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        request_body: &[u8],
    ) -> Result<Claim, StoreError> {
        PgStore::claim_exclusive(self, scope, key, fingerprint, request_body).await
    }

    async fn find_record(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
    ) -> Result<Option<(IdempotencyRecord, DateTime<Utc>)>, StoreError> {
        PgStore::find_record(self, scope, key).await
    }

    async fn record_charged(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
        processor_charge_id: &str,
    ) -> Result<Finish, StoreError> {
        PgStore::record_charged(self, scope, key, fence, processor_charge_id).await
    }

    async fn mark_failed(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
    ) -> Result<Finish, StoreError> {
        PgStore::mark_failed(self, scope, key, fence).await
    }

    async fn release_lock(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
    ) -> Result<Finish, StoreError> {
        PgStore::release_lock(self, scope, key, fence).await
    }

    async fn finish_without_charge(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
        response: &StoredResponse,
    ) -> Result<Completion, StoreError> {
        PgStore::finish_without_charge(self, scope, key, fence, response).await
    }

    async fn finish_charge(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fence: Fence,
        charge: &Charge,
        response: &StoredResponse,
    ) -> Result<Completion, StoreError> {
        PgStore::finish_charge(self, scope, key, fence, charge, response).await
    }
}

#[async_trait]
impl ChargeRepository for PgStore {
    async fn get_charge(
        &self,
        tenant: &TenantId,
        id: ChargeId,
    ) -> Result<Option<Charge>, StoreError> {
        PgStore::get_charge(self, tenant, id).await
    }

    async fn charges_after(
        &self,
        tenant: &TenantId,
        cursor: Option<&Charge>,
        limit: u32,
    ) -> Result<ChargePage, StoreError> {
        PgStore::charges_after(self, tenant, cursor, limit).await
    }

    async fn balances(&self, tenant: &TenantId) -> Result<Vec<Balance>, StoreError> {
        PgStore::balances(self, tenant).await
    }
}

#[async_trait]
impl WorkerRepository for PgStore {
    async fn take_over_abandoned(
        &self,
        settle_after: Duration,
    ) -> Result<Option<Abandoned>, StoreError> {
        PgStore::take_over_abandoned(self, settle_after).await
    }

    async fn reap_expired(&self, batch: i64) -> Result<u64, StoreError> {
        PgStore::reap_expired(self, batch).await
    }

    async fn relay_outbox(&self, batch: i64, sink: &dyn EventSink) -> Result<usize, RelayError> {
        PgStore::relay_outbox(self, batch, sink).await
    }

    async fn outbox_backlog(&self) -> Result<Backlog, StoreError> {
        PgStore::outbox_backlog(self).await
    }

    async fn prune_published_events(
        &self,
        retention: Duration,
        batch: i64,
    ) -> Result<u64, StoreError> {
        PgStore::prune_published_events(self, retention, batch).await
    }
}

#[async_trait]
impl Store for PgStore {
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    #[cfg(feature = "bench")]
    fn floors(&self) -> &dyn crate::FloorRepository {
        self
    }

    fn policy(&self) -> IdempotencyPolicy {
        self.policy
    }

    /// sqlx takes an advisory lock around the migrations, so instances may start together.
    async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR
            .run(&self.pool)
            .await
            .map_err(|e| StoreError::Migration(e.to_string()))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}
