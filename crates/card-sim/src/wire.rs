//! The JSON the `card-sim` server and [`HttpCardProcessor`](crate::HttpCardProcessor) exchange.
//!
//! One definition for both ends, so the server and the client cannot drift apart. These are
//! plain strings and integers: the conversion to domain types (and its validation) happens at
//! each edge, not in serde.

use serde::{Deserialize, Serialize};

/// The header that carries the processor-side idempotency key.
pub(crate) const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// The body of `POST /v1/charges`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ChargeBody {
    pub amount: i64,
    pub currency: String,
    pub source: String,
}

/// A charge as the server shows it (200 on create, on lookup and on cancel). `status` is a
/// [`ProcessorChargeStatus`](payments_domain::ProcessorChargeStatus) name; the simulator only
/// ever reports `succeeded`, since its failures are errors, not charges.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ChargeView {
    pub id: String,
    pub amount: i64,
    pub currency: String,
    pub status: String,
}

/// The body of `POST /v1/refunds`: `charge` is the processor's id of the charge to refund.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RefundBody {
    pub charge: String,
    pub amount: i64,
    pub currency: String,
}

/// A refund as the server shows it (200 on create, on lookup and on cancel). `object` is
/// always [`REFUND_OBJECT`]; `status`, as for a charge, is only ever `succeeded`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RefundView {
    pub id: String,
    pub object: String,
    pub charge: String,
    pub amount: i64,
    pub currency: String,
    pub status: String,
}

/// The `object` of a [`RefundView`].
pub(crate) const REFUND_OBJECT: &str = "refund";

/// The body of `POST /v1/payouts`: `destination` is the bank account (`ba_...`) to pay.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PayoutBody {
    pub amount: i64,
    pub currency: String,
    pub destination: String,
}

/// A payout as the server shows it (200 on create, on lookup and on cancel). `object` is
/// always [`PAYOUT_OBJECT`]; `status`, as for a charge, is only ever `succeeded`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PayoutView {
    pub id: String,
    pub object: String,
    pub destination: String,
    pub amount: i64,
    pub currency: String,
    pub status: String,
}

/// The `object` of a [`PayoutView`].
pub(crate) const PAYOUT_OBJECT: &str = "payout";

/// The 200 body of `POST /v1/charges/cancel` (`T` is a [`ChargeView`]), of
/// `POST /v1/refunds/cancel` (a [`RefundView`]) and of `POST /v1/payouts/cancel` (a
/// [`PayoutView`]): what was made under the key, or the tombstone.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum CancelView<T> {
    Exists(T),
    Canceled(CanceledView),
}

/// `{"status": "canceled"}`: nothing exists under the key, and nothing ever will.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct CanceledView {
    pub status: String,
}

/// The `status` of a [`CanceledView`].
pub(crate) const CANCELED: &str = "canceled";

/// The query of `GET /v1/charges`, `GET /v1/refunds` and `GET /v1/payouts`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct FindQuery {
    pub idempotency_key: String,
}

/// The body of `GET /v1/stats`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StatsView {
    pub charges_created: u64,
    /// Refunds that succeeded, each key once.
    pub refunds_created: u64,
    /// Payouts that were paid, each key once.
    pub payouts_created: u64,
}

/// Every error body: `{"error": {...}}`, in the shape card processors commonly use.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ErrorEnvelope {
    pub error: ErrorDetail,
}

/// What went wrong: `type` is `card_error` (402), `api_error` (5xx, and 409 while
/// processing) or `invalid_request_error`; `code` names the conflict of a 409.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ErrorDetail {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<String>,
    pub message: String,
}

/// The `code` of a 409. A string on the wire, so that a body with a code this side does not
/// know still parses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConflictCode {
    /// A call under the key is still within its latency: its outcome does not exist yet.
    Processing,
    /// The key was canceled: nothing can ever be charged or refunded under it.
    IdempotencyKeyCanceled,
}

impl ConflictCode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Processing => "processing",
            Self::IdempotencyKeyCanceled => "idempotency_key_canceled",
        }
    }
}
