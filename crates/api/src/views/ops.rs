//! The operator endpoints' shapes: a reconciliation exception with its resolution, and the
//! body of `POST /ops/exceptions/{id}/resolve`.

use chrono::Utc;
use payments_domain::{
    DescriptionError, ExceptionId, NoteError, ResolutionAction, ResolutionNote, ResolutionRequest,
};
use payments_storage::{ReconciliationException, Resolution};
use serde::{Deserialize, Serialize};

use super::{card_number, invalid_field, json_body, split_stored, timestamp};
use crate::ApiError;

/// A reconciliation exception as the operator endpoints show it: what kind of difference, how
/// old, whose, and what each side held when the run found it.
#[derive(Debug, Serialize)]
pub(crate) struct ExceptionView {
    pub id: String,
    pub object: &'static str,
    pub kind: &'static str,
    pub status: &'static str,
    pub report_date: String,
    pub created_at: String,
    /// Seconds since the run found it.
    pub age_secs: i64,
    #[serde(rename = "type")]
    pub effect: &'static str,
    pub processor_id: String,
    pub tenant: Option<String>,
    pub processor: Option<ExceptionProcessorView>,
    pub books: Option<ExceptionBooksView>,
    pub record: Option<ExceptionRecordView>,
    /// How an operator resolved it; `null` while it is open.
    pub resolution: Option<ResolutionView>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ExceptionProcessorView {
    pub processor_key: String,
    pub amount: i64,
    pub currency: &'static str,
}

#[derive(Debug, Serialize)]
pub(crate) struct ExceptionBooksView {
    pub resource_id: String,
    pub amount: i64,
    pub currency: &'static str,
}

#[derive(Debug, Serialize)]
pub(crate) struct ExceptionRecordView {
    pub operation: String,
    pub idempotency_key: String,
}

impl From<&ReconciliationException> for ExceptionView {
    fn from(exception: &ReconciliationException) -> Self {
        Self {
            id: exception.id.to_string(),
            object: "reconciliation_exception",
            kind: exception.kind.as_str(),
            status: exception.status.as_str(),
            report_date: exception.report_date.to_string(),
            created_at: timestamp(exception.created_at),
            age_secs: (Utc::now() - exception.created_at).num_seconds().max(0),
            effect: exception.effect.as_str(),
            processor_id: exception.processor_id.clone(),
            tenant: exception.tenant.as_ref().map(|t| t.as_str().to_owned()),
            processor: exception
                .processor
                .as_ref()
                .map(|side| ExceptionProcessorView {
                    processor_key: side.processor_key.clone(),
                    amount: side.money.amount.minor_units(),
                    currency: side.money.currency.code(),
                }),
            books: exception.books.as_ref().map(|side| ExceptionBooksView {
                resource_id: side.resource_id.clone(),
                amount: side.money.amount.minor_units(),
                currency: side.money.currency.code(),
            }),
            record: exception.record.as_ref().map(|record| ExceptionRecordView {
                operation: record.operation.clone(),
                idempotency_key: record.key.clone(),
            }),
            resolution: exception.resolution.as_ref().map(ResolutionView::from),
        }
    }
}

/// An exception's resolution: what was done, by whom, when and why.
#[derive(Debug, Serialize)]
pub(crate) struct ResolutionView {
    pub action: &'static str,
    pub operator: String,
    pub note: String,
    pub resolved_at: String,
    /// `record`: the charge it posted.
    pub recorded_id: Option<String>,
    /// `void`: the processor's id of the refund that gave the money back.
    pub void_processor_id: Option<String>,
}

impl From<&Resolution> for ResolutionView {
    fn from(resolution: &Resolution) -> Self {
        Self {
            action: resolution.action.as_str(),
            operator: resolution.operator.clone(),
            note: resolution.note.clone(),
            resolved_at: timestamp(resolution.resolved_at),
            recorded_id: resolution.recorded_id.clone(),
            void_processor_id: resolution.void_processor_id.clone(),
        }
    }
}

/// The body of `POST /ops/exceptions/{id}/resolve`. Unknown fields are rejected.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResolveBody {
    pub action: String,
    pub note: String,
}

impl ResolveBody {
    /// The field naming the exception in the stored request.
    pub(crate) const EXCEPTION: &'static str = "exception";

    /// The validated resolution of `exception` in a request body.
    pub(crate) fn parse(
        body: &[u8],
        exception: ExceptionId,
    ) -> Result<ResolutionRequest, ApiError> {
        let typed: Self = json_body(body)?;
        typed.into_request(exception)
    }

    /// The request stored with a record, for the completer: the body with the exception of
    /// the path as its [`EXCEPTION`](Self::EXCEPTION) field.
    pub(crate) fn parse_stored(body: &[u8]) -> Result<ResolutionRequest, ApiError> {
        let (exception, typed): (ExceptionId, Self) = split_stored(body, Self::EXCEPTION)?;
        typed.into_request(exception)
    }

    /// `request` as the body every version of `exceptions.resolve` shares, the exception of the
    /// path included; [`parse_stored`](Self::parse_stored) reads it back.
    pub(crate) fn canonical(request: &ResolutionRequest) -> serde_json::Value {
        serde_json::json!({
            Self::EXCEPTION: request.exception.to_string(),
            "action": request.action.as_str(),
            "note": request.note.as_str(),
        })
    }

    fn into_request(self, exception: ExceptionId) -> Result<ResolutionRequest, ApiError> {
        let action = ResolutionAction::parse(&self.action).ok_or_else(|| {
            let names: Vec<_> = ResolutionAction::ALL.iter().map(|a| a.as_str()).collect();
            invalid_field("action", &format!("must be one of {}", names.join(", ")))
        })?;
        let note = ResolutionNote::new(self.note).map_err(|e| match e {
            NoteError::Text(DescriptionError::CardNumber) => card_number("note", &e),
            NoteError::Empty | NoteError::Text(DescriptionError::Malformed) => {
                invalid_field("note", &e)
            }
        })?;
        Ok(ResolutionRequest {
            exception,
            action,
            note,
        })
    }
}
