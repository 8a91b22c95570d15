//! `GET /ledger/balances`.

use axum::Json;
use axum::extract::State;

use crate::extract::Tenant;
use crate::views::{BalanceView, BalancesView};
use crate::{ApiError, AppState};

/// The calling tenant's balances; per currency they sum to zero.
pub(super) async fn balances(
    State(state): State<AppState>,
    Tenant(tenant): Tenant,
) -> Result<Json<BalancesView>, ApiError> {
    let balances = state.store.balances(&tenant).await?;
    Ok(Json(BalancesView {
        balances: balances.iter().map(BalanceView::from).collect(),
    }))
}
