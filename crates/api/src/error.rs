//! Every error the API can answer with, mapped to HTTP in this one place.
//!
//! Each variant has one status and one stable snake_case `code`; the body is an RFC 9457
//! `application/problem+json` document. 5xx bodies are generic, and their detail is logged once
//! here, never sent to the client.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use payments_idempotency::StoredResponse;
use payments_storage::StoreError;

use crate::error_chain;
use crate::reconcile::ReconcileError;
use payments_idempotency::engine::{ProtocolError, StoreFailure};

pub(crate) use payments_idempotency_axum::{PROBLEM_JSON, Problem};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400 `idempotency_key_missing`: `POST /charges` needs an `Idempotency-Key`.
    #[error("The Idempotency-Key header is required for this request.")]
    IdempotencyKeyMissing,
    /// 400 `idempotency_key_invalid`: empty, too long, not visible ASCII, or sent twice.
    #[error("{0}")]
    IdempotencyKeyInvalid(String),
    /// 422 `idempotency_key_reused`: the key was first used with a different request.
    #[error(
        "This Idempotency-Key was already used with a different request. Use a new key for a new request."
    )]
    IdempotencyKeyReused,
    /// 409 `idempotency_key_incomparable`: the key was first used with a request of another
    /// request version of the operation (a field changed meaning), which cannot be compared.
    #[error(
        "This Idempotency-Key was used with a request of another version of this operation, \
         whose fields meant something else, so the two cannot be compared and nothing was \
         executed. See GET /idempotency-keys/{{key}} for what the key holds; use a new key for \
         a new request."
    )]
    IdempotencyKeyIncomparable,
    /// 409 `idempotency_key_in_use`: a request with this key is still being processed.
    #[error(
        "A request with this Idempotency-Key is still being processed. Retry after the indicated \
         delay, or send `Prefer: wait=N` to wait up to N seconds for its answer instead."
    )]
    IdempotencyKeyInUse { retry_after_secs: u64 },
    /// 400 `invalid_request`: the body or query is not a valid request.
    #[error("{0}")]
    InvalidRequest(String),
    /// 400 `card_number_not_allowed`: a field holds a card number. Refused before the claim,
    /// so the number is stored nowhere; the detail names the field, never the number.
    #[error("{field}: {reason}")]
    CardNumberNotAllowed { field: &'static str, reason: String },
    /// 400 `invalid_authorization`: more than one `Authorization` header; which one to honour
    /// would be a guess, and a proxy and this service might guess differently.
    #[error("Send exactly one Authorization header.")]
    AuthorizationRepeated,
    /// 403 `forbidden`: a valid key of the wrong kind: an operator key on a tenant's endpoint,
    /// or a tenant's key on an operator endpoint.
    #[error("{0}")]
    Forbidden(&'static str),
    /// 401 `unauthorized`: no API key, another scheme, or an unknown key.
    #[error("A valid API key is required: send `Authorization: Bearer <api key>`.")]
    Unauthorized,
    /// 402 `card_declined`: a definitive decline, stored and replayed like a success.
    #[error("{0}")]
    CardDeclined(Decline),
    /// 402 `refund_declined`: the processor refused the refund for good; stored and replayed.
    #[error("{0}")]
    RefundDeclined(Decline),
    /// 400 `refund_amount_too_large`: more than is left to refund; stored and replayed, since
    /// it depends on the charge's state.
    #[error(
        "The refund amount is larger than what is left to refund on this charge ({refundable})."
    )]
    RefundAmountTooLarge { refundable: i64 },
    /// 400 `charge_already_refunded`: nothing is left to refund; stored and replayed.
    #[error("This charge has already been refunded in full.")]
    ChargeAlreadyRefunded,
    /// 402 `payout_declined`: the processor refused the payout for good (a closed account);
    /// stored and replayed.
    #[error("{0}")]
    PayoutDeclined(Decline),
    /// 400 `insufficient_balance`: a payout, or a refund, for more than the tenant's balance
    /// has available in its currency (payouts in flight hold their amounts); stored and
    /// replayed, since it depends on the balance's state.
    #[error("The balance available in this currency ({available}) does not cover this amount.")]
    InsufficientBalance { available: i64 },
    /// 402 `charge_voided`: the processor charged other money than the request asked, and an
    /// operator voided what it charged (`POST /ops/exceptions/{id}/resolve`); nothing is charged.
    /// The final answer of that charge's key, stored and replayed.
    #[error(
        "The processor charged another amount than requested; an operator voided that charge, \
         and nothing is charged. Send a new request under a new Idempotency-Key to charge again."
    )]
    ChargeVoided,
    /// 400 `resolution_not_applicable`: the action cannot resolve an exception of this kind
    /// (only a charge the processor holds can be recorded or voided). Refused before the
    /// claim: the key stays free.
    #[error("{0}")]
    ResolutionNotApplicable(String),
    /// 400 `exception_already_resolved`: the exception was resolved already, under another
    /// key; nothing changed. Stored and replayed.
    #[error("This exception has already been resolved; nothing was changed.")]
    ExceptionAlreadyResolved,
    /// 409 `exception_being_resolved`: another resolution, under another key, is at work on the
    /// exception; nothing changed. Stored and replayed: read the exception to see how it ends.
    #[error(
        "Another resolution of this exception is in progress under another Idempotency-Key; \
         nothing was changed. Read the exception to see how it ends."
    )]
    ExceptionBeingResolved,
    /// 400 `resolution_declined`: the processor did not confirm what a `record` would post,
    /// or refused a `void` for good; nothing was changed. Stored and replayed.
    #[error("{0}")]
    ResolutionDeclined(Decline),
    /// 503 `processor_unavailable`: nothing was stored; retry with the same key.
    #[error("The card processor is unavailable. Retry the request with the same Idempotency-Key.")]
    ProcessorUnavailable,
    /// 413 `payload_too_large`.
    #[error("The request body is larger than the limit of {limit} bytes.")]
    PayloadTooLarge { limit: usize },
    /// 415 `unsupported_media_type`: the body must be `application/json`.
    #[error("The request body must be sent with `Content-Type: application/json`.")]
    UnsupportedMediaType,
    /// 404 `not_found`.
    #[error("{0}")]
    NotFound(String),
    /// 405 `method_not_allowed`.
    #[error("This method is not allowed on this resource.")]
    MethodNotAllowed,
    /// 408 `request_timeout`: the client took too long to send its body. Nothing was claimed.
    #[error("The request body was not received in time.")]
    RequestTimeout,
    /// 431 `headers_too_large`: the request headers exceed `server.header_limit_bytes`.
    #[error("The request headers are larger than the limit of {limit} bytes.")]
    HeadersTooLarge { limit: usize },
    /// 503 `timeout`: the request took longer than `server.request_timeout_ms`. A charge cut
    /// off here is settled by a retry with the same key or by the completer.
    #[error("The request took too long. Retry it with the same Idempotency-Key.")]
    Timeout,
    /// 429 `tenant_in_flight_limit`: the tenant already has its share of this instance's
    /// requests in flight (`server.max_in_flight_per_tenant`); nothing was done, the key is
    /// not consumed.
    #[error(
        "Too many of your requests are in flight at once. Retry the request with the same \
         Idempotency-Key."
    )]
    TenantInFlightLimit,
    /// 429 `rate_limited`: the tenant sent more requests than its rate
    /// (`auth.rate_limit_per_sec`, with `auth.rate_limit_burst`) allows; nothing was done, the
    /// key is not consumed.
    #[error(
        "Too many requests: you are over your rate limit. Retry the request with the same \
         Idempotency-Key after Retry-After seconds."
    )]
    RateLimited { retry_after_secs: u64 },
    /// 503 `overloaded`: this instance is at its limit of requests in flight; nothing was done.
    #[error("The service is at capacity. Retry the request with the same Idempotency-Key.")]
    Overloaded,
    /// 503 `store_unavailable`: the database cannot be reached, so nothing is executed (fail
    /// closed: no charge without a record).
    #[error(
        "The service cannot reach its database. Retry the request with the same Idempotency-Key."
    )]
    StoreUnavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// 503 `store_busy`: the database answered, but a row this request needs stayed held by
    /// another transaction for longer than `database.lock_timeout_ms` (another request of the
    /// same tenant, or an instance that stopped mid-transaction); nothing of this step was
    /// written, and whatever the request did before it is resumed by a retry.
    #[error(
        "A record this request needs is held by another transaction. Retry the request with the \
         same Idempotency-Key."
    )]
    StoreBusy(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// 500 `internal`.
    #[error("An internal error occurred.")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::IdempotencyKeyMissing
            | Self::IdempotencyKeyInvalid(_)
            | Self::InvalidRequest(_)
            | Self::CardNumberNotAllowed { .. }
            | Self::AuthorizationRepeated
            | Self::RefundAmountTooLarge { .. }
            | Self::ChargeAlreadyRefunded
            | Self::InsufficientBalance { .. }
            | Self::ResolutionNotApplicable(_)
            | Self::ExceptionAlreadyResolved
            | Self::ResolutionDeclined(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::CardDeclined(_)
            | Self::RefundDeclined(_)
            | Self::PayoutDeclined(_)
            | Self::ChargeVoided => StatusCode::PAYMENT_REQUIRED,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::HeadersTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::IdempotencyKeyInUse { .. }
            | Self::IdempotencyKeyIncomparable
            | Self::ExceptionBeingResolved => StatusCode::CONFLICT,
            Self::TenantInFlightLimit | Self::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::ProcessorUnavailable
            | Self::StoreUnavailable(_)
            | Self::StoreBusy(_)
            | Self::Overloaded
            | Self::Timeout => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The stable machine-readable code clients switch on.
    pub fn code(&self) -> &'static str {
        match self {
            Self::IdempotencyKeyMissing => "idempotency_key_missing",
            Self::IdempotencyKeyInvalid(_) => "idempotency_key_invalid",
            Self::IdempotencyKeyReused => "idempotency_key_reused",
            Self::IdempotencyKeyInUse { .. } => "idempotency_key_in_use",
            Self::IdempotencyKeyIncomparable => "idempotency_key_incomparable",
            Self::InvalidRequest(_) => "invalid_request",
            Self::CardNumberNotAllowed { .. } => "card_number_not_allowed",
            Self::AuthorizationRepeated => "invalid_authorization",
            Self::TenantInFlightLimit => "tenant_in_flight_limit",
            Self::RateLimited { .. } => "rate_limited",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden(_) => "forbidden",
            Self::CardDeclined(_) => "card_declined",
            Self::RefundDeclined(_) => "refund_declined",
            Self::RefundAmountTooLarge { .. } => "refund_amount_too_large",
            Self::ChargeAlreadyRefunded => "charge_already_refunded",
            Self::PayoutDeclined(_) => "payout_declined",
            Self::InsufficientBalance { .. } => "insufficient_balance",
            Self::ChargeVoided => "charge_voided",
            Self::ResolutionNotApplicable(_) => "resolution_not_applicable",
            Self::ExceptionAlreadyResolved => "exception_already_resolved",
            Self::ExceptionBeingResolved => "exception_being_resolved",
            Self::ResolutionDeclined(_) => "resolution_declined",
            Self::ProcessorUnavailable => "processor_unavailable",
            Self::PayloadTooLarge { .. } => "payload_too_large",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::NotFound(_) => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::RequestTimeout => "request_timeout",
            Self::HeadersTooLarge { .. } => "headers_too_large",
            Self::Timeout => "timeout",
            Self::Overloaded => "overloaded",
            Self::StoreUnavailable(_) => "store_unavailable",
            Self::StoreBusy(_) => "store_busy",
            Self::Internal(_) => "internal",
        }
    }

    /// Seconds a client should wait before retrying, where retrying can help.
    fn retry_after(&self) -> Option<u64> {
        match self {
            Self::IdempotencyKeyInUse { retry_after_secs }
            | Self::RateLimited { retry_after_secs } => Some(*retry_after_secs),
            Self::ProcessorUnavailable
            | Self::StoreUnavailable(_)
            | Self::StoreBusy(_)
            | Self::Overloaded
            | Self::TenantInFlightLimit
            | Self::Timeout => Some(1),
            _ => None,
        }
    }

    /// The problem document for this error, with its `Retry-After`.
    pub fn problem(&self) -> Problem {
        let mut problem = Problem::new(self.status(), self.code(), self.to_string())
            .with_type(crate::routes::problems::type_of(self.code()));
        match self {
            Self::CardDeclined(decline)
            | Self::RefundDeclined(decline)
            | Self::PayoutDeclined(decline)
            | Self::ResolutionDeclined(decline) => {
                problem = problem.with("decline_code", decline.code.clone());
            }
            Self::InsufficientBalance { available } => {
                problem = problem.with("available", *available);
            }
            _ => {}
        }
        match self.retry_after() {
            Some(secs) => problem.retry_after(secs),
            None => problem,
        }
    }

    /// The response as it is stored under an idempotency key (a decline or a refusal).
    pub fn to_stored_response(&self) -> StoredResponse {
        StoredResponse::new(
            crate::operations::SCHEMA_VERSION,
            self.status().as_u16(),
            [("content-type", PROBLEM_JSON)],
            self.problem().to_json_bytes(),
        )
    }
}

/// The processor's definitive refusal of an effect: its `decline_code` and its message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Decline {
    code: String,
    message: String,
}

impl Decline {
    pub fn new(code: String, message: String) -> Self {
        Self { code, message }
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Unavailable(_) => Self::StoreUnavailable(Box::new(error)),
            StoreError::Busy(_) => Self::StoreBusy(Box::new(error)),
            other => Self::Internal(Box::new(other)),
        }
    }
}

/// A record-store call the service makes itself fails as the engine's do.
impl From<StoreFailure> for ApiError {
    fn from(failure: StoreFailure) -> Self {
        ProtocolError::Store(failure).into()
    }
}

impl From<ProtocolError> for ApiError {
    fn from(error: ProtocolError) -> Self {
        match error {
            ProtocolError::KeyReused => Self::IdempotencyKeyReused,
            ProtocolError::KeyIncomparable => Self::IdempotencyKeyIncomparable,
            ProtocolError::KeyInUse { retry_after_secs } => {
                Self::IdempotencyKeyInUse { retry_after_secs }
            }
            ProtocolError::EffectUnavailable => Self::ProcessorUnavailable,
            ProtocolError::Store(failure) if failure.is_unavailable() => {
                Self::StoreUnavailable(failure.into_source())
            }
            ProtocolError::Store(failure) if failure.is_busy() => {
                Self::StoreBusy(failure.into_source())
            }
            ProtocolError::Store(failure) => Self::Internal(failure.into_source()),
            ProtocolError::Internal(error) => Self::Internal(error),
        }
    }
}

impl From<ReconcileError> for ApiError {
    fn from(error: ReconcileError) -> Self {
        match error {
            // The report is the processor's: a run waits for it as a charge waits for a charge.
            ReconcileError::Report { .. } => {
                tracing::warn!(error = %error, "reconciliation: no report");
                Self::ProcessorUnavailable
            }
            ReconcileError::Store(error) => error.into(),
            ReconcileError::OutOfRange(_) => Self::InvalidRequest(error.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        // Logged once, here: server faults with their full chain, client errors briefly.
        if status.is_server_error() {
            tracing::error!(error.code = self.code(), error.detail = %error_chain(&self), "request failed");
        } else {
            tracing::debug!(error.code = self.code(), "request rejected");
        }
        let mut response = self.problem().into_response();
        if matches!(self, Self::Unauthorized) {
            let bearer = HeaderValue::from_static("Bearer");
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, bearer);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::problems::documentation;

    /// One of each error. The match makes a new variant fail to compile here until it is
    /// listed, and so documented.
    fn every_error() -> Vec<ApiError> {
        let decline = || Decline::new("generic_decline".into(), "declined".into());
        let every = vec![
            ApiError::IdempotencyKeyMissing,
            ApiError::IdempotencyKeyInvalid(String::new()),
            ApiError::IdempotencyKeyReused,
            ApiError::IdempotencyKeyIncomparable,
            ApiError::IdempotencyKeyInUse {
                retry_after_secs: 1,
            },
            ApiError::InvalidRequest(String::new()),
            ApiError::CardNumberNotAllowed {
                field: "source",
                reason: String::new(),
            },
            ApiError::AuthorizationRepeated,
            ApiError::Forbidden(""),
            ApiError::Unauthorized,
            ApiError::CardDeclined(decline()),
            ApiError::RefundDeclined(decline()),
            ApiError::RefundAmountTooLarge { refundable: 0 },
            ApiError::ChargeAlreadyRefunded,
            ApiError::PayoutDeclined(decline()),
            ApiError::InsufficientBalance { available: 0 },
            ApiError::ChargeVoided,
            ApiError::ResolutionNotApplicable(String::new()),
            ApiError::ExceptionAlreadyResolved,
            ApiError::ExceptionBeingResolved,
            ApiError::ResolutionDeclined(decline()),
            ApiError::ProcessorUnavailable,
            ApiError::PayloadTooLarge { limit: 0 },
            ApiError::UnsupportedMediaType,
            ApiError::NotFound(String::new()),
            ApiError::MethodNotAllowed,
            ApiError::RequestTimeout,
            ApiError::HeadersTooLarge { limit: 0 },
            ApiError::Timeout,
            ApiError::TenantInFlightLimit,
            ApiError::RateLimited {
                retry_after_secs: 1,
            },
            ApiError::Overloaded,
            ApiError::StoreUnavailable("down".into()),
            ApiError::StoreBusy("held".into()),
            ApiError::Internal("bug".into()),
        ];
        for error in &every {
            match error {
                ApiError::IdempotencyKeyMissing
                | ApiError::IdempotencyKeyInvalid(_)
                | ApiError::IdempotencyKeyReused
                | ApiError::IdempotencyKeyIncomparable
                | ApiError::IdempotencyKeyInUse { .. }
                | ApiError::InvalidRequest(_)
                | ApiError::CardNumberNotAllowed { .. }
                | ApiError::AuthorizationRepeated
                | ApiError::Forbidden(_)
                | ApiError::Unauthorized
                | ApiError::CardDeclined(_)
                | ApiError::RefundDeclined(_)
                | ApiError::RefundAmountTooLarge { .. }
                | ApiError::ChargeAlreadyRefunded
                | ApiError::PayoutDeclined(_)
                | ApiError::InsufficientBalance { .. }
                | ApiError::ChargeVoided
                | ApiError::ResolutionNotApplicable(_)
                | ApiError::ExceptionAlreadyResolved
                | ApiError::ExceptionBeingResolved
                | ApiError::ResolutionDeclined(_)
                | ApiError::ProcessorUnavailable
                | ApiError::PayloadTooLarge { .. }
                | ApiError::UnsupportedMediaType
                | ApiError::NotFound(_)
                | ApiError::MethodNotAllowed
                | ApiError::RequestTimeout
                | ApiError::HeadersTooLarge { .. }
                | ApiError::Timeout
                | ApiError::TenantInFlightLimit
                | ApiError::RateLimited { .. }
                | ApiError::Overloaded
                | ApiError::StoreUnavailable(_)
                | ApiError::StoreBusy(_)
                | ApiError::Internal(_) => {}
            }
        }
        every
    }

    #[test]
    fn every_code_links_to_its_documentation_with_its_own_status() {
        let every = every_error();
        let codes: std::collections::HashSet<_> = every.iter().map(ApiError::code).collect();
        assert_eq!(codes.len(), every.len(), "one code per error");
        for error in &every {
            let code = error.code();
            assert_eq!(error.problem().kind, format!("/problems/{code}"));
            let text = documentation(code)
                .unwrap_or_else(|| panic!("docs/errors.md has no row for {code}"));
            let status = format!("Status {}: ", error.status().as_u16());
            assert!(text.contains(&status), "{code}: {text}");
        }
    }
}
