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

/// A charge as the server shows it (200 on create and on lookup).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ChargeView {
    pub id: String,
    pub amount: i64,
    pub currency: String,
    pub status: String,
}

/// The only status a charge the simulator returns can have: failures are errors, not charges.
pub(crate) const SUCCEEDED: &str = "succeeded";

/// The query of `GET /v1/charges`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct FindQuery {
    pub idempotency_key: String,
}

/// The body of `GET /v1/stats`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StatsView {
    pub charges_created: u64,
}

/// Every error body: `{"error": {...}}`, in the shape card processors commonly use.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ErrorEnvelope {
    pub error: ErrorDetail,
}

/// What went wrong: `type` is `card_error` (402), `api_error` (5xx) or `invalid_request_error`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct ErrorDetail {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<String>,
    pub message: String,
}
