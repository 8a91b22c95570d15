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
}

/// A successful charge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// `ch_` and a UUID: the same on every attempt under one key.
    pub id: String,
    pub object: String,
    pub amount: i64,
    pub currency: String,
    pub source: String,
    pub description: Option<String>,
    pub status: String,
    pub processor_charge_id: String,
    pub amount_refunded: i64,
    pub created_at: String,
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
}

/// The operation a key is scoped to, in `GET /idempotency-keys/{key}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyOperation {
    #[serde(rename = "charges.create")]
    Charge,
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
}
