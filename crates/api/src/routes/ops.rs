//! The operator endpoints: `GET /ops/exceptions` and `GET /ops/exceptions/{id}`, the
//! reconciliation exceptions of every tenant. Only an operator key opens them; a tenant's key
//! is refused (403), as an operator key is on every tenant endpoint.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use payments_domain::ExceptionId;
use payments_storage::{ExceptionStatus, ListExceptions};

use super::ListParams;
use crate::extract::{ApiQuery, Operator};
use crate::views::{ExceptionView, List};
use crate::{ApiError, AppState};

/// The query of `GET /ops/exceptions`: a list's page size and cursor, and the status to list.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ExceptionParams {
    limit: Option<u32>,
    starting_after: Option<String>,
    status: Option<String>,
}

impl ExceptionParams {
    /// `open` unless named.
    fn status(&self) -> Result<ExceptionStatus, ApiError> {
        match self.status.as_deref() {
            None => Ok(ExceptionStatus::Open),
            Some(name) => ExceptionStatus::parse(name).ok_or_else(|| {
                ApiError::InvalidRequest("status: must be one of open, resolved".into())
            }),
        }
    }
}

pub(super) async fn list_exceptions(
    State(state): State<AppState>,
    Operator(operator): Operator,
    ApiQuery(params): ApiQuery<ExceptionParams>,
) -> Result<Json<List<ExceptionView>>, ApiError> {
    let status = params.status()?;
    // Every tenant's data: each operator read is logged under the key's name.
    tracing::info!(
        operator = operator.as_str(),
        status = status.as_str(),
        "ops: exceptions listed"
    );
    let list = ListParams {
        limit: params.limit,
        starting_after: params.starting_after,
    };
    let read = |limit, starting_after| {
        let page = ListExceptions {
            status,
            limit,
            starting_after,
        };
        state.store.list_exceptions(page)
    };
    let page = list.page("exception", read).await?;
    Ok(Json(List::of(&page.exceptions, page.has_more)))
}

pub(super) async fn show_exception(
    State(state): State<AppState>,
    Operator(operator): Operator,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<ExceptionView>, ApiError> {
    tracing::info!(operator = operator.as_str(), "ops: exception read");
    let Path(id) = id.map_err(|_| ApiError::NotFound("No such exception.".into()))?;
    let not_found = || ApiError::NotFound(format!("No such exception: {id}"));
    let parsed: ExceptionId = id.parse().map_err(|_| not_found())?;
    let exception = state
        .store
        .get_exception(parsed)
        .await?
        .ok_or_else(not_found)?;
    Ok(Json(ExceptionView::from(&exception)))
}
