//! The API's bodies, field for field as `openapi.yaml` names them (`tests/contract.rs` checks
//! each against its schema there, so that the two cannot drift apart).
//!
//! Amounts are integers of minor units, as on the wire. Ids, currencies, timestamps and problem
//! codes are kept as the service sends them, as strings: a client built today must still read
//! an answer that names a currency or a code added later. A closed list the client acts on
//! (a refund's reason, a key's state) is an enum.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The body of `POST /charges`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargeRequest {
    /// In the currency's minor units, from 1 to 99999999.
    pub amount: i64,
    /// An ISO 4217 code, in any case.
    pub currency: String,
    /// The card token to charge (`tok_...`), never a card number.
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `Some(false)` only authorises the card: the charge is a hold, `requires_capture` until
    /// it is captured ([`Client::capture_charge`](crate::Client::capture_charge)) or canceled
    /// ([`Client::cancel_charge`](crate::Client::cancel_charge)). Absent (`None`, never sent)
    /// or `true` captures at once, as a request without it always has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<bool>,
}

/// Where a charge is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChargeStatus {
    /// Its money is taken: at once, or by a capture.
    Succeeded,
    /// A hold, neither captured nor canceled yet.
    RequiresCapture,
    /// A hold canceled, by the caller or by its expiry.
    Canceled,
}

/// A successful charge. A hold (a charge made with `capture: Some(false)`) also shows the
/// fields from `captured` on; a charge captured at once shows none of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// `ch_` and a UUID: the same on every attempt under one key.
    pub id: String,
    pub object: String,
    pub amount: i64,
    pub currency: String,
    pub source: String,
    pub description: Option<String>,
    pub status: ChargeStatus,
    pub processor_charge_id: String,
    pub amount_refunded: i64,
    pub created_at: String,
    /// A hold's only: whether its money was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub captured: Option<bool>,
    /// A hold's only: what a capture may take (all of it while held, else 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount_capturable: Option<i64>,
    /// A hold's only: what its capture took (0 until then, and for good once canceled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount_captured: Option<i64>,
    /// A hold's only: after it, it can no longer be captured and the service cancels it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture_before: Option<String>,
    /// A canceled hold's only, when a reason was given or it expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancellation_reason: Option<CanceledBecause>,
}

/// The body of `POST /charges/{id}/capture`. An absent `amount_to_capture` captures all of
/// the hold; less releases the rest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount_to_capture: Option<i64>,
}

/// Why a caller cancels a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancellationReason {
    Duplicate,
    Fraudulent,
    RequestedByCustomer,
    Abandoned,
}

/// The body of `POST /charges/{id}/cancel`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancellation_reason: Option<CancellationReason>,
}

/// Why a hold was canceled, as its charge shows it: a caller's [`CancellationReason`], or its
/// expiry, the service's own (which no caller gives).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CanceledBecause {
    Duplicate,
    Fraudulent,
    RequestedByCustomer,
    Abandoned,
    /// Past its `capture_before`, the service canceled it.
    Expired,
}

impl From<CancellationReason> for CanceledBecause {
    fn from(reason: CancellationReason) -> Self {
        match reason {
            CancellationReason::Duplicate => Self::Duplicate,
            CancellationReason::Fraudulent => Self::Fraudulent,
            CancellationReason::RequestedByCustomer => Self::RequestedByCustomer,
            CancellationReason::Abandoned => Self::Abandoned,
        }
    }
}

/// Why a charge is refunded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundReason {
    RequestedByCustomer,
    Duplicate,
    Fraudulent,
}

/// The body of `POST /charges/{id}/refunds`. An absent `amount` refunds all that remains.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<RefundReason>,
}

/// Where a refund is at the processor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundStatus {
    Pending,
    Succeeded,
}

/// A refund of a charge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refund {
    /// `re_` and a UUID: the same on every attempt under one key.
    pub id: String,
    pub object: String,
    /// The refunded charge's id.
    pub charge: String,
    pub amount: i64,
    pub currency: String,
    pub status: RefundStatus,
    pub reason: Option<RefundReason>,
    /// `None` only while the refund is pending.
    pub processor_refund_id: Option<String>,
    pub created_at: String,
}

/// The body of `POST /payouts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayoutRequest {
    pub amount: i64,
    pub currency: String,
    /// The bank account paid, as the processor names it.
    pub destination: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// Where a payout is at the processor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PayoutStatus {
    Pending,
    Paid,
}

/// A payout of the tenant's balance to a bank account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payout {
    /// `po_` and a UUID: the same on every attempt under one key.
    pub id: String,
    pub object: String,
    pub amount: i64,
    pub currency: String,
    pub destination: String,
    pub description: Option<String>,
    pub status: PayoutStatus,
    /// `None` only while the payout is pending.
    pub processor_payout_id: Option<String>,
    pub created_at: String,
}

/// An amount in one currency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalanceAmount {
    pub amount: i64,
    pub currency: String,
}

/// The tenant's balance, per currency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Balance {
    pub object: String,
    /// What payouts and refunds may still take.
    pub available: Vec<BalanceAmount>,
    /// What payouts in flight hold.
    pub pending: Vec<BalanceAmount>,
    /// What holds have on cards, neither captured nor canceled: not yet the tenant's. Only
    /// currencies in which some are; the service leaves it out when there are none (and a
    /// service older than holds never sends it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub authorized: Vec<BalanceAmount>,
}

/// The operation a key is scoped to, in `GET /idempotency-keys/{key}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyOperation {
    #[serde(rename = "charges.create")]
    Charge,
    #[serde(rename = "charges.capture")]
    Capture,
    #[serde(rename = "charges.cancel")]
    Cancel,
    #[serde(rename = "refunds.create")]
    Refund,
    #[serde(rename = "payouts.create")]
    Payout,
}

impl KeyOperation {
    /// Its name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Charge => "charges.create",
            Self::Capture => "charges.capture",
            Self::Cancel => "charges.cancel",
            Self::Refund => "refunds.create",
            Self::Payout => "payouts.create",
        }
    }
}

/// Where a key's record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyState {
    /// An attempt holds or held the key and has no final answer yet.
    Pending,
    /// A final answer is stored and replayed.
    Completed,
    /// The attempt ended without an effect; a retry executes the request.
    Failed,
}

/// How far the key's request got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryPoint {
    Started,
    Charged,
    Finished,
}

/// What the service tells about one of the caller's keys: "did my request go through?"
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdempotencyKeyRecord {
    pub object: String,
    pub key: String,
    pub operation: KeyOperation,
    pub state: KeyState,
    pub recovery_point: RecoveryPoint,
    pub attempts: i64,
    pub response_status: Option<u16>,
    pub response_schema_version: Option<i64>,
    pub fingerprint: String,
    pub locked_until: Option<String>,
    pub created_at: String,
    pub expires_at: Option<String>,
}

/// One of the tenant's events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// `evt_` and `event_id`: the cursor of `GET /events`.
    pub id: String,
    pub object: String,
    pub event_id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub created_at: String,
    /// The event as the stream carries it; its fields depend on `type`.
    pub payload: Value,
}

/// A page of events, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventList {
    pub object: String,
    pub data: Vec<Event>,
    /// Whether newer events follow this page.
    pub has_more: bool,
}

/// An RFC 9457 problem, with the service's stable `code`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// Where the code is documented: `/problems/{code}`, relative to the service.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    /// For people; may change. Branch on `code`.
    pub detail: String,
    pub code: String,
    /// Why a card was declined (`card_declined`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<String>,
    /// The balance available (`insufficient_balance`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available: Option<i64>,
    /// What the hold holds (`amount_too_large` of a capture).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount_capturable: Option<i64>,
    /// Since when the hold can no longer be captured (`charge_expired_for_capture`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture_before: Option<String>,
}

#[cfg(test)]
mod tests;
