//! What the operations on a hold share: the refusals a capture, a cancel or a refund meets on a
//! charge's hold, each a problem with a stable `code` that converts into the answer the engine
//! stores and replays (they are not variants of the shared [`ApiError`]); the handler of a
//! capture and of a cancel, and the shape of their stored requests (the body with the charge of
//! the path).

use std::sync::Arc;

use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use payments_domain::{
    Amount, CancellationReason, Capture, Charge, ChargeId, ManualCapture, decline,
};
use payments_idempotency::StoredResponse;
use payments_idempotency::engine::{Idempotent, Operation};
use payments_storage::Transaction;
use payments_storage::captures::{HoldClaim, HoldEnd};
use serde_json::Value;

use super::SCHEMA_VERSION;
use super::charge::tenants_charge;
use crate::error::{PROBLEM_JSON, Problem};
use crate::extract::IdempotentCall;
use crate::handling::run_idempotent;
use crate::routes::problems::type_of;
use crate::views::{joined_stored, timestamp};
use crate::{ApiError, AppState};

/// The field naming the charge in a stored request of a capture or a cancel.
pub(super) const CHARGE: &str = "charge";

/// Why a capture, a cancel or a refund cannot be done to a charge as it stands: a final
/// answer, stored and replayed, since it depends on the charge's state.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HoldRefusal {
    status: StatusCode,
    code: &'static str,
    detail: String,
    /// A member the problem carries besides its detail, for a client to act on.
    member: Option<(&'static str, Value)>,
}

impl HoldRefusal {
    fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        Self {
            status,
            code,
            detail: detail.into(),
            member: None,
        }
    }

    fn with(mut self, name: &'static str, value: impl Into<Value>) -> Self {
        self.member = Some((name, value.into()));
        self
    }

    /// 400 `charge_already_captured`.
    fn already_captured(detail: &str) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "charge_already_captured", detail)
    }

    /// 400 `charge_canceled`.
    fn canceled(detail: &str) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "charge_canceled", detail)
    }

    /// 400 `charge_expired_for_capture`.
    fn expired(capture_before: DateTime<Utc>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "charge_expired_for_capture",
            format!(
                "This charge's authorisation expired at {}: it can no longer be captured.",
                timestamp(capture_before)
            ),
        )
        .with("capture_before", timestamp(capture_before))
    }

    /// Whether a capture of `amount` (all of the hold when `None`) may claim `charge` at `now`.
    pub(super) fn of_capture(
        charge: &Charge,
        amount: Option<Amount>,
        now: DateTime<Utc>,
    ) -> Result<(), Self> {
        let Capture::Manual {
            capture_before,
            state,
        } = charge.capture
        else {
            return Err(Self::already_captured(
                "This charge was captured when it was made: there is nothing to capture.",
            ));
        };
        match state {
            ManualCapture::Captured { .. } => Err(Self::already_captured(
                "This charge has already been captured.",
            )),
            // A hold the expiry canceled, or one past its time the expiry has not reached yet,
            // is refused as expired either way.
            ManualCapture::Canceled {
                reason: Some(CancellationReason::Expired),
            } => Err(Self::expired(capture_before)),
            ManualCapture::Canceled { .. } => Err(Self::canceled(
                "This charge was canceled: it can no longer be captured.",
            )),
            ManualCapture::RequiresCapture if now >= capture_before => {
                Err(Self::expired(capture_before))
            }
            ManualCapture::RequiresCapture => match amount {
                Some(amount) if amount > charge.money.amount => Err(Self::new(
                    StatusCode::BAD_REQUEST,
                    "amount_too_large",
                    format!(
                        "amount_to_capture is larger than what this charge holds ({}).",
                        charge.amount_capturable()
                    ),
                )
                .with("amount_capturable", charge.amount_capturable())),
                _ => Ok(()),
            },
        }
    }

    /// Whether a cancel may claim `charge`: any hold not captured or canceled, even past its
    /// `capture_before` (the expiry's own cancel is one).
    pub(super) fn of_cancel(charge: &Charge) -> Result<(), Self> {
        match charge.capture {
            Capture::Automatic
            | Capture::Manual {
                state: ManualCapture::Captured { .. },
                ..
            } => Err(Self::already_captured(
                "A captured charge cannot be canceled: refund it instead.",
            )),
            Capture::Manual {
                state: ManualCapture::Canceled { .. },
                ..
            } => Err(Self::canceled("This charge has already been canceled.")),
            Capture::Manual {
                state: ManualCapture::RequiresCapture,
                ..
            } => Ok(()),
        }
    }

    /// Another key's capture or cancel holds the hold: it ends the hold, or is at work on it.
    pub(super) fn claimed_by(end: HoldEnd) -> Self {
        match end {
            HoldEnd::Capture => Self::already_captured(
                "This charge is captured, or being captured, under another Idempotency-Key.",
            ),
            HoldEnd::Cancel => Self::canceled(
                "This charge is canceled, or being canceled, under another Idempotency-Key.",
            ),
        }
    }

    /// A refund of a charge whose money was never taken.
    pub(crate) fn not_captured() -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "charge_not_captured",
            "This charge only holds its money and was not captured: nothing can be refunded. \
             Capture it, or cancel it to release the hold.",
        )
    }

    /// The processor's refusal of a capture or a void: its stable codes as this service's,
    /// anything else as 402 `otherwise` with the processor's code.
    pub(super) fn declined(code: &str, message: String, otherwise: &'static str) -> Self {
        match code {
            decline::ALREADY_CAPTURED => Self::already_captured(&message),
            decline::CANCELED => Self::canceled(&message),
            decline::AMOUNT_TOO_LARGE => {
                Self::new(StatusCode::BAD_REQUEST, "amount_too_large", message)
            }
            decline::NOT_CAPTURABLE => {
                Self::new(StatusCode::BAD_REQUEST, "charge_not_capturable", message)
            }
            _ => Self::new(StatusCode::PAYMENT_REQUIRED, otherwise, message)
                .with("decline_code", code),
        }
    }

    /// The refusal as the answer the engine stores and replays.
    pub(crate) fn stored(&self) -> StoredResponse {
        let mut problem =
            Problem::new(self.status, self.code, self.detail.clone()).with_type(type_of(self.code));
        if let Some((name, value)) = &self.member {
            problem = problem.with(name, value.clone());
        }
        StoredResponse::new(
            SCHEMA_VERSION,
            self.status.as_u16(),
            [("content-type", PROBLEM_JSON)],
            problem.to_json_bytes(),
        )
    }
}

/// The charge a claim on its hold holds, or the final answer that refuses it.
pub(super) fn claimed(
    claim: HoldClaim<HoldRefusal>,
    charge: ChargeId,
) -> Result<Charge, StoredResponse> {
    match claim {
        HoldClaim::Claimed(charge) => Ok(charge),
        HoldClaim::Refused(refusal) => Err(refusal.stored()),
        HoldClaim::ClaimedByAnother(end) => Err(HoldRefusal::claimed_by(end).stored()),
        HoldClaim::NoSuchCharge => {
            let missing = ApiError::NotFound(format!("No such charge: {charge}"));
            Err(missing.to_stored_response())
        }
    }
}

/// A capture's or a cancel's handler: everything is validated before the claim, the charge
/// too, so that a bad request or a charge that is not the tenant's stores nothing and leaves the
/// key free; `parse` reads the body.
pub(super) async fn end_hold<O>(
    state: &AppState,
    op: &Arc<Idempotent<O>>,
    call: IdempotentCall,
    id: Result<Path<String>, PathRejection>,
    body: &[u8],
    parse: impl FnOnce(&[u8], ChargeId) -> Result<O::Request, ApiError>,
) -> Result<Response, ApiError>
where
    O: Operation<Transaction = Transaction>,
{
    let tenant = call.tenant.clone();
    let validate = || async {
        let charge = tenants_charge(state, &tenant, id).await?;
        let request = parse(body, charge.id)?;
        Ok((request, joined_stored(body, CHARGE, charge.id)?))
    };
    run_idempotent(state, op, call, body, validate).await
}
