//! A charge: the request to take money from a card, and the record of one that succeeded.

use chrono::{DateTime, Utc};

use crate::card_number::{ReferenceRefusal, check_reference, contains_card_number};
use crate::{Capture, CaptureMethod, ChargeId, ManualCapture, Money, TenantId};

/// The card token to charge (`tok_visa`): an opaque reference, never a card number.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PaymentSource(String);

impl PaymentSource {
    /// The longest token accepted.
    pub const MAX_LEN: usize = 255;
    /// What every card token starts with.
    pub const PREFIX: &str = "tok_";

    /// A token is `tok_` and then up to 251 ASCII letters, digits and underscores, and holds no
    /// card number: a client that sends the number itself is told so (a PCI matter), not
    /// merely that the token is malformed.
    pub fn new(token: impl Into<String>) -> Result<Self, SourceError> {
        let token = token.into();
        match check_reference(&token, Self::PREFIX, Self::MAX_LEN) {
            Ok(()) => Ok(Self(token)),
            Err(ReferenceRefusal::CardNumber) => Err(SourceError::CardNumber),
            Err(ReferenceRefusal::Malformed) => Err(SourceError::NotAToken),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Why a source was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    #[error("a card number is not accepted; send the card's token (tok_...) instead")]
    CardNumber,
    #[error(
        "source must be a card token: tok_ and then letters, digits or underscores, at most {} \
         characters in all",
        PaymentSource::MAX_LEN
    )]
    NotAToken,
}

/// A free-text description shown to the merchant, at most 500 characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Description(String);

impl Description {
    pub const MAX_CHARS: usize = 500;

    /// At most [`Description::MAX_CHARS`] characters, no NUL and no card number: a NUL cannot
    /// be stored in a text column, and finding that out after the card was charged would
    /// strand the charge; a card number must never be stored at all.
    pub fn new(text: impl Into<String>) -> Result<Self, DescriptionError> {
        let text = text.into();
        if contains_card_number(&text) {
            return Err(DescriptionError::CardNumber);
        }
        if text.chars().count() > Self::MAX_CHARS || text.contains('\0') {
            return Err(DescriptionError::Malformed);
        }
        Ok(Self(text))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Why a description was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DescriptionError {
    #[error("a card number is not accepted in a description; send the card's token as the source")]
    CardNumber,
    #[error(
        "description must be at most {} characters, without NUL",
        Description::MAX_CHARS
    )]
    Malformed,
}

/// A validated request to charge a card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeRequest {
    pub money: Money,
    pub source: PaymentSource,
    pub description: Option<Description>,
    /// Whether the processor captures at once or only authorises.
    pub capture: CaptureMethod,
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
    /// Where its money stands: captured when it was made, or held for a capture.
    pub capture: Capture,
}

impl Charge {
    /// The money taken: all of it for a charge captured when it was made, what its capture took
    /// for a held one, and nothing while it is held or once it is canceled. Refunds draw on
    /// this, never on the charge's amount.
    pub fn money_captured(&self) -> Option<Money> {
        match self.capture {
            Capture::Automatic => Some(self.money),
            Capture::Manual {
                state: ManualCapture::Captured { amount },
                ..
            } => Some(Money::new(amount, self.money.currency)),
            Capture::Manual { .. } => None,
        }
    }

    /// This hold, captured for `amount`.
    pub fn captured(&self, amount: crate::Amount) -> Self {
        self.ending_hold(ManualCapture::Captured { amount })
    }

    /// This hold, canceled for `reason`.
    pub fn canceled(&self, reason: Option<crate::CancellationReason>) -> Self {
        self.ending_hold(ManualCapture::Canceled { reason })
    }

    /// This charge with its hold in `state` (a charge captured when it was made stays so).
    fn ending_hold(&self, state: ManualCapture) -> Self {
        let capture = match self.capture {
            Capture::Manual { capture_before, .. } => Capture::Manual {
                capture_before,
                state,
            },
            Capture::Automatic => Capture::Automatic,
        };
        Self {
            capture,
            ..self.clone()
        }
    }

    /// What a capture may still take: the whole amount while the charge is held, else 0.
    pub fn amount_capturable(&self) -> i64 {
        match self.capture {
            Capture::Manual {
                state: ManualCapture::RequiresCapture,
                ..
            } => self.money.amount.minor_units(),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_must_be_a_token_of_bounded_length() {
        assert!(PaymentSource::new("tok_visa").is_ok());
        assert!(PaymentSource::new("tok_chargeDeclined").is_ok());
        for bad in [
            "",
            "tok_",
            "visa",
            "card_visa",
            "tok visa",
            "tok_é",
            "tok_a-b",
        ] {
            assert_eq!(
                PaymentSource::new(bad),
                Err(SourceError::NotAToken),
                "{bad:?}"
            );
        }
        assert!(PaymentSource::new(format!("tok_{}", "t".repeat(251))).is_ok());
        assert!(PaymentSource::new(format!("tok_{}", "t".repeat(252))).is_err());
    }

    #[test]
    fn a_card_number_is_never_a_source_nor_a_description() {
        for number in [
            "4111111111111111",
            "4111 1111 1111 1111",
            "tok_4111111111111111",
        ] {
            assert_eq!(PaymentSource::new(number), Err(SourceError::CardNumber));
        }
        assert_eq!(
            Description::new("card 4111-1111-1111-1111 exp 12/29"),
            Err(DescriptionError::CardNumber)
        );
        assert!(Description::new("order 4111111111111112").is_ok());
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
