-- Authorise now, capture later. A charge made with `"capture": false` is a hold on the card:
-- its row exists from the authorisation, with `capture_status` 'requires_capture' until one
-- capture ('captured', with what it took) or one cancel ('canceled', with why). A charge
-- captured when it was made, every charge before this migration among them, has none of these
-- columns set: its money was all taken at once. `status` stays what the processor's charge
-- call came to, which is always 'succeeded' for a recorded charge.
--
-- One capture or one cancel may be at work on a hold at a time: the first to prepare claims
-- it for its record's generation (`hold_claimed_by`, for `hold_claimed_for`), and every other
-- capture or cancel under another key is refused while the claim stands. The claim is the
-- generation's for good once its effect may exist (the engine prepares every attempt of a
-- generation again, and must find what the first prepared), and is released only when the
-- generation ends without one.
--
-- A hold is not posted to the ledger: it is no one's money yet. Its capture posts what it took
-- as a charge captured at once posts its amount (one ledger transaction per charge, as ever),
-- and a cancel posts nothing. What a tenant has held is read from these rows.
ALTER TABLE charges
    ADD COLUMN capture_status text
        CHECK (capture_status IN ('requires_capture', 'captured', 'canceled')),
    ADD COLUMN capture_before timestamptz,
    ADD COLUMN amount_captured bigint,
    ADD COLUMN hold_claimed_by uuid,
    ADD COLUMN hold_claimed_for text CHECK (hold_claimed_for IN ('capture', 'cancel')),
    ADD COLUMN cancellation_reason text
        CHECK (cancellation_reason IN
               ('duplicate', 'fraudulent', 'requested_by_customer', 'abandoned', 'expired')),
    ADD CONSTRAINT charges_held_until
        CHECK ((capture_status IS NULL) = (capture_before IS NULL)),
    ADD CONSTRAINT charges_captured_within_amount
        CHECK ((coalesce(capture_status, '') = 'captured') = (amount_captured IS NOT NULL)
               AND (amount_captured IS NULL OR amount_captured BETWEEN 1 AND amount)),
    ADD CONSTRAINT charges_hold_claimed
        CHECK ((hold_claimed_by IS NULL) = (hold_claimed_for IS NULL)
               AND (hold_claimed_by IS NULL OR capture_status IS NOT NULL)),
    -- Refunds reserve on what was captured, never on what is held: a build that knows no
    -- holds (a fleet mid-deploy) reserving on a hold's amount is refused here.
    ADD CONSTRAINT charges_refunds_within_captured
        CHECK (amount_reserved <= CASE WHEN capture_status IS NULL THEN amount
                                       ELSE coalesce(amount_captured, 0) END),
    ADD CONSTRAINT charges_canceled_with_reason
        CHECK (cancellation_reason IS NULL OR coalesce(capture_status, '') = 'canceled');

-- (A check whose expression is NULL passes: `coalesce` makes a charge captured at once compare
-- as '' rather than as NULL.)

-- The holds past their time, for the expiry worker; and a tenant's holds, for its balance.
CREATE INDEX charges_held_expiry ON charges (capture_before)
    WHERE capture_status = 'requires_capture';
CREATE INDEX charges_held_by_tenant ON charges (tenant_id, currency)
    WHERE capture_status = 'requires_capture';

-- The funds gain a part: what a tenant's holds have on cards (`authorized`), never available and
-- never pending, so no reservation can draw on it.
DROP VIEW funds;
CREATE VIEW funds (tenant_id, currency, available, pending, authorized) AS
SELECT tenant_id, currency, -amount, 0, 0 FROM ledger_balances WHERE account = 'customer_payments'
UNION ALL
SELECT tenant_id, currency, -amount, 0, 0 FROM refunds WHERE status = 'pending'
UNION ALL
SELECT tenant_id, currency, -amount, amount, 0 FROM payouts WHERE status = 'pending'
UNION ALL
SELECT tenant_id, currency, 0, 0, amount FROM charges WHERE capture_status = 'requires_capture';
