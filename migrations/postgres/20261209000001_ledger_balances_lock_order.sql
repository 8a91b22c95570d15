-- A statement's trigger takes its balances' rows in the order of their bytes: by tenant, then
-- currency, then account. A transaction of several postings (a batch of refunds or of payouts)
-- writes them in that order too, by tenant and then currency, so every transaction takes the
-- ledger's balances in one order and none waits for another in a circle. The trigger took them
-- in the database collation's order of tenant, account and currency, and a collation may order
-- tenants unlike their bytes (under `en_US`, `acme` comes before `Beta`).
CREATE OR REPLACE FUNCTION ledger_balances_move() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger_balances (tenant_id, account, currency, part, amount)
    SELECT tenant_id, account, currency, txid_current() % 64,
           CAST(TG_ARGV[0] AS bigint) * sum(amount)
    FROM entries
    GROUP BY tenant_id, account, currency
    ORDER BY tenant_id COLLATE "C", currency COLLATE "C", account COLLATE "C"
    ON CONFLICT (tenant_id, account, currency, part)
    DO UPDATE SET amount = ledger_balances.amount + excluded.amount;
    RETURN NULL;
END;
$$;
