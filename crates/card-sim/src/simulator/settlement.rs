//! The settlement report of the simulator, and the differences tests make in it: a line
//! dropped, an amount altered, a charge the service never asked for. (A capture or a void the
//! service never asked for needs no call of its own here: any caller may make one, under a key
//! of its own, through the simulator's capture and void calls.) The report lists what
//! the books still remember, so a day is to be read while it is within the key window (the
//! service reads the previous day, well within any window).

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::NaiveDate;
use payments_domain::{
    Amount, CaptureMethod, Money, ProcessorCapture, ProcessorCharge, ProcessorError,
    ProcessorMetadata, ProcessorPayout, ProcessorRefund, ProcessorVoid, SettlementLine,
    SettlementReport,
};

use super::book::Begin;
use super::{ChargeAnswer, InMemoryCardProcessor, Kept, State, charges, lock};
use crate::TestToken;

/// Nothing the report lists (a charge, a refund, a payout, a capture or a void) with this
/// processor id is remembered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no charge, refund, payout, capture or void {processor_id} is remembered")]
pub struct UnknownProcessorId {
    pub processor_id: String,
}

/// How a test changed a line of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReportChange {
    /// The line is left out of every report.
    Dropped,
    /// The line shows this amount instead of what was made.
    Amount(Amount),
}

/// The report's changes, by processor id. The last change of a line wins; a change goes when
/// the key window lets go of what it changes.
#[derive(Debug, Default)]
pub(crate) struct ReportChanges(HashMap<String, ReportChange>);

impl ReportChanges {
    pub(super) fn forget(&mut self, processor_id: &str) {
        self.0.remove(processor_id);
    }

    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `line` as the report shows it; `None` if it is dropped.
    fn apply(&self, mut line: SettlementLine) -> Option<SettlementLine> {
        match self.0.get(&line.processor_id) {
            None => Some(line),
            Some(ReportChange::Dropped) => None,
            Some(ReportChange::Amount(amount)) => {
                line.money = Money::new(*amount, line.money.currency);
                Some(line)
            }
        }
    }
}

impl InMemoryCardProcessor {
    /// Leaves the line of `processor_id` out of every report; what it made is still there to
    /// be looked up and refunded, as a processor that lost a line of its report would.
    pub fn drop_from_report(&self, processor_id: &str) -> Result<(), UnknownProcessorId> {
        self.change_report(processor_id, ReportChange::Dropped)
    }

    /// Makes the line of `processor_id` show `amount` instead of what was made.
    pub fn alter_in_report(
        &self,
        processor_id: &str,
        amount: Amount,
    ) -> Result<(), UnknownProcessorId> {
        self.change_report(processor_id, ReportChange::Amount(amount))
    }

    /// Makes a charge of `money` under `processor_key` at once, as if another caller had: it
    /// succeeds, is reported, is refundable and answers lookups and cancels like any other.
    /// A key that already has an answer keeps it, as a charge call under it would.
    pub fn charge_unsolicited(
        &self,
        processor_key: &str,
        money: Money,
        metadata: Option<ProcessorMetadata>,
    ) -> Result<ProcessorCharge, ProcessorError> {
        let answer = self.unsolicited(processor_key.to_owned(), money, metadata);
        answer.into_result().map(|made| made.value)
    }

    /// [`InMemoryCardProcessor::charge_unsolicited`], answered in full.
    pub(crate) fn unsolicited(
        &self,
        key: String,
        money: Money,
        metadata: Option<ProcessorMetadata>,
    ) -> ChargeAnswer {
        let token = TestToken::Succeeds;
        let mut state = lock(&self.state);
        let begun = state.charges.begin(&key, |first| {
            charges::decide(token, money, CaptureMethod::Automatic, first)
        });
        match begun {
            Begin::Answered(answer) => answer,
            Begin::Started(outcome) => state.settle_charge(key, outcome, token, metadata),
        }
    }

    /// The report of `date` (UTC): every charge, refund, payout, capture and void still
    /// remembered that came into existence that day, in the order they did, with the tests'
    /// changes.
    pub(crate) fn settlement_lines(&self, date: NaiveDate) -> Vec<SettlementLine> {
        let mut state = lock(&self.state);
        let mut lines = Vec::new();
        lines_of::<ProcessorCharge>(&mut state, date, &mut lines);
        lines_of::<ProcessorRefund>(&mut state, date, &mut lines);
        lines_of::<ProcessorPayout>(&mut state, date, &mut lines);
        lines_of::<ProcessorCapture>(&mut state, date, &mut lines);
        lines_of::<ProcessorVoid>(&mut state, date, &mut lines);
        // The stamps' sequence is the order in which things came into existence, across
        // books and within one clock tick.
        lines.sort_unstable_by_key(|(seq, _)| *seq);
        lines
            .into_iter()
            .filter_map(|(_, line)| state.report.apply(line))
            .collect()
    }

    fn change_report(
        &self,
        processor_id: &str,
        change: ReportChange,
    ) -> Result<(), UnknownProcessorId> {
        let mut state = lock(&self.state);
        // A scan of every book: a test endpoint, called a handful of times per test.
        let remembered = holds::<ProcessorCharge>(&mut state, processor_id)
            || holds::<ProcessorRefund>(&mut state, processor_id)
            || holds::<ProcessorPayout>(&mut state, processor_id)
            || holds::<ProcessorCapture>(&mut state, processor_id)
            || holds::<ProcessorVoid>(&mut state, processor_id);
        if !remembered {
            return Err(UnknownProcessorId {
                processor_id: processor_id.to_owned(),
            });
        }
        state.report.0.insert(processor_id.to_owned(), change);
        Ok(())
    }
}

/// Adds the lines of what `T`'s book made on `date`, each with its stamp's `seq`.
fn lines_of<T: Kept>(state: &mut State, date: NaiveDate, lines: &mut Vec<(u64, SettlementLine)>) {
    let made_that_day = T::book(state)
        .made()
        .filter(|(_, _, made)| made.created_at.date_naive() == date);
    for (key, seq, made) in made_that_day {
        let line = SettlementLine {
            kind: T::KIND,
            processor_id: made.value.processor_id().to_owned(),
            processor_key: key.to_owned(),
            money: made.value.money(),
            status: made.value.status(),
            created_at: made.created_at,
            metadata: made.metadata.clone(),
        };
        lines.push((seq, line));
    }
}

/// Whether `T`'s book still remembers something made as `processor_id`.
fn holds<T: Kept>(state: &mut State, processor_id: &str) -> bool {
    T::book(state)
        .made()
        .any(|(_, _, made)| made.value.processor_id() == processor_id)
}

#[async_trait]
impl SettlementReport for InMemoryCardProcessor {
    async fn settlement_report(
        &self,
        date: NaiveDate,
    ) -> Result<Vec<SettlementLine>, ProcessorError> {
        Ok(self.settlement_lines(date))
    }
}
