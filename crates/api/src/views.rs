//! The JSON shapes of requests and responses, and their conversion to and from domain types.

use chrono::SecondsFormat;
use payments_domain::{Amount, Charge, ChargeRequest, Currency, Description, Money, PaymentSource};
use payments_storage::Balance;
use serde::{Deserialize, Serialize};

use crate::ApiError;

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
    /// by the completer from the canonical body stored with a record. Typed parsing from the
    /// bytes rejects duplicate fields, unknown fields, wrong types and numbers outside i64 with
    /// a message that names the field.
    pub fn parse(body: &[u8]) -> Result<ChargeRequest, ApiError> {
        let typed: Self = serde_json::from_slice(body)
            .map_err(|e| ApiError::InvalidRequest(format!("Invalid JSON body: {e}")))?;
        ChargeRequest::try_from(typed)
    }
}

impl TryFrom<CreateChargeBody> for ChargeRequest {
    type Error = ApiError;

    fn try_from(body: CreateChargeBody) -> Result<Self, Self::Error> {
        let field = |name: &str, e: &dyn std::fmt::Display| {
            ApiError::InvalidRequest(format!("{name}: {e}"))
        };
        let amount = Amount::new(body.amount).map_err(|e| field("amount", &e))?;
        let currency: Currency = body.currency.parse().map_err(|e| field("currency", &e))?;
        Ok(ChargeRequest {
            money: Money::new(amount, currency),
            source: PaymentSource::new(body.source).map_err(|e| field("source", &e))?,
            description: body
                .description
                .map(Description::new)
                .transpose()
                .map_err(|e| field("description", &e))?,
        })
    }
}

/// A charge as the API shows it, in `POST /charges`, `GET /charges/{id}` and lists alike.
#[derive(Debug, Serialize)]
pub struct ChargeView {
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
            created_at: charge
                .created_at
                .to_rfc3339_opts(SecondsFormat::Micros, true),
        }
    }
}

/// A page of charges, in the list shape payment APIs commonly use.
#[derive(Debug, Serialize)]
pub struct ChargeList {
    pub object: &'static str,
    pub data: Vec<ChargeView>,
    pub has_more: bool,
}

/// `GET /ledger/balances`.
#[derive(Debug, Serialize)]
pub struct BalancesView {
    pub balances: Vec<BalanceView>,
}

#[derive(Debug, Serialize)]
pub struct BalanceView {
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
