//! Money as an integer of minor units that can be neither zero nor negative.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A positive amount in the currency's minor units (cents, pence; yen have none).
///
/// The upper bound keeps every sum of a day's charges far from `i64` overflow and matches the
/// largest charge the API accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Amount(i64);

impl Amount {
    /// The smallest chargeable amount.
    pub const MIN: i64 = 1;
    /// The largest chargeable amount: 999,999.99 in a two-decimal currency.
    pub const MAX: i64 = 99_999_999;

    /// Builds an amount, refusing zero, negatives and anything above [`Amount::MAX`].
    pub fn new(minor_units: i64) -> Result<Self, AmountError> {
        if (Self::MIN..=Self::MAX).contains(&minor_units) {
            Ok(Self(minor_units))
        } else {
            Err(AmountError::OutOfRange(minor_units))
        }
    }

    /// The amount in minor units.
    pub fn minor_units(self) -> i64 {
        self.0
    }
}

/// Why a number is not an [`Amount`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    #[error("amount must be an integer of minor units from 1 to 99999999, got {0}")]
    OutOfRange(i64),
}

/// The ISO 4217 currencies the service settles in.
///
/// A closed enum rather than a free string: an unknown currency is rejected at the edge, and
/// every currency knows its exponent so that minor units are never misread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Currency {
    Aud,
    Cad,
    Chf,
    Dkk,
    Eur,
    Gbp,
    Jpy,
    Krw,
    Nok,
    Sek,
    Usd,
}

impl Currency {
    /// Every supported currency, in code order.
    pub const ALL: [Currency; 11] = [
        Self::Aud,
        Self::Cad,
        Self::Chf,
        Self::Dkk,
        Self::Eur,
        Self::Gbp,
        Self::Jpy,
        Self::Krw,
        Self::Nok,
        Self::Sek,
        Self::Usd,
    ];

    /// The upper-case ISO 4217 alphabetic code.
    pub fn code(self) -> &'static str {
        match self {
            Self::Aud => "AUD",
            Self::Cad => "CAD",
            Self::Chf => "CHF",
            Self::Dkk => "DKK",
            Self::Eur => "EUR",
            Self::Gbp => "GBP",
            Self::Jpy => "JPY",
            Self::Krw => "KRW",
            Self::Nok => "NOK",
            Self::Sek => "SEK",
            Self::Usd => "USD",
        }
    }

    /// How many decimal places one major unit has: 2 for USD, 0 for JPY.
    pub fn exponent(self) -> u32 {
        match self {
            Self::Jpy | Self::Krw => 0,
            _ => 2,
        }
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

impl FromStr for Currency {
    type Err = CurrencyError;

    /// Accepts the code in any case (`usd`, `Usd`, `USD`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|c| c.code().eq_ignore_ascii_case(s))
            .ok_or_else(|| CurrencyError::Unsupported(s.to_owned()))
    }
}

/// Why a string is not a supported [`Currency`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CurrencyError {
    #[error("currency {0:?} is not a supported ISO 4217 code")]
    Unsupported(String),
}

/// A positive amount in one currency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Money {
    pub amount: Amount,
    pub currency: Currency,
}

impl Money {
    pub fn new(amount: Amount, currency: Currency) -> Self {
        Self { amount, currency }
    }
}

impl fmt::Display for Money {
    /// Renders major units with the currency's exponent: `12.34 USD`, `500 JPY`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let units = self.amount.minor_units();
        match self.currency.exponent() {
            0 => write!(f, "{units} {}", self.currency),
            exp => {
                let scale = 10_i64.pow(exp);
                let width = exp as usize;
                write!(
                    f,
                    "{}.{:0width$} {}",
                    units / scale,
                    units % scale,
                    self.currency
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amount_cannot_be_zero_negative_or_above_the_maximum() {
        assert!(Amount::new(0).is_err());
        assert!(Amount::new(-1).is_err());
        assert!(Amount::new(Amount::MAX + 1).is_err());
        assert_eq!(Amount::new(1).map(Amount::minor_units), Ok(1));
        assert_eq!(
            Amount::new(Amount::MAX).map(Amount::minor_units),
            Ok(Amount::MAX)
        );
    }

    #[test]
    fn currency_parses_in_any_case_and_rejects_unknown_codes() {
        assert_eq!("usd".parse::<Currency>(), Ok(Currency::Usd));
        assert_eq!("Jpy".parse::<Currency>(), Ok(Currency::Jpy));
        assert!("XXX".parse::<Currency>().is_err());
        assert!("".parse::<Currency>().is_err());
    }

    #[test]
    fn money_displays_major_units_with_the_currency_exponent() -> Result<(), AmountError> {
        assert_eq!(
            Money::new(Amount::new(1234)?, Currency::Usd).to_string(),
            "12.34 USD"
        );
        assert_eq!(
            Money::new(Amount::new(5)?, Currency::Eur).to_string(),
            "0.05 EUR"
        );
        assert_eq!(
            Money::new(Amount::new(500)?, Currency::Jpy).to_string(),
            "500 JPY"
        );
        Ok(())
    }
}
