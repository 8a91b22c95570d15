//! The JSON the `card-sim` server and [`HttpCardProcessor`](crate::HttpCardProcessor) exchange.
//!
//! One definition for both ends, so the server and the client cannot drift apart. These are
//! plain strings and integers: the conversion to domain types (and its validation) happens at
//! each edge, not in serde.

use payments_domain::ProcessorMetadata;
use serde::{Deserialize, Serialize};

/// The header that carries the processor-side idempotency key.
pub(crate) const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// `metadata`, in a body and in a view, as Stripe has it: `{"tenant": "...", "resource_id":
/// "..."}`, or `{}` for none. Both or neither, checked where it is read.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Metadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_id: Option<String>,
}

impl Metadata {
    /// The metadata as it is sent; `{}` for none.
    pub(crate) fn of(metadata: Option<&ProcessorMetadata>) -> Self {
        Self {
            tenant: metadata.map(|m| m.tenant.as_str().to_owned()),
            resource_id: metadata.map(|m| m.resource_id.clone()),
        }
    }
}

/// The body of `POST /v1/charges`. `"capture": false` only authorises the charge (its status
/// `requires_capture`), to be captured or voided later; absent or `true`, the charge is
/// captured when it is made. A charge is sent without it, so its body is what it always was.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ChargeBody {
    pub amount: i64,
    pub currency: String,
    pub source: String,
    #[serde(default)]
    pub metadata: Metadata,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<bool>,
}

/// A charge as the server shows it (200 on create, on lookup and on cancel). `status` is a
/// [`ProcessorChargeStatus`](payments_domain::ProcessorChargeStatus) name; the simulator only
/// ever reports `succeeded`, or `requires_capture` for an authorisation (whatever became of it
/// since), since its failures are errors, not charges. `created` (a Unix timestamp) and
/// `metadata` are shown, not read back: a client takes neither from a view.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ChargeView {
    pub id: String,
    pub amount: i64,
    pub currency: String,
    pub status: String,
    #[serde(default)]
    pub created: i64,
    #[serde(default)]
    pub metadata: Metadata,
}

/// The body of `POST /v1/refunds`: `charge` is the processor's id of the charge to refund.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RefundBody {
    pub charge: String,
    pub amount: i64,
    pub currency: String,
    #[serde(default)]
    pub metadata: Metadata,
}

/// A refund as the server shows it (200 on create, on lookup and on cancel). `object` is
/// always [`REFUND_OBJECT`]; `status`, `created` and `metadata` are as for a charge.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RefundView {
    pub id: String,
    pub object: String,
    pub charge: String,
    pub amount: i64,
    pub currency: String,
    pub status: String,
    #[serde(default)]
    pub created: i64,
    #[serde(default)]
    pub metadata: Metadata,
}

/// The `object` of a [`RefundView`].
pub(crate) const REFUND_OBJECT: &str = "refund";

/// The body of `POST /v1/captures`: `charge` is the processor's id of the authorisation to
/// capture, `amount` and `currency` what to take of it (at most what it holds).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct CaptureBody {
    pub charge: String,
    pub amount: i64,
    pub currency: String,
    #[serde(default)]
    pub metadata: Metadata,
}

/// A capture as the server shows it (200 on create, on lookup and on cancel). `object` is
/// always [`CAPTURE_OBJECT`]; `created` and `metadata` are as for a charge.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct CaptureView {
    pub id: String,
    pub object: String,
    pub charge: String,
    pub amount: i64,
    pub currency: String,
    #[serde(default)]
    pub created: i64,
    #[serde(default)]
    pub metadata: Metadata,
}

/// The `object` of a [`CaptureView`].
pub(crate) const CAPTURE_OBJECT: &str = "capture";

/// The body of `POST /v1/voids`: `charge` is the processor's id of the authorisation to
/// release.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct VoidBody {
    pub charge: String,
    #[serde(default)]
    pub metadata: Metadata,
}

/// A void as the server shows it (200 on create, on lookup and on cancel). `object` is always
/// [`VOID_OBJECT`]; `created` and `metadata` are as for a charge.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct VoidView {
    pub id: String,
    pub object: String,
    pub charge: String,
    /// What it released: all the authorisation held.
    pub amount: i64,
    pub currency: String,
    #[serde(default)]
    pub created: i64,
    #[serde(default)]
    pub metadata: Metadata,
}

/// The `object` of a [`VoidView`].
pub(crate) const VOID_OBJECT: &str = "void";

/// The body of `POST /v1/payouts`: `destination` is the bank account (`ba_...`) to pay.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PayoutBody {
    pub amount: i64,
    pub currency: String,
    pub destination: String,
    #[serde(default)]
    pub metadata: Metadata,
}

/// A payout as the server shows it (200 on create, on lookup and on cancel). `object` is
/// always [`PAYOUT_OBJECT`]; `status`, `created` and `metadata` are as for a charge.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PayoutView {
    pub id: String,
    pub object: String,
    pub destination: String,
    pub amount: i64,
    pub currency: String,
    pub status: String,
    #[serde(default)]
    pub created: i64,
    #[serde(default)]
    pub metadata: Metadata,
}

/// The `object` of a [`PayoutView`].
pub(crate) const PAYOUT_OBJECT: &str = "payout";

/// The 200 body of `POST /v1/charges/cancel` (`T` is a [`ChargeView`]), of
/// `POST /v1/refunds/cancel` (a [`RefundView`]), of `POST /v1/captures/cancel` (a
/// [`CaptureView`]), of `POST /v1/voids/cancel` (a [`VoidView`]) and of
/// `POST /v1/payouts/cancel` (a [`PayoutView`]): what was made under the key, or the
/// tombstone.
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

/// The query of `GET /v1/charges`, `GET /v1/refunds`, `GET /v1/captures`, `GET /v1/voids`
/// and `GET /v1/payouts`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct FindQuery {
    pub idempotency_key: String,
}

/// The query of `GET /v1/reports/settlement`: `date` is `YYYY-MM-DD`, a UTC day.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ReportQuery {
    pub date: String,
}

/// The body of `GET /v1/stats`: what came into existence, each key once, forgotten or not.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StatsView {
    /// Charges made, authorisations included.
    pub charges_created: u64,
    /// Authorisations made (charges with `"capture": false`): a part of `charges_created`.
    pub authorizations_created: u64,
    /// Captures made.
    pub captures_created: u64,
    /// Voids made.
    pub voids_created: u64,
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
    /// The key was canceled: nothing can ever be made under it.
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
