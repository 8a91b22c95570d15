//! The operator endpoints: `POST /ops/reconciliations`, a day's reconciliation run now,
//! `GET /ops/exceptions` and `GET /ops/exceptions/{id}`, the reconciliation exceptions of every
//! tenant, and `POST /ops/exceptions/{id}/resolve`, which resolves one on the engine
//! (`operations/resolve.rs`). Only an operator key opens them; a tenant's key is refused (403),
//! as an operator key is on every tenant endpoint.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::response::Response;
use payments_domain::{ExceptionId, ResolutionRequest};
use payments_storage::{ExceptionStatus, ListExceptions, ReconciliationException};
use serde_json::Value;

use crate::auth::OperatorName;
use crate::extract::{ApiQuery, JsonBytes, Operator, OperatorCall};
use crate::handling::{ListParams, run_idempotent, tenants};
use crate::views::{ExceptionView, List, ResolveBody, json_body};
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

/// The body of `POST /ops/reconciliations`: the UTC day to reconcile.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RunBody {
    date: String,
}

/// Reconciles a day now, on this instance, as the daily worker and `payments-api reconcile`
/// do, and answers with the run. No `Idempotency-Key`: runs are idempotent by day, and what a
/// run settles goes through the engine.
pub(super) async fn run_reconciliation(
    State(state): State<AppState>,
    Operator(operator): Operator,
    JsonBytes(body): JsonBytes,
) -> Result<Json<Value>, ApiError> {
    let RunBody { date } = json_body(&body)?;
    let date = chrono::NaiveDate::parse_from_str(&date, "%Y-%m-%d").map_err(|_| {
        ApiError::InvalidRequest(format!("date: must be a day as YYYY-MM-DD, got {date}"))
    })?;
    tracing::info!(operator = operator.as_str(), reconcile.date = %date, "ops: reconciliation run");
    let run = state.reconciler().run(date).await?;
    Ok(Json(run.to_json()))
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
    let exception = exception(&state, id).await?;
    Ok(Json(ExceptionView::from(&exception)))
}

/// Everything that does not depend on the exception's status is checked before the claim:
/// the exception exists, the body is valid, and the action fits the exception's kind (which
/// never changes). A refusal stores nothing and leaves the key free.
pub(super) async fn resolve_exception(
    State(state): State<AppState>,
    call: OperatorCall,
    id: Result<Path<String>, PathRejection>,
    JsonBytes(body): JsonBytes,
) -> Result<Response, ApiError> {
    let operator = call.operator.clone();
    let validate = || validate_resolution(&state, &operator, id, &body);
    run_idempotent(&state, &state.operations.resolutions, call, &body, validate).await
}

/// The resolution `body` asks of the exception the path names, and the body as sent with the
/// exception named in it, if the action can resolve it.
async fn validate_resolution(
    state: &AppState,
    operator: &OperatorName,
    id: Result<Path<String>, PathRejection>,
    body: &[u8],
) -> Result<(ResolutionRequest, Value), ApiError> {
    let exception = exception(state, id).await?;
    let request = ResolveBody::parse(body, exception.id)?;
    let action = request.action;
    if !action.applies_to(exception.kind, exception.effect) {
        return Err(ApiError::ResolutionNotApplicable(format!(
            "action: {} cannot resolve a {} of a {}; only a charge the processor holds can be \
             recorded or voided, and anything can be accepted",
            action.as_str(),
            exception.kind.as_str(),
            exception.effect.as_str()
        )));
    }
    if action == payments_domain::ResolutionAction::Record && exception.tenant.is_none() {
        return Err(ApiError::ResolutionNotApplicable(
            "action: record needs the tenant the processor's metadata names, and this charge \
             names none; void or accept it"
                .into(),
        ));
    }
    tracing::info!(operator = operator.as_str(), exception.id = %exception.id,
        action = action.as_str(), "ops: exception resolution asked");
    // The stored request names the exception, so that the fingerprint covers it and the
    // completer can finish the resolution from the record alone.
    let mut canonical: Value = json_body(body)?;
    if let Value::Object(fields) = &mut canonical {
        fields.insert(
            ResolveBody::EXCEPTION.to_owned(),
            Value::String(exception.id.to_string()),
        );
    }
    Ok((request, canonical))
}

/// The exception the path names, or 404, as every path's resource is found.
async fn exception(
    state: &AppState,
    id: Result<Path<String>, PathRejection>,
) -> Result<ReconciliationException, ApiError> {
    let find = |id: ExceptionId| state.store.get_exception(id);
    tenants(id, "exception", find).await
}
