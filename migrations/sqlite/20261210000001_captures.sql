-- Authorise now, capture later: PostgreSQL's migration of the same name says what the columns
-- mean. SQLite adds a column at a time, each with its own check (a column's check may read
-- the row's other columns).
ALTER TABLE charges ADD COLUMN capture_status TEXT
    CHECK (capture_status IN ('requires_capture', 'captured', 'canceled'));
ALTER TABLE charges ADD COLUMN capture_before TEXT
    CHECK ((capture_status IS NULL) = (capture_before IS NULL));
-- Its check also keeps refunds within what was captured (PostgreSQL's
-- `charges_refunds_within_captured`): SQLite checks every check of a row it writes.
ALTER TABLE charges ADD COLUMN amount_captured INTEGER
    CHECK ((coalesce(capture_status, '') = 'captured') = (amount_captured IS NOT NULL)
           AND (amount_captured IS NULL OR amount_captured BETWEEN 1 AND amount)
           AND amount_reserved <= CASE WHEN capture_status IS NULL THEN amount
                                       ELSE coalesce(amount_captured, 0) END);
ALTER TABLE charges ADD COLUMN hold_claimed_by BLOB
    CHECK (hold_claimed_by IS NULL OR capture_status IS NOT NULL);
ALTER TABLE charges ADD COLUMN hold_claimed_for TEXT
    CHECK ((hold_claimed_by IS NULL) = (hold_claimed_for IS NULL)
           AND (hold_claimed_for IS NULL OR hold_claimed_for IN ('capture', 'cancel')));
ALTER TABLE charges ADD COLUMN cancellation_reason TEXT
    CHECK (cancellation_reason IS NULL
           OR (cancellation_reason IN
               ('duplicate', 'fraudulent', 'requested_by_customer', 'abandoned', 'expired')
               AND coalesce(capture_status, '') = 'canceled'));

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
