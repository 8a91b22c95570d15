//! The JSON shapes of requests and responses, and their conversion to and from domain types.

use chrono::{DateTime, SecondsFormat, Utc};
use payments_domain::{
    Amount, Charge, ChargeId, ChargeRequest, Currency, Description, DescriptionError, Destination,
    DestinationError, Money, PaymentSource, Payout, PayoutRequest, PayoutStatus, Refund,
    RefundReason, RefundRequest, RefundStatus, SourceError,
};
use payments_storage::{Balance, Funds, StoredEvent};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ApiError;

mod ops;

pub(crate) use ops::{ExceptionView, ResolveBody};

/// A request body as `T`: typed parsing from the bytes rejects duplicate fields, unknown
/// fields (where `T` denies them), wrong types and numbers outside i64, with a message that
/// names the field.
///
/// The body must be a JSON object. A typed parse would also read a struct from an array (in
/// field order), and a gateway rule that inspects the object's fields would never see them.
pub(crate) fn json_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(ApiError::InvalidRequest(
            "The request body must be a JSON object.".into(),
        ));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::InvalidRequest(format!("Invalid JSON body: {e}")))
}

/// The body of `POST /charges`. Unknown fields are rejected so a typo (`ammount`) is an error,
/// not a silently different charge.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateChargeBody {
    pub amount: i64,
    pub currency: String,
    pub source: String,
    #[serde(default)]
    pub description: Option<String>,
}

impl CreateChargeBody {
    /// The validated request in a `POST /charges` body: by the handler before the claim, and
    /// by the completer from the canonical body stored with a record.
    pub fn parse(body: &[u8]) -> Result<ChargeRequest, ApiError> {
        let typed: Self = json_body(body)?;
        ChargeRequest::try_from(typed)
    }

    /// `request` as the body every version of `charges.create` shares, whatever the client's
    /// spelling (`"USD"` or `"usd"`, `"description": null` or none): what its fingerprint
    /// covers, and what is stored for the completer, which [`parse`](Self::parse) reads back.
    pub(crate) fn canonical(request: &ChargeRequest) -> Value {
        let mut body = money_json(&request.money);
        body.insert("source".into(), request.source.as_str().into());
        insert_description(&mut body, request.description.as_ref());
        Value::Object(body)
    }
}

/// `amount` and `currency` as the canonical bodies spell them: minor units, and the currency's
/// code in lower case, as clients send it.
fn money_json(money: &Money) -> serde_json::Map<String, Value> {
    let mut body = serde_json::Map::new();
    body.insert("amount".into(), money.amount.minor_units().into());
    body.insert(
        "currency".into(),
        money.currency.code().to_ascii_lowercase().into(),
    );
    body
}

/// Adds `description` to a canonical body when there is one; none is no field.
fn insert_description(
    body: &mut serde_json::Map<String, Value>,
    description: Option<&Description>,
) {
    if let Some(description) = description {
        body.insert("description".into(), description.as_str().into());
    }
}

impl TryFrom<CreateChargeBody> for ChargeRequest {
    type Error = ApiError;

    fn try_from(body: CreateChargeBody) -> Result<Self, Self::Error> {
        let money = money_field(body.amount, &body.currency)?;
        let source = PaymentSource::new(body.source).map_err(|e| match e {
            SourceError::CardNumber => card_number("source", &e),
            SourceError::NotAToken => invalid_field("source", &e),
        })?;
        Ok(ChargeRequest {
            money,
            source,
            description: description_field(body.description)?,
        })
    }
}

/// 400 `invalid_request` naming `name`.
fn invalid_field(name: &str, reason: &dyn std::fmt::Display) -> ApiError {
    ApiError::InvalidRequest(format!("{name}: {reason}"))
}

/// The `amount` and `currency` fields of a body.
fn money_field(amount: i64, currency: &str) -> Result<Money, ApiError> {
    let amount = Amount::new(amount).map_err(|e| invalid_field("amount", &e))?;
    let currency: Currency = currency
        .parse()
        .map_err(|e| invalid_field("currency", &e))?;
    Ok(Money::new(amount, currency))
}

/// The optional `description` field of a body.
fn description_field(description: Option<String>) -> Result<Option<Description>, ApiError> {
    description
        .map(Description::new)
        .transpose()
        .map_err(|e| match e {
            DescriptionError::CardNumber => card_number("description", &e),
            DescriptionError::Malformed => invalid_field("description", &e),
        })
}

/// The body of `POST /payouts`. Unknown fields are rejected, like a charge's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreatePayoutBody {
    pub amount: i64,
    pub currency: String,
    pub destination: String,
    #[serde(default)]
    pub description: Option<String>,
}

impl CreatePayoutBody {
    /// The validated request in a `POST /payouts` body: by the handler before the claim, and
    /// by the completer from the canonical body stored with a record.
    pub(crate) fn parse(body: &[u8]) -> Result<PayoutRequest, ApiError> {
        let typed: Self = json_body(body)?;
        let destination = Destination::new(typed.destination).map_err(|e| match e {
            DestinationError::CardNumber => card_number("destination", &e),
            DestinationError::NotABankAccount => invalid_field("destination", &e),
        })?;
        Ok(PayoutRequest {
            money: money_field(typed.amount, &typed.currency)?,
            destination,
            description: description_field(typed.description)?,
        })
    }

    /// `request` as the body every version of `payouts.create` shares (see
    /// [`CreateChargeBody::canonical`]); [`parse`](Self::parse) reads it back.
    pub(crate) fn canonical(request: &PayoutRequest) -> Value {
        let mut body = money_json(&request.money);
        body.insert("destination".into(), request.destination.as_str().into());
        insert_description(&mut body, request.description.as_ref());
        Value::Object(body)
    }
}

/// A payout as the API shows it, in its 201, `GET /payouts/{id}` and lists alike.
#[derive(Debug, Serialize)]
pub(crate) struct PayoutView {
    pub id: String,
    pub object: &'static str,
    pub amount: i64,
    pub currency: &'static str,
    pub destination: String,
    pub description: Option<String>,
    pub status: &'static str,
    /// `None` while the payout is pending at the processor.
    pub processor_payout_id: Option<String>,
    pub created_at: String,
}

impl From<&Payout> for PayoutView {
    fn from(payout: &Payout) -> Self {
        let (status, processor_payout_id) = match &payout.status {
            PayoutStatus::Pending => ("pending", None),
            PayoutStatus::Paid {
                processor_payout_id,
            } => ("paid", Some(processor_payout_id.clone())),
        };
        Self {
            id: payout.id.to_string(),
            object: "payout",
            amount: payout.money.amount.minor_units(),
            currency: payout.money.currency.code(),
            destination: payout.destination.as_str().to_owned(),
            description: payout.description.as_ref().map(|d| d.as_str().to_owned()),
            status,
            processor_payout_id,
            created_at: timestamp(payout.created_at),
        }
    }
}

/// 400 `card_number_not_allowed` for `field`: the message says what to send instead, and
/// never repeats the number.
fn card_number(field: &'static str, reason: &dyn std::fmt::Display) -> ApiError {
    ApiError::CardNumberNotAllowed {
        field,
        reason: reason.to_string(),
    }
}

/// A charge as the API shows it, in `POST /charges`, `GET /charges/{id}` and lists alike.
#[derive(Debug, Serialize)]
pub(crate) struct ChargeView {
    pub id: String,
    pub object: &'static str,
    pub amount: i64,
    pub currency: &'static str,
    pub source: String,
    pub description: Option<String>,
    pub status: &'static str,
    pub processor_charge_id: String,
    /// RFC 3339 in UTC with microseconds, the precision the database keeps, so a charge reads
    /// back exactly as it was first returned.
    pub created_at: String,
    /// The sum of the charge's succeeded refunds: 0 in the 201 and its replays, which are the
    /// bytes of the moment the charge was made.
    pub amount_refunded: i64,
}

impl From<&Charge> for ChargeView {
    fn from(charge: &Charge) -> Self {
        Self {
            id: charge.id.to_string(),
            object: "charge",
            amount: charge.money.amount.minor_units(),
            currency: charge.money.currency.code(),
            source: charge.source.as_str().to_owned(),
            description: charge.description.as_ref().map(|d| d.as_str().to_owned()),
            status: "succeeded",
            processor_charge_id: charge.processor_charge_id.clone(),
            created_at: timestamp(charge.created_at),
            amount_refunded: charge.amount_refunded,
        }
    }
}

/// RFC 3339 in UTC with microseconds, the precision the database keeps.
fn timestamp(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// A request stored with its record whose path named a resource: that resource's id, stored
/// in the body as `field`, and the body without it as `T`.
fn split_stored<Id, T>(body: &[u8], field: &str) -> Result<(Id, T), ApiError>
where
    Id: std::str::FromStr,
    T: serde::de::DeserializeOwned,
{
    let invalid = |e: &dyn std::fmt::Display| {
        ApiError::InvalidRequest(format!("Invalid stored request: {e}"))
    };
    let mut fields: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(body).map_err(|e| invalid(&e))?;
    let id = fields
        .remove(field)
        .and_then(|id| id.as_str()?.parse().ok())
        .ok_or_else(|| invalid(&format!("no {field}")))?;
    let typed =
        serde_json::from_value(serde_json::Value::Object(fields)).map_err(|e| invalid(&e))?;
    Ok((id, typed))
}

/// The body of `POST /charges/{id}/refunds`. Unknown fields are rejected, like a charge's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateRefundBody {
    #[serde(default, deserialize_with = "present")]
    pub amount: Option<i64>,
    #[serde(default, deserialize_with = "present")]
    pub reason: Option<String>,
}

/// An optional field that, when sent, must hold a value: `"amount": null` is refused rather
/// than read as "no amount", which would refund all that is left.
fn present<'de, D, T>(field: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(field).map(Some)
}

impl CreateRefundBody {
    /// The field naming the charge in the stored request.
    pub(crate) const CHARGE: &'static str = "charge";

    /// The validated refund of `charge` in a `POST /charges/{id}/refunds` body.
    pub(crate) fn parse(body: &[u8], charge: ChargeId) -> Result<RefundRequest, ApiError> {
        let typed: Self = json_body(body)?;
        typed.into_request(charge)
    }

    /// The request stored with a record, for the completer: the body with the charge of the
    /// path as its [`CHARGE`](Self::CHARGE) field.
    pub(crate) fn parse_stored(body: &[u8]) -> Result<RefundRequest, ApiError> {
        let (charge, typed): (ChargeId, Self) = split_stored(body, Self::CHARGE)?;
        typed.into_request(charge)
    }

    /// `request` as the body every version of `refunds.create` shares, the charge of the path
    /// included (see [`CreateChargeBody::canonical`]); [`parse_stored`](Self::parse_stored)
    /// reads it back.
    pub(crate) fn canonical(request: &RefundRequest) -> Value {
        let mut body = serde_json::Map::new();
        body.insert(Self::CHARGE.into(), request.charge.to_string().into());
        if let Some(amount) = request.amount {
            body.insert("amount".into(), amount.minor_units().into());
        }
        if let Some(reason) = request.reason {
            body.insert("reason".into(), reason.name().into());
        }
        Value::Object(body)
    }

    fn into_request(self, charge: ChargeId) -> Result<RefundRequest, ApiError> {
        let amount = self
            .amount
            .map(Amount::new)
            .transpose()
            .map_err(|e| invalid_field("amount", &e))?;
        let reason = self
            .reason
            .map(|name| {
                RefundReason::from_name(&name).ok_or_else(|| {
                    let names: Vec<_> = RefundReason::ALL.iter().map(|r| r.name()).collect();
                    invalid_field("reason", &format!("must be one of {}", names.join(", ")))
                })
            })
            .transpose()?;
        Ok(RefundRequest {
            charge,
            amount,
            reason,
        })
    }
}

/// A refund as the API shows it, in its 201, `GET /refunds/{id}` and lists alike.
#[derive(Debug, Serialize)]
pub(crate) struct RefundView {
    pub id: String,
    pub object: &'static str,
    pub charge: String,
    pub amount: i64,
    pub currency: &'static str,
    pub status: &'static str,
    pub reason: Option<&'static str>,
    /// `None` while the refund is pending at the processor.
    pub processor_refund_id: Option<String>,
    pub created_at: String,
}

impl From<&Refund> for RefundView {
    fn from(refund: &Refund) -> Self {
        let (status, processor_refund_id) = match &refund.status {
            RefundStatus::Pending => ("pending", None),
            RefundStatus::Succeeded {
                processor_refund_id,
            } => ("succeeded", Some(processor_refund_id.clone())),
        };
        Self {
            id: refund.id.to_string(),
            object: "refund",
            charge: refund.charge.to_string(),
            amount: refund.money.amount.minor_units(),
            currency: refund.money.currency.code(),
            status,
            reason: refund.reason.map(RefundReason::name),
            processor_refund_id,
            created_at: timestamp(refund.created_at),
        }
    }
}

/// An event as `GET /events` shows it: the fields of its stream entry (`event_id`, `type`,
/// `payload`, as `events tail` prints them), so that a consumer reads both alike and
/// deduplicates on `event_id`; and the API's own `id` (`evt_` and the same UUID) for
/// `starting_after` and `GET /events/{id}`.
#[derive(Debug, Serialize)]
pub(crate) struct EventView {
    pub id: String,
    pub object: &'static str,
    pub event_id: String,
    #[serde(rename = "type")]
    pub event_type: &'static str,
    pub created_at: String,
    pub payload: serde_json::Value,
}

impl From<&StoredEvent> for EventView {
    fn from(event: &StoredEvent) -> Self {
        Self {
            id: event.id.to_string(),
            object: "event",
            event_id: event.id.as_uuid().to_string(),
            event_type: event.event_type.name(),
            created_at: timestamp(event.created_at),
            payload: event.payload.clone(),
        }
    }
}

/// A page of charges, refunds, payouts or events, in the list shape payment APIs commonly use.
#[derive(Debug, Serialize)]
pub(crate) struct List<V> {
    pub object: &'static str,
    pub data: Vec<V>,
    pub has_more: bool,
}

impl<V> List<V> {
    pub(crate) fn of<T>(items: &[T], has_more: bool) -> Self
    where
        for<'a> V: From<&'a T>,
    {
        Self {
            object: "list",
            data: items.iter().map(V::from).collect(),
            has_more,
        }
    }
}

/// `GET /ledger/balances`.
#[derive(Debug, Serialize)]
pub(crate) struct BalancesView {
    pub balances: Vec<BalanceView>,
}

#[derive(Debug, Serialize)]
pub(crate) struct BalanceView {
    pub account: &'static str,
    pub currency: &'static str,
    pub balance: i64,
}

impl From<&Balance> for BalanceView {
    fn from(b: &Balance) -> Self {
        Self {
            account: b.account.name(),
            currency: b.currency.code(),
            balance: b.balance,
        }
    }
}

/// `GET /balance`: the tenant's funds per currency, in the shape payment APIs commonly use.
#[derive(Debug, Serialize)]
pub(crate) struct FundsView {
    pub object: &'static str,
    /// What payouts and refunds may take now.
    pub available: Vec<AmountView>,
    /// What payouts in flight hold; only currencies in which some are.
    pub pending: Vec<AmountView>,
}

#[derive(Debug, Serialize)]
pub(crate) struct AmountView {
    pub amount: i64,
    pub currency: &'static str,
}

impl FundsView {
    pub(crate) fn of(funds: &[Funds]) -> Self {
        let amounts = |amount: fn(&Funds) -> i64| -> Vec<AmountView> {
            funds
                .iter()
                .map(|f| AmountView {
                    amount: amount(f),
                    currency: f.currency.code(),
                })
                .collect()
        };
        Self {
            object: "balance",
            available: amounts(|f| f.available),
            pending: amounts(|f| f.pending)
                .into_iter()
                .filter(|a| a.amount != 0)
                .collect(),
        }
    }
}
