//! Reading charges and ledger balances back, with the implementation both backends share
//! (`crate::reading`).

use super::PgStore;
use crate::reading::impl_charge_repository;

impl_charge_repository!(PgStore, sqlx::Postgres);
crate::refunding::impl_refund_repository!(PgStore, sqlx::Postgres, begin);
