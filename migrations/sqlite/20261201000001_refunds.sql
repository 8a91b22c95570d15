-- Refunds: the same tables, columns, constraint names and guarantees as the PostgreSQL
-- migration of the same name, in SQLite's terms.

-- What a charge has given back, and what its refunds have claimed: a refund reserves its
-- amount before it reaches the processor, so refunds under different keys can never together
-- exceed the charge. A reservation is released only when its refund has definitively failed.
ALTER TABLE charges ADD COLUMN amount_refunded INTEGER NOT NULL DEFAULT 0
    CHECK (amount_refunded >= 0);
ALTER TABLE charges ADD COLUMN amount_reserved INTEGER NOT NULL DEFAULT 0
    CONSTRAINT charges_refunds_within_amount
        CHECK (amount_reserved BETWEEN amount_refunded AND amount);

-- One row per refund, with the id of the idempotency record's generation. A pending row is
-- the refund's reservation on its charge; it becomes succeeded in the transaction that posts
-- the refund, or is deleted with its reservation when the refund definitively fails.
CREATE TABLE refunds (
    id                  BLOB    PRIMARY KEY CHECK (length(id) = 16),
    tenant_id           TEXT    NOT NULL,
    charge_id           BLOB    NOT NULL REFERENCES charges (id),
    amount              INTEGER NOT NULL CHECK (amount > 0),
    currency            TEXT    NOT NULL CHECK (currency GLOB '[A-Z][A-Z][A-Z]'),
    reason              TEXT    CHECK (reason IN ('requested_by_customer', 'duplicate', 'fraudulent')),
    status              TEXT    NOT NULL CHECK (status IN ('pending', 'succeeded')),
    processor_refund_id TEXT,
    created_at          TEXT    NOT NULL,
    -- One processor refund is recorded once.
    CONSTRAINT refunds_processor_refund_unique UNIQUE (processor_refund_id),
    CONSTRAINT succeeded_has_processor_refund
        CHECK ((status = 'succeeded') = (processor_refund_id IS NOT NULL))
) STRICT;

-- A charge's refunds, newest first, with the id as a tie-breaker for keyset pagination.
CREATE INDEX refunds_charge_created ON refunds (charge_id, created_at DESC, id DESC);

-- A ledger transaction now posts a charge or one of its refunds: every transaction names its
-- charge, a refund's also names the refund. SQLite cannot drop a table constraint, so the
-- table is rebuilt: its rows are kept aside, the table and its triggers are created anew, and
-- the rows go back. The entries' foreign key is deferred, so it is checked only at commit,
-- when every transaction row is back.
CREATE TEMPORARY TABLE ledger_transactions_before AS SELECT * FROM ledger_transactions;
DROP TRIGGER ledger_entries_sealed_insert;
DROP TABLE ledger_transactions;

CREATE TABLE ledger_transactions (
    id         BLOB NOT NULL PRIMARY KEY CHECK (length(id) = 16),
    tenant_id  TEXT NOT NULL,
    charge_id  BLOB NOT NULL REFERENCES charges (id),
    refund_id  BLOB REFERENCES refunds (id),
    created_at TEXT NOT NULL,
    -- A refund is posted exactly once.
    CONSTRAINT ledger_transactions_refund_unique UNIQUE (refund_id)
) STRICT;

-- A charge is posted exactly once.
CREATE UNIQUE INDEX ledger_transactions_charge_unique ON ledger_transactions (charge_id)
    WHERE refund_id IS NULL;

INSERT INTO ledger_transactions (id, tenant_id, charge_id, created_at)
    SELECT id, tenant_id, charge_id, created_at FROM ledger_transactions_before;
DROP TABLE ledger_transactions_before;

-- The triggers of the initial migration, unchanged.
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
