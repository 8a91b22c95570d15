-- What ended a hold, as the processor made it: the capture's id or the void's, and when the
-- hold ended, so that reconciliation matches the processor's report of each capture and void
-- as it matches a charge. A hold ended before this migration has neither id: nothing recorded
-- it, and a report of its capture or void that a run reads is an exception to accept.
ALTER TABLE charges
    ADD COLUMN processor_capture_id text,
    ADD COLUMN processor_void_id text,
    ADD COLUMN hold_ended_at timestamptz,
    ADD CONSTRAINT charges_captured_by_processor
        CHECK (processor_capture_id IS NULL OR coalesce(capture_status, '') = 'captured'),
    ADD CONSTRAINT charges_voided_by_processor
        CHECK (processor_void_id IS NULL OR coalesce(capture_status, '') = 'canceled'),
    ADD CONSTRAINT charges_hold_ended
        CHECK ((hold_ended_at IS NULL) = (processor_capture_id IS NULL AND processor_void_id IS NULL));

-- One processor capture or void ends one hold, and is found by its id.
CREATE UNIQUE INDEX charges_processor_capture_unique ON charges (processor_capture_id)
    WHERE processor_capture_id IS NOT NULL;
CREATE UNIQUE INDEX charges_processor_void_unique ON charges (processor_void_id)
    WHERE processor_void_id IS NOT NULL;
-- A run reads the holds ended on a day (and the days beside it).
CREATE INDEX charges_hold_ended_at ON charges (hold_ended_at) WHERE hold_ended_at IS NOT NULL;

-- An exception may be of a capture or a void.
ALTER TABLE reconciliation_exceptions
    DROP CONSTRAINT reconciliation_exceptions_effect_check,
    ADD CONSTRAINT reconciliation_exceptions_effect_check
        CHECK (effect IN ('charge', 'refund', 'payout', 'capture', 'void'));

-- The books gain what ended each hold: a capture of what it took, a void of what it released
-- (all the hold), each under the processor's id of it and at the time the hold ended. The hold
-- itself stays a `charge` of what it held, as the processor reports its authorisation.
DROP VIEW books;
CREATE VIEW books (kind, id, tenant_id, processor_id, amount, currency, created_at) AS
SELECT 'charge', id, tenant_id, processor_charge_id, amount, currency, created_at
FROM charges
UNION ALL
SELECT 'capture', id, tenant_id, processor_capture_id, amount_captured, currency, hold_ended_at
FROM charges WHERE processor_capture_id IS NOT NULL
UNION ALL
SELECT 'void', id, tenant_id, processor_void_id, amount, currency, hold_ended_at
FROM charges WHERE processor_void_id IS NOT NULL
UNION ALL
SELECT 'refund', id, tenant_id, processor_refund_id, amount, currency, created_at
FROM refunds WHERE status = 'succeeded'
UNION ALL
SELECT 'payout', id, tenant_id, processor_payout_id, amount, currency, created_at
FROM payouts WHERE status = 'paid'
UNION ALL
SELECT 'refund', exception_id, COALESCE(void_tenant_id, ''), void_processor_id, void_amount,
       void_currency, resolved_at
FROM reconciliation_resolutions WHERE void_processor_id IS NOT NULL;
