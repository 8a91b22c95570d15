-- The ledger's balances, kept as the ledger is written, so that reading a tenant's balance
-- costs the same at its millionth charge as at its first: every reservation reads the tenant's
-- funds under its balance lock, and summing every entry of its history there made each
-- refund and payout slower as the tenant grew, and all of them wait for each other.
--
-- A balance is kept in parts: charges take no lock, and one row per tenant would make every
-- finish of a tenant wait for the commit of the one before it. Each transaction adds to the
-- part its transaction id picks, so two concurrent finishes of one tenant meet on one row once
-- in 64; a balance is the sum of its parts, at most 64 rows. Each statement adds its rows in
-- one order (tenant, account, currency), so two statements never wait for each other in a
-- circle.
--
-- The database keeps the parts, by statement triggers on `ledger_entries`, not the statements
-- that post: whatever writes an entry (every build of a fleet mid-deploy, a repair by hand)
-- moves its balance with it, in its own transaction. A statement trigger adds a statement's
-- entries in one upsert per balance (a batch of charges of one tenant is one, not one per
-- charge).
CREATE TABLE ledger_balances (
    tenant_id text    NOT NULL,
    account   text    NOT NULL,
    currency  text    NOT NULL,
    part      integer NOT NULL CHECK (part BETWEEN 0 AND 63),
    amount    bigint  NOT NULL,
    PRIMARY KEY (tenant_id, account, currency, part)
);

-- Moves the balances of a statement's entries (the transition table `entries`) by their sum
-- times the trigger's argument: 1 for the entries a statement added, -1 for those it removed.
CREATE FUNCTION ledger_balances_move() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger_balances (tenant_id, account, currency, part, amount)
    SELECT tenant_id, account, currency, txid_current() % 64,
           CAST(TG_ARGV[0] AS bigint) * sum(amount)
    FROM entries
    GROUP BY tenant_id, account, currency
    ORDER BY tenant_id, account, currency
    ON CONFLICT (tenant_id, account, currency, part)
    DO UPDATE SET amount = ledger_balances.amount + excluded.amount;
    RETURN NULL;
END;
$$;

-- A trigger with transition tables answers one kind of event, so an update is a removal of
-- the old rows and an addition of the new ones.
CREATE TRIGGER ledger_balances_inserted
    AFTER INSERT ON ledger_entries REFERENCING NEW TABLE AS entries
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_balances_move('1');
CREATE TRIGGER ledger_balances_updated_to
    AFTER UPDATE ON ledger_entries REFERENCING NEW TABLE AS entries
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_balances_move('1');
CREATE TRIGGER ledger_balances_updated_from
    AFTER UPDATE ON ledger_entries REFERENCING OLD TABLE AS entries
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_balances_move('-1');
CREATE TRIGGER ledger_balances_deleted
    AFTER DELETE ON ledger_entries REFERENCING OLD TABLE AS entries
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_balances_move('-1');

-- The entries already there, summed once. Creating the triggers above locked `ledger_entries`
-- against writes until this migration commits, so every entry is counted exactly once: before
-- the lock here, or after it by a trigger.
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
