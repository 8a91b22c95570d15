//! The benchmark floors on PostgreSQL (`crate::floors`): a charge's rows without a record.

use payments_domain::Charge;
use sqlx::QueryBuilder;

use super::PgStore;
use super::statements::push_charge_writes;
use crate::StoreError;
use crate::floors::impl_floor_repository;

impl PgStore {
    /// The finish's very inserts (`push_charge_writes`) behind a gate that always yields its
    /// row: one statement, one commit, no idempotency record at all.
    async fn write_charge_alone(&self, charge: &Charge) -> Result<(), StoreError> {
        let mut sql = QueryBuilder::new("WITH gate AS (SELECT 1), ");
        push_charge_writes(&mut sql, charge)?;
        sql.push(" SELECT count(*) FROM gate");
        sql.build_query_scalar::<i64>()
            .fetch_one(&self.pool)
            .await?;
        Ok(())
    }
}

impl_floor_repository!(PgStore, sqlx::Postgres);
