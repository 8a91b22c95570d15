//! A charge: the request to take money from a card, and the record of one that succeeded.

use chrono::{DateTime, Utc};

use crate::{ChargeId, Money, TenantId};

/// The card token to charge (`tok_visa`): an opaque reference, never a card number.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PaymentSource(String);

impl PaymentSource {
    /// The longest token accepted.
    pub const MAX_LEN: usize = 255;

    /// A token is 1 to 255 visible ASCII characters.
    pub fn new(token: impl Into<String>) -> Result<Self, SourceError> {
        let token = token.into();
        let visible = token.bytes().all(|b| b.is_ascii_graphic());
        if token.is_empty() || token.len() > Self::MAX_LEN || !visible {
            return Err(SourceError);
        }
        Ok(Self(token))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The token is empty, too long or not visible ASCII.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "source must be a card token of 1 to {} visible ASCII characters",
    PaymentSource::MAX_LEN
)]
pub struct SourceError;

/// A free-text description shown to the merchant, at most 500 characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Description(String);

impl Description {
    pub const MAX_CHARS: usize = 500;

    /// At most [`Description::MAX_CHARS`] characters and no NUL: a NUL cannot be stored in a
    /// text column, and finding that out after the card was charged would strand the charge.
    pub fn new(text: impl Into<String>) -> Result<Self, DescriptionError> {
        let text = text.into();
        if text.chars().count() > Self::MAX_CHARS || text.contains('\0') {
            return Err(DescriptionError);
        }
        Ok(Self(text))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The description is longer than [`Description::MAX_CHARS`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "description must be at most {} characters, without NUL",
    Description::MAX_CHARS
)]
pub struct DescriptionError;

/// A validated request to charge a card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeRequest {
    pub money: Money,
    pub source: PaymentSource,
    pub description: Option<Description>,
}

/// A charge the processor accepted, as it is stored and shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    pub id: ChargeId,
    pub tenant: TenantId,
    pub money: Money,
    pub source: PaymentSource,
    pub description: Option<Description>,
    pub processor_charge_id: String,
    pub created_at: DateTime<Utc>,
    /// The sum of the charge's succeeded refunds, in its currency's minor units.
    pub amount_refunded: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_must_be_visible_ascii_of_bounded_length() {
        assert!(PaymentSource::new("tok_visa").is_ok());
        assert!(PaymentSource::new("").is_err());
        assert!(PaymentSource::new("tok visa").is_err());
        assert!(PaymentSource::new("tok_é").is_err());
        assert!(PaymentSource::new("t".repeat(256)).is_err());
    }

    #[test]
    fn description_is_limited_in_characters_not_bytes() {
        assert!(Description::new("é".repeat(500)).is_ok());
        assert!(Description::new("a".repeat(501)).is_err());
    }

    #[test]
    fn description_cannot_hold_a_nul() {
        assert!(Description::new("a\0b").is_err());
    }
}
