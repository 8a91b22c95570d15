//! The double-entry ledger: a transaction is a set of signed entries that sums to zero in every
//! currency, and it can only be built balanced.

use std::collections::BTreeMap;
use std::fmt;

use uuid::Uuid;

use crate::{Charge, Currency, Money, Payout, Refund};

/// A ledger account of one tenant. Debits are positive, credits negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Account {
    /// What the card processor owes the tenant for captured charges (an asset: debited).
    ProcessorReceivable,
    /// What the tenant earned from its customers (revenue: credited), less what it was
    /// paid out: its balance.
    CustomerPayments,
    /// What was paid out of the tenant's balance to its bank accounts.
    PayoutsInTransit,
}

impl Account {
    pub const ALL: [Account; 3] = [
        Self::ProcessorReceivable,
        Self::CustomerPayments,
        Self::PayoutsInTransit,
    ];

    /// The stable name stored in the database and shown by the API.
    pub fn name(self) -> &'static str {
        match self {
            Self::ProcessorReceivable => "processor_receivable",
            Self::CustomerPayments => "customer_payments",
            Self::PayoutsInTransit => "payouts_in_transit",
        }
    }

    /// The account with this stored name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }
}

impl fmt::Display for Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One signed posting: positive debits, negative credits, never zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerEntry {
    pub account: Account,
    pub currency: Currency,
    pub amount: i64,
}

/// Why a set of entries is not a transaction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("a ledger transaction needs at least two entries")]
    TooFewEntries,
    #[error("a ledger entry cannot be zero")]
    ZeroEntry,
    #[error("entries in {currency} sum to {sum}, not zero")]
    Unbalanced { currency: Currency, sum: i128 },
}

/// A balanced set of entries. The fields are private: the only ways in are
/// [`LedgerTransaction::new`], which checks the balance, and [`LedgerTransaction::for_charge`],
/// [`LedgerTransaction::for_refund`] and [`LedgerTransaction::for_payout`], which balance by
/// construction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerTransaction {
    id: Uuid,
    entries: Vec<LedgerEntry>,
}

impl LedgerTransaction {
    /// Checks that the entries balance in every currency before accepting them.
    pub fn new(id: Uuid, entries: Vec<LedgerEntry>) -> Result<Self, LedgerError> {
        if entries.len() < 2 {
            return Err(LedgerError::TooFewEntries);
        }
        if entries.iter().any(|e| e.amount == 0) {
            return Err(LedgerError::ZeroEntry);
        }
        // i128 so that no sum of i64 entries can overflow while checking.
        let mut sums: BTreeMap<Currency, i128> = BTreeMap::new();
        for entry in &entries {
            *sums.entry(entry.currency).or_default() += i128::from(entry.amount);
        }
        if let Some((&currency, &sum)) = sums.iter().find(|(_, sum)| **sum != 0) {
            return Err(LedgerError::Unbalanced { currency, sum });
        }
        Ok(Self { id, entries })
    }

    /// The capture of a successful charge: the processor owes the amount, the tenant earned it.
    pub fn for_charge(charge: &Charge) -> Self {
        Self::moving(
            charge.money,
            Account::CustomerPayments,
            Account::ProcessorReceivable,
        )
    }

    /// The capture of a held charge: what it took, as a charge captured at once posts all of
    /// its amount. The hold itself was never posted: held money is no one's yet.
    pub fn for_capture(captured: Money) -> Self {
        Self::moving(
            captured,
            Account::CustomerPayments,
            Account::ProcessorReceivable,
        )
    }

    /// A refund reverses its part of the charge's transaction: the processor owes that much
    /// less, and the tenant gave it back.
    pub fn for_refund(refund: &Refund) -> Self {
        Self::moving(
            refund.money,
            Account::ProcessorReceivable,
            Account::CustomerPayments,
        )
    }

    /// A payout takes its amount out of the tenant's balance, on its way to the bank.
    pub fn for_payout(payout: &Payout) -> Self {
        Self::moving(
            payout.money,
            Account::PayoutsInTransit,
            Account::CustomerPayments,
        )
    }

    /// `money` credited to `from` and debited to `to`: balanced by construction.
    fn moving(money: Money, from: Account, to: Account) -> Self {
        let amount = money.amount.minor_units();
        let currency = money.currency;
        Self {
            id: Uuid::now_v7(),
            entries: vec![
                LedgerEntry {
                    account: to,
                    currency,
                    amount,
                },
                LedgerEntry {
                    account: from,
                    currency,
                    amount: -amount,
                },
            ],
        }
    }

    pub fn id(&self) -> Uuid {
        self.id
    }

    pub fn entries(&self) -> &[LedgerEntry] {
        &self.entries
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;
    use crate::{
        Amount, ChargeId, Destination, PaymentSource, PayoutId, PayoutStatus, RefundId,
        RefundStatus, TenantId,
    };

    /// The signed sum of `tx`'s entries in `account`.
    fn amount_in(tx: &LedgerTransaction, account: Account) -> i64 {
        tx.entries()
            .iter()
            .filter(|e| e.account == account)
            .map(|e| e.amount)
            .sum()
    }

    fn entry(account: Account, currency: Currency, amount: i64) -> LedgerEntry {
        LedgerEntry {
            account,
            currency,
            amount,
        }
    }

    #[test]
    fn unbalanced_entries_are_refused() {
        let entries = vec![
            entry(Account::ProcessorReceivable, Currency::Usd, 100),
            entry(Account::CustomerPayments, Currency::Usd, -99),
        ];
        assert_eq!(
            LedgerTransaction::new(Uuid::new_v4(), entries),
            Err(LedgerError::Unbalanced {
                currency: Currency::Usd,
                sum: 1
            })
        );
    }

    #[test]
    fn entries_must_balance_per_currency_not_in_total() {
        let entries = vec![
            entry(Account::ProcessorReceivable, Currency::Usd, 100),
            entry(Account::CustomerPayments, Currency::Eur, -100),
        ];
        assert!(matches!(
            LedgerTransaction::new(Uuid::new_v4(), entries),
            Err(LedgerError::Unbalanced { .. })
        ));
    }

    #[test]
    fn a_single_or_zero_entry_is_refused() {
        let one = vec![entry(Account::ProcessorReceivable, Currency::Usd, 100)];
        assert_eq!(
            LedgerTransaction::new(Uuid::new_v4(), one),
            Err(LedgerError::TooFewEntries)
        );
        let zeros = vec![
            entry(Account::ProcessorReceivable, Currency::Usd, 0),
            entry(Account::CustomerPayments, Currency::Usd, 0),
        ];
        assert_eq!(
            LedgerTransaction::new(Uuid::new_v4(), zeros),
            Err(LedgerError::ZeroEntry)
        );
    }

    #[test]
    fn a_charge_posts_one_balanced_transaction() -> Result<(), Box<dyn std::error::Error>> {
        let charge = Charge {
            id: ChargeId::generate(),
            tenant: TenantId::new("acme"),
            money: Money::new(Amount::new(2500)?, Currency::Gbp),
            source: PaymentSource::new("tok_visa")?,
            description: None,
            processor_charge_id: "sim_1".into(),
            created_at: Utc::now(),
            amount_refunded: 0,
            capture: crate::Capture::Automatic,
        };
        let tx = LedgerTransaction::for_charge(&charge);
        let sum: i64 = tx.entries().iter().map(|e| e.amount).sum();
        assert_eq!(sum, 0);
        assert_eq!(tx.entries().len(), 2);
        // Re-checking through the validating constructor proves the shortcut builds a valid one.
        assert!(LedgerTransaction::new(tx.id(), tx.entries().to_vec()).is_ok());
        Ok(())
    }

    #[test]
    fn a_refund_reverses_its_part_of_the_charge() -> Result<(), Box<dyn std::error::Error>> {
        let money = Money::new(Amount::new(700)?, Currency::Gbp);
        let refund = Refund {
            id: RefundId::generate(),
            tenant: TenantId::new("acme"),
            charge: ChargeId::generate(),
            money,
            reason: None,
            status: RefundStatus::Pending,
            created_at: Utc::now(),
        };
        let tx = LedgerTransaction::for_refund(&refund);
        let amount_in = |account| amount_in(&tx, account);
        assert_eq!(amount_in(Account::ProcessorReceivable), -700);
        assert_eq!(amount_in(Account::CustomerPayments), 700);
        assert!(LedgerTransaction::new(tx.id(), tx.entries().to_vec()).is_ok());
        Ok(())
    }

    #[test]
    fn a_payout_moves_its_amount_from_the_balance_to_payouts_in_transit()
    -> Result<(), Box<dyn std::error::Error>> {
        let payout = Payout {
            id: PayoutId::generate(),
            tenant: TenantId::new("acme"),
            money: Money::new(Amount::new(900)?, Currency::Usd),
            destination: Destination::new("ba_checking")?,
            description: None,
            status: PayoutStatus::Pending,
            created_at: Utc::now(),
        };
        let tx = LedgerTransaction::for_payout(&payout);
        let amount_in = |account| amount_in(&tx, account);
        assert_eq!(amount_in(Account::CustomerPayments), 900);
        assert_eq!(amount_in(Account::PayoutsInTransit), -900);
        assert_eq!(amount_in(Account::ProcessorReceivable), 0);
        assert!(LedgerTransaction::new(tx.id(), tx.entries().to_vec()).is_ok());
        Ok(())
    }
}
