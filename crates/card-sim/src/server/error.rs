//! Every error the `card-sim` server answers with, mapped to a status and a body in one place.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use payments_domain::ProcessorError;

use crate::wire::{ConflictCode, ErrorDetail, ErrorEnvelope};

/// What a request to the simulator can fail with.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SimError {
    /// 400: a call or a cancel without an `Idempotency-Key`.
    #[error("The Idempotency-Key header is required.")]
    MissingIdempotencyKey,
    /// 400: a malformed key, body or query.
    #[error("{0}")]
    InvalidRequest(String),
    /// 404: nothing made under the key, or no such route.
    #[error("{0}")]
    NotFound(String),
    /// 402: the card, the refund, the capture, the void or the payout was declined; the same
    /// key keeps answering this.
    #[error("{message}")]
    Declined {
        decline_code: String,
        message: String,
    },
    /// 500: a transient failure; nothing was made, a retry with the same key may succeed.
    #[error("The processor could not complete the request. Retry with the same Idempotency-Key.")]
    Transient { reason: String },
    /// 409 `processing`: a call under the key is still in flight; its outcome does not exist
    /// yet. Ask again later.
    #[error("A request with this Idempotency-Key is still being processed. Retry later.")]
    Processing,
    /// 409 `idempotency_key_canceled`: the key was canceled, so nothing can be made under it.
    #[error("This Idempotency-Key was canceled; nothing can be made under it.")]
    KeyCanceled,
}

/// A settled outcome that made nothing: a decline stays a decline, and a transient failure is
/// a 500 that a retry under the same key may turn into a success.
impl From<ProcessorError> for SimError {
    fn from(error: ProcessorError) -> Self {
        match error {
            ProcessorError::Declined {
                decline_code,
                message,
            } => Self::Declined {
                decline_code,
                message,
            },
            ProcessorError::Unavailable { reason } => Self::Transient { reason },
        }
    }
}

impl SimError {
    fn status(&self) -> StatusCode {
        match self {
            Self::MissingIdempotencyKey | Self::InvalidRequest(_) => StatusCode::BAD_REQUEST,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Declined { .. } => StatusCode::PAYMENT_REQUIRED,
            Self::Transient { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Processing | Self::KeyCanceled => StatusCode::CONFLICT,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Self::MissingIdempotencyKey
            | Self::InvalidRequest(_)
            | Self::NotFound(_)
            | Self::KeyCanceled => "invalid_request_error",
            Self::Declined { .. } => "card_error",
            Self::Transient { .. } | Self::Processing => "api_error",
        }
    }

    fn code(&self) -> Option<ConflictCode> {
        match self {
            Self::Processing => Some(ConflictCode::Processing),
            Self::KeyCanceled => Some(ConflictCode::IdempotencyKeyCanceled),
            Self::MissingIdempotencyKey
            | Self::InvalidRequest(_)
            | Self::NotFound(_)
            | Self::Declined { .. }
            | Self::Transient { .. } => None,
        }
    }
}

impl IntoResponse for SimError {
    fn into_response(self) -> Response {
        let decline_code = match &self {
            Self::Transient { reason } => {
                // The body stays generic; the detail is logged here, once.
                tracing::warn!(error.reason = %reason, "call failed transiently");
                None
            }
            Self::Declined { decline_code, .. } => {
                tracing::info!(error.decline_code = %decline_code, "declined");
                Some(decline_code.clone())
            }
            _ => None,
        };
        let body = ErrorEnvelope {
            error: ErrorDetail {
                kind: self.kind().to_owned(),
                code: self.code().map(|code| code.as_str().to_owned()),
                decline_code,
                message: self.to_string(),
            },
        };
        (self.status(), Json(body)).into_response()
    }
}
