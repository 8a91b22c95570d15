//! The JSON shapes every resource shares (a list, a timestamp, money, a description, the
//! checks of a body's fields), and those of the resources that are no operation's: events,
//! the ledger's balances and the operator's exceptions. An operation's own body and view are
//! in its module.

use chrono::{DateTime, SecondsFormat, Utc};
use payments_domain::{Amount, Currency, Description, DescriptionError, Money};
use payments_storage::{Balance, StoredEvent};
use serde::Serialize;
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

/// `amount` and `currency` as the canonical bodies spell them: minor units, and the currency's
/// code in lower case, as clients send it.
pub(crate) fn money_json(money: &Money) -> serde_json::Map<String, Value> {
    let mut body = serde_json::Map::new();
    body.insert("amount".into(), money.amount.minor_units().into());
    body.insert(
        "currency".into(),
        money.currency.code().to_ascii_lowercase().into(),
    );
    body
}

/// Adds `description` to a canonical body when there is one; none is no field.
pub(crate) fn insert_description(
    body: &mut serde_json::Map<String, Value>,
    description: Option<&Description>,
) {
    if let Some(description) = description {
        body.insert("description".into(), description.as_str().into());
    }
}

/// 400 `invalid_request` naming `name`.
pub(crate) fn invalid_field(name: &str, reason: &dyn std::fmt::Display) -> ApiError {
    ApiError::InvalidRequest(format!("{name}: {reason}"))
}

/// The `amount` and `currency` fields of a body.
pub(crate) fn money_field(amount: i64, currency: &str) -> Result<Money, ApiError> {
    let amount = Amount::new(amount).map_err(|e| invalid_field("amount", &e))?;
    let currency: Currency = currency
        .parse()
        .map_err(|e| invalid_field("currency", &e))?;
    Ok(Money::new(amount, currency))
}

/// The optional `description` field of a body.
pub(crate) fn description_field(
    description: Option<String>,
) -> Result<Option<Description>, ApiError> {
    description
        .map(Description::new)
        .transpose()
        .map_err(|e| match e {
            DescriptionError::CardNumber => card_number("description", &e),
            DescriptionError::Malformed => invalid_field("description", &e),
        })
}

/// 400 `card_number_not_allowed` for `field`: the message says what to send instead, and
/// never repeats the number.
pub(crate) fn card_number(field: &'static str, reason: &dyn std::fmt::Display) -> ApiError {
    ApiError::CardNumberNotAllowed {
        field,
        reason: reason.to_string(),
    }
}

/// RFC 3339 in UTC with microseconds, the precision the database keeps.
pub(crate) fn timestamp(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// The request to store with a record whose path names a resource: the body as sent, with
/// that resource's id added as `field`, so that the fingerprint covers it and the completer can
/// finish from the record alone. [`split_stored`] reads it back.
pub(crate) fn joined_stored(
    body: &[u8],
    field: &str,
    id: impl std::fmt::Display,
) -> Result<Value, ApiError> {
    let mut stored: Value = json_body(body)?;
    let Value::Object(fields) = &mut stored else {
        return Err(ApiError::InvalidRequest(
            "The body must be a JSON object.".into(),
        ));
    };
    fields.insert(field.to_owned(), Value::String(id.to_string()));
    Ok(stored)
}

/// An optional field that, when sent, must hold a value (`deserialize_with`): `"amount": null`
/// is refused rather than read as the field's absence, which means something else (all that is
/// left, a capture at once).
pub(crate) fn present<'de, D, T>(field: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    T::deserialize(field).map(Some)
}

/// A request stored with its record whose path named a resource: that resource's id, stored
/// in the body as `field`, and the body without it as `T`.
pub(crate) fn split_stored<Id, T>(body: &[u8], field: &str) -> Result<(Id, T), ApiError>
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

/// A page of a list (charges, events, …), in the list shape payment APIs commonly use.
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
