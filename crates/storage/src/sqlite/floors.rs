//! The benchmark floors on SQLite (`crate::floors`): a charge's rows without a record.

use payments_domain::Charge;

use super::SqliteStore;
use super::reads::insert_charge_writes;
use crate::StoreError;
use crate::floors::impl_floor_repository;

impl SqliteStore {
    /// The finish's inserts, in one write transaction of their own.
    async fn write_charge_alone(&self, charge: &Charge) -> Result<(), StoreError> {
        let mut write = self.begin_write().await?;
        insert_charge_writes(&mut write, charge).await?;
        write.commit().await?;
        Ok(())
    }
}

impl_floor_repository!(SqliteStore, sqlx::Sqlite);
