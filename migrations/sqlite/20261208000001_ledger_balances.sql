-- The ledger's balances, kept as the ledger is written: the same table, rows and view as the
-- PostgreSQL migration of the same name, whose comments give the reasons. SQLite has one
-- writer at a time, so every balance is kept in one part (0), by row triggers (SQLite has no
-- statement triggers); its entries are never updated (`ledger_entries_sealed_update`).
CREATE TABLE ledger_balances (
    tenant_id TEXT    NOT NULL,
    account   TEXT    NOT NULL,
    currency  TEXT    NOT NULL,
    part      INTEGER NOT NULL CHECK (part BETWEEN 0 AND 63),
    amount    INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, account, currency, part)
) STRICT;

CREATE TRIGGER ledger_balances_inserted
    AFTER INSERT ON ledger_entries
BEGIN
    INSERT INTO ledger_balances (tenant_id, account, currency, part, amount)
    VALUES (NEW.tenant_id, NEW.account, NEW.currency, 0, NEW.amount)
    ON CONFLICT (tenant_id, account, currency, part)
    DO UPDATE SET amount = amount + excluded.amount;
END;

CREATE TRIGGER ledger_balances_deleted
    AFTER DELETE ON ledger_entries
BEGIN
    INSERT INTO ledger_balances (tenant_id, account, currency, part, amount)
    VALUES (OLD.tenant_id, OLD.account, OLD.currency, 0, -OLD.amount)
    ON CONFLICT (tenant_id, account, currency, part)
    DO UPDATE SET amount = amount + excluded.amount;
END;

-- The entries already there, summed once, inside this migration's write transaction.
INSERT INTO ledger_balances (tenant_id, account, currency, part, amount)
SELECT tenant_id, account, currency, 0, sum(amount)
FROM ledger_entries
GROUP BY tenant_id, account, currency;

-- Nothing reads the entries by tenant any more: the balances were what their index was for.
DROP INDEX ledger_entries_balances;

-- The funds read the ledger's balances instead of its entries.
DROP VIEW funds;
CREATE VIEW funds (tenant_id, currency, available, pending) AS
SELECT tenant_id, currency, -amount, 0 FROM ledger_balances WHERE account = 'customer_payments'
UNION ALL
SELECT tenant_id, currency, -amount, 0 FROM refunds WHERE status = 'pending'
UNION ALL
SELECT tenant_id, currency, -amount, amount FROM payouts WHERE status = 'pending';
