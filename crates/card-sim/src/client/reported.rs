//! What the processor reported, read into domain types: never copied from the request, and
//! never guessed. A field this side cannot read makes the whole answer `Unavailable`.

use payments_domain::{
    Amount, CancelOutcome, Currency, CurrencyError, Money, ProcessorCapture, ProcessorCharge,
    ProcessorChargeStatus, ProcessorError, ProcessorPayout, ProcessorRefund, ProcessorVoid,
};

use super::unavailable;
use crate::wire::{
    CAPTURE_OBJECT, CaptureView, ChargeView, PAYOUT_OBJECT, PayoutView, REFUND_OBJECT, RefundView,
    VOID_OBJECT, VoidView,
};

/// A charge as the processor reported it, with its own amount, currency and status: the
/// caller decides whether it is the charge it asked for. A field this side cannot read is
/// `Unavailable`, never a guess.
pub(super) fn reported_charge(view: ChargeView) -> Result<ProcessorCharge, ProcessorError> {
    Ok(ProcessorCharge {
        money: reported_money(view.amount, &view.currency)?,
        status: reported_status(&view.id, &view.status)?,
        id: view.id,
    })
}

/// A refund as the processor reported it, with its own charge, amount, currency and status,
/// never copied from the request; a body that is not a refund is `Unavailable`.
pub(super) fn reported_refund(view: RefundView) -> Result<ProcessorRefund, ProcessorError> {
    reported_object(&view.id, &view.object, REFUND_OBJECT)?;
    Ok(ProcessorRefund {
        money: reported_money(view.amount, &view.currency)?,
        status: reported_status(&view.id, &view.status)?,
        id: view.id,
        processor_charge_id: view.charge,
    })
}

/// A capture as the processor reported it, with its own authorisation, amount and currency,
/// never copied from the request; a body that is not a capture is `Unavailable`.
pub(super) fn reported_capture(view: CaptureView) -> Result<ProcessorCapture, ProcessorError> {
    reported_object(&view.id, &view.object, CAPTURE_OBJECT)?;
    Ok(ProcessorCapture {
        money: reported_money(view.amount, &view.currency)?,
        id: view.id,
        processor_charge_id: view.charge,
    })
}

/// A void as the processor reported it, with its own authorisation and what it released, never
/// copied from the request; a body that is not a void is `Unavailable`.
pub(super) fn reported_void(view: VoidView) -> Result<ProcessorVoid, ProcessorError> {
    reported_object(&view.id, &view.object, VOID_OBJECT)?;
    Ok(ProcessorVoid {
        money: reported_money(view.amount, &view.currency)?,
        id: view.id,
        processor_charge_id: view.charge,
    })
}

/// A payout as the processor reported it, with its own destination, amount, currency and
/// status, never copied from the request; a body that is not a payout is `Unavailable`.
pub(super) fn reported_payout(view: PayoutView) -> Result<ProcessorPayout, ProcessorError> {
    reported_object(&view.id, &view.object, PAYOUT_OBJECT)?;
    Ok(ProcessorPayout {
        money: reported_money(view.amount, &view.currency)?,
        status: reported_status(&view.id, &view.status)?,
        id: view.id,
        destination: view.destination,
    })
}

/// Refuses a body whose `object` is not `expected`: it is not what was asked for.
fn reported_object(id: &str, object: &str, expected: &str) -> Result<(), ProcessorError> {
    if object == expected {
        return Ok(());
    }
    Err(unavailable(format!(
        "{id} is a {object:?}, not a {expected}"
    )))
}

fn reported_money(amount: i64, currency: &str) -> Result<Money, ProcessorError> {
    let amount = Amount::new(amount).map_err(|e| unavailable(e.to_string()))?;
    let currency: Currency = currency
        .parse()
        .map_err(|e: CurrencyError| unavailable(e.to_string()))?;
    Ok(Money::new(amount, currency))
}

fn reported_status(id: &str, status: &str) -> Result<ProcessorChargeStatus, ProcessorError> {
    ProcessorChargeStatus::parse(status)
        .ok_or_else(|| unavailable(format!("{id} has unknown status {status:?}")))
}

/// A cancel's answer with what exists under the key read by `read`.
pub(super) fn reported<V, T>(
    outcome: CancelOutcome<V>,
    read: impl FnOnce(V) -> Result<T, ProcessorError>,
) -> Result<CancelOutcome<T>, ProcessorError> {
    match outcome {
        CancelOutcome::Exists(view) => read(view).map(CancelOutcome::Exists),
        CancelOutcome::StillProcessing => Ok(CancelOutcome::StillProcessing),
        CancelOutcome::Canceled => Ok(CancelOutcome::Canceled),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Metadata;

    fn view(amount: i64, currency: &str, status: &str) -> ChargeView {
        ChargeView {
            id: "ch_1".into(),
            amount,
            currency: currency.into(),
            status: status.into(),
            created: 0,
            metadata: Metadata::default(),
        }
    }

    #[test]
    fn a_charge_is_read_as_reported_and_never_guessed() {
        let pending = reported_charge(view(2000, "EUR", "pending"));
        assert_eq!(
            pending,
            Ok(ProcessorCharge {
                id: "ch_1".into(),
                money: Money::new(
                    Amount::new(2000).unwrap_or_else(|e| panic!("{e}")),
                    Currency::Eur
                ),
                status: ProcessorChargeStatus::Pending,
            })
        );
        for unreadable in [
            view(2000, "EUR", "refunded"),
            view(0, "EUR", "succeeded"),
            view(2000, "XXX", "succeeded"),
        ] {
            let result = reported_charge(unreadable);
            assert!(
                matches!(result, Err(ProcessorError::Unavailable { .. })),
                "{result:?}"
            );
        }
    }

    fn refund_view(object: &str, amount: i64, currency: &str, status: &str) -> RefundView {
        RefundView {
            id: "re_1".into(),
            object: object.into(),
            charge: "ch_9".into(),
            amount,
            currency: currency.into(),
            status: status.into(),
            created: 0,
            metadata: Metadata::default(),
        }
    }

    #[test]
    fn a_refund_is_read_as_reported_with_its_own_charge_and_never_guessed() {
        let reported = reported_refund(refund_view("refund", 500, "EUR", "pending"));
        let expected = ProcessorRefund {
            id: "re_1".into(),
            processor_charge_id: "ch_9".into(),
            money: Money::new(
                Amount::new(500).unwrap_or_else(|e| panic!("{e}")),
                Currency::Eur,
            ),
            status: ProcessorChargeStatus::Pending,
        };
        assert_eq!(reported, Ok(expected));

        let unreadable = [
            refund_view("charge", 500, "EUR", "succeeded"),
            refund_view("refund", 500, "EUR", "reversed"),
            refund_view("refund", -5, "EUR", "succeeded"),
            refund_view("refund", 500, "eur?", "succeeded"),
        ];
        for view in unreadable {
            let result = reported_refund(view);
            assert!(
                matches!(result, Err(ProcessorError::Unavailable { .. })),
                "{result:?}"
            );
        }
    }
}
