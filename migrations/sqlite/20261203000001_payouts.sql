-- Payouts: the same tables, columns, constraint names and guarantees as the PostgreSQL
-- migration of the same name, in SQLite's terms.

-- One row per payout, with the id of the idempotency record's generation. A pending row is
-- the payout's reservation on the tenant's balance; it becomes paid in the transaction that
-- posts the payout, or is deleted when the payout is definitively not made.
CREATE TABLE payouts (
    id                  BLOB    PRIMARY KEY CHECK (length(id) = 16),
    tenant_id           TEXT    NOT NULL,
    amount              INTEGER NOT NULL CHECK (amount > 0),
    currency            TEXT    NOT NULL CHECK (currency GLOB '[A-Z][A-Z][A-Z]'),
    destination         TEXT    NOT NULL
        CHECK (destination GLOB 'ba_?*' AND NOT substr(destination, 4) GLOB '*[^A-Za-z0-9_]*'),
    description         TEXT,
    status              TEXT    NOT NULL CHECK (status IN ('pending', 'paid')),
    processor_payout_id TEXT,
    created_at          TEXT    NOT NULL,
    -- One processor payout is recorded once.
    CONSTRAINT payouts_processor_payout_unique UNIQUE (processor_payout_id),
    CONSTRAINT paid_has_processor_payout
        CHECK ((status = 'paid') = (processor_payout_id IS NOT NULL))
) STRICT;

-- A tenant's payouts, newest first, with the id as a tie-breaker for keyset pagination; and
-- the amounts its payouts in flight hold.
CREATE INDEX payouts_tenant_created ON payouts (tenant_id, created_at DESC, id DESC);
CREATE INDEX payouts_pending ON payouts (tenant_id, currency) WHERE status = 'pending';
-- The amounts refunds in flight hold, per tenant.
CREATE INDEX refunds_pending ON refunds (tenant_id, currency) WHERE status = 'pending';

-- One row per tenant and currency that has ever reserved money: payouts and refunds write it,
-- so that the balance of one tenant is judged by one reservation at a time (on SQLite the
-- write lock already does that; the row keeps the statements the same as PostgreSQL's).
CREATE TABLE balance_locks (
    tenant_id TEXT NOT NULL,
    currency  TEXT NOT NULL CHECK (currency GLOB '[A-Z][A-Z][A-Z]'),
    PRIMARY KEY (tenant_id, currency)
) STRICT;

-- A ledger transaction now posts a charge, one of its refunds, or a payout, and a paid payout
-- moves its amount from the tenant's balance to the money on its way out. SQLite can change
-- neither a column's NOT NULL nor a CHECK in place, so both ledger tables are rebuilt: their
-- rows are kept aside, the tables are created anew, the rows go back, and then the triggers
-- of the earlier migrations are created again, unchanged.
CREATE TEMPORARY TABLE ledger_entries_before AS SELECT * FROM ledger_entries;
CREATE TEMPORARY TABLE ledger_transactions_before AS SELECT * FROM ledger_transactions;
DROP TABLE ledger_entries;
DROP TABLE ledger_transactions;

CREATE TABLE ledger_transactions (
    id         BLOB NOT NULL PRIMARY KEY CHECK (length(id) = 16),
    tenant_id  TEXT NOT NULL,
    charge_id  BLOB REFERENCES charges (id),
    refund_id  BLOB REFERENCES refunds (id),
    payout_id  BLOB REFERENCES payouts (id),
    created_at TEXT NOT NULL,
    -- A refund is posted exactly once.
    CONSTRAINT ledger_transactions_refund_unique UNIQUE (refund_id),
    -- A payout is posted exactly once.
    CONSTRAINT ledger_transactions_payout_unique UNIQUE (payout_id),
    CONSTRAINT ledger_transactions_posts_one
        CHECK ((charge_id IS NULL) = (payout_id IS NOT NULL)
               AND (refund_id IS NULL OR charge_id IS NOT NULL))
) STRICT;

-- A charge is posted exactly once.
CREATE UNIQUE INDEX ledger_transactions_charge_unique ON ledger_transactions (charge_id)
    WHERE refund_id IS NULL;

CREATE TABLE ledger_entries (
    transaction_id BLOB    NOT NULL
        REFERENCES ledger_transactions (id) DEFERRABLE INITIALLY DEFERRED,
    line           INTEGER NOT NULL,
    tenant_id      TEXT    NOT NULL,
    account        TEXT    NOT NULL
        CHECK (account IN ('processor_receivable', 'customer_payments', 'payouts_in_transit')),
    currency       TEXT    NOT NULL CHECK (currency GLOB '[A-Z][A-Z][A-Z]'),
    -- Debits positive, credits negative, never zero.
    amount         INTEGER NOT NULL CHECK (amount <> 0),
    PRIMARY KEY (transaction_id, line)
) STRICT;

CREATE INDEX ledger_entries_balances ON ledger_entries (tenant_id, account, currency);

INSERT INTO ledger_entries SELECT * FROM ledger_entries_before;
INSERT INTO ledger_transactions (id, tenant_id, charge_id, refund_id, created_at)
    SELECT id, tenant_id, charge_id, refund_id, created_at FROM ledger_transactions_before;
DROP TABLE ledger_entries_before;
DROP TABLE ledger_transactions_before;

CREATE TRIGGER ledger_entries_balanced
    AFTER INSERT ON ledger_transactions
    WHEN NOT EXISTS (SELECT 1 FROM ledger_entries WHERE transaction_id = NEW.id)
      OR EXISTS (
          SELECT 1 FROM ledger_entries
          WHERE transaction_id = NEW.id
          GROUP BY currency
          HAVING sum(amount) <> 0)
BEGIN
    SELECT RAISE(ABORT, 'ledger_entries_balanced');
END;

CREATE TRIGGER ledger_entries_sealed_insert
    BEFORE INSERT ON ledger_entries
    WHEN EXISTS (SELECT 1 FROM ledger_transactions WHERE id = NEW.transaction_id)
BEGIN
    SELECT RAISE(ABORT, 'ledger_entries_balanced');
END;

CREATE TRIGGER ledger_entries_sealed_update
    BEFORE UPDATE ON ledger_entries
BEGIN
    SELECT RAISE(ABORT, 'ledger_entries_balanced');
END;
