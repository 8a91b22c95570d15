//! Everything the simulator remembers, and what each kind of key settles to.

use std::time::Duration;

use chrono::TimeDelta;
use payments_domain::{
    Money, ProcessorCapture, ProcessorCharge, ProcessorChargeStatus, ProcessorMetadata,
    ProcessorPayout, ProcessorRefund, ProcessorVoid, SettlementKind,
};

use super::book::{Book, Stamp};
use super::captures::Capturable;
use super::clock::Clock;
use super::refunds::Refundable;
use super::settlement::ReportChanges;
use super::{CaptureAnswer, ChargeAnswer, Outcome};
use crate::TestToken;

/// Everything the simulator remembers, under one mutex: each key's transitions are atomic,
/// and so are a refund's check of its charge together with its reservation, and a capture's
/// or a void's check of its authorisation together with the change it makes to it.
#[derive(Debug)]
pub(crate) struct State {
    /// Charges and authorisations alike: one kind of key.
    pub(super) charges: Book<ProcessorCharge>,
    pub(super) refunds: Book<ProcessorRefund>,
    pub(super) refundable: Refundable,
    pub(super) captures: Book<ProcessorCapture>,
    pub(super) voids: Book<ProcessorVoid>,
    pub(super) capturable: Capturable,
    pub(super) payouts: Book<ProcessorPayout>,
    /// The lines tests dropped from the settlement report or altered in it.
    pub(super) report: ReportChanges,
    clock: Clock,
    /// How long a key is remembered once it settled or was canceled.
    key_window: TimeDelta,
    /// The `seq` of the next [`Stamp`].
    next_seq: u64,
}

impl State {
    pub(super) fn new(clock: Clock, key_window: Duration) -> Self {
        Self {
            charges: Book::default(),
            refunds: Book::default(),
            refundable: Refundable::default(),
            captures: Book::default(),
            voids: Book::default(),
            capturable: Capturable::default(),
            payouts: Book::default(),
            report: ReportChanges::default(),
            clock,
            // A window beyond what a `TimeDelta` holds is, in effect, forever.
            key_window: TimeDelta::from_std(key_window).unwrap_or(TimeDelta::MAX),
            next_seq: 0,
        }
    }

    /// A stamp for a settle or a cancel happening now.
    pub(super) fn stamp(&mut self) -> Stamp {
        self.next_seq += 1;
        Stamp {
            at: self.clock.now(),
            seq: self.next_seq,
        }
    }

    /// Forgets every key whose window has passed, with what was made under it and everything
    /// that refers to that: a charge's refundable entry, an authorisation's capture state, a
    /// report change.
    pub(super) fn forget_expired(&mut self) {
        // No cutoff before the clock's earliest time: nothing is that old.
        let Some(cutoff) = self.clock.now().checked_sub_signed(self.key_window) else {
            return;
        };
        for charge in self.charges.forget_settled_before(cutoff) {
            self.refundable.forget(&charge.id);
            self.capturable.forget(&charge.id);
            self.report.forget(&charge.id);
        }
        for refund in self.refunds.forget_settled_before(cutoff) {
            self.report.forget(&refund.id);
        }
        for capture in self.captures.forget_settled_before(cutoff) {
            self.report.forget(&capture.id);
        }
        for void in self.voids.forget_settled_before(cutoff) {
            self.report.forget(&void.id);
        }
        for payout in self.payouts.forget_settled_before(cutoff) {
            self.report.forget(&payout.id);
        }
    }

    /// Records a charge call's outcome. A charge that comes into existence becomes refundable
    /// at the same moment; an authorisation becomes capturable, and refundable only once
    /// captured.
    pub(super) fn settle_charge(
        &mut self,
        key: String,
        outcome: Outcome<ProcessorCharge>,
        token: TestToken,
        metadata: Option<ProcessorMetadata>,
    ) -> ChargeAnswer {
        if let Outcome::Succeeded(charge) = &outcome {
            self.refundable.add(charge, token);
            if charge.status == ProcessorChargeStatus::RequiresCapture {
                self.capturable.add(charge, token);
            }
        }
        let stamp = self.stamp();
        self.charges.settle(key, outcome, metadata, stamp)
    }

    /// Records a capture call's outcome. Its authorisation was captured when the call began;
    /// it becomes refundable, up to what the capture took, once the capture exists.
    pub(super) fn settle_capture(
        &mut self,
        key: String,
        outcome: Outcome<ProcessorCapture>,
        metadata: Option<ProcessorMetadata>,
    ) -> CaptureAnswer {
        if let Outcome::Succeeded(capture) = &outcome {
            self.refundable.capture(capture);
        }
        let stamp = self.stamp();
        self.captures.settle(key, outcome, metadata, stamp)
    }
}

/// What a key of each kind settles to (a charge, a refund, a payout, a capture, a void), and
/// where its book is: so that a lookup and a cancel are written once for every kind.
pub(crate) trait Booked: Clone + Sized {
    fn book(state: &mut State) -> &mut Book<Self>;
}

/// What the settlement report lists (charges, authorisations among them, refunds, payouts,
/// captures and voids): so that a line of the report is written once for every kind.
pub(crate) trait Kept: Booked {
    /// What its lines in the settlement report are.
    const KIND: SettlementKind;
    fn processor_id(&self) -> &str;
    fn money(&self) -> Money;
    fn status(&self) -> ProcessorChargeStatus;
}

impl Booked for ProcessorCharge {
    fn book(state: &mut State) -> &mut Book<Self> {
        &mut state.charges
    }
}

impl Kept for ProcessorCharge {
    const KIND: SettlementKind = SettlementKind::Charge;

    fn processor_id(&self) -> &str {
        &self.id
    }

    fn money(&self) -> Money {
        self.money
    }

    fn status(&self) -> ProcessorChargeStatus {
        self.status
    }
}

impl Booked for ProcessorRefund {
    fn book(state: &mut State) -> &mut Book<Self> {
        &mut state.refunds
    }
}

impl Kept for ProcessorRefund {
    const KIND: SettlementKind = SettlementKind::Refund;

    fn processor_id(&self) -> &str {
        &self.id
    }

    fn money(&self) -> Money {
        self.money
    }

    fn status(&self) -> ProcessorChargeStatus {
        self.status
    }
}

impl Booked for ProcessorPayout {
    fn book(state: &mut State) -> &mut Book<Self> {
        &mut state.payouts
    }
}

impl Kept for ProcessorPayout {
    const KIND: SettlementKind = SettlementKind::Payout;

    fn processor_id(&self) -> &str {
        &self.id
    }

    fn money(&self) -> Money {
        self.money
    }

    fn status(&self) -> ProcessorChargeStatus {
        self.status
    }
}

impl Booked for ProcessorCapture {
    fn book(state: &mut State) -> &mut Book<Self> {
        &mut state.captures
    }
}

impl Kept for ProcessorCapture {
    const KIND: SettlementKind = SettlementKind::Capture;

    fn processor_id(&self) -> &str {
        &self.id
    }

    fn money(&self) -> Money {
        self.money
    }

    /// A capture the processor made has taken its money.
    fn status(&self) -> ProcessorChargeStatus {
        ProcessorChargeStatus::Succeeded
    }
}

impl Booked for ProcessorVoid {
    fn book(state: &mut State) -> &mut Book<Self> {
        &mut state.voids
    }
}

impl Kept for ProcessorVoid {
    const KIND: SettlementKind = SettlementKind::Void;

    fn processor_id(&self) -> &str {
        &self.id
    }

    fn money(&self) -> Money {
        self.money
    }

    /// A void the processor made has released its hold.
    fn status(&self) -> ProcessorChargeStatus {
        ProcessorChargeStatus::Succeeded
    }
}
