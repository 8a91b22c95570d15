-- Gives tenant acme a history: :charges more charges of 1.00 USD, each with its ledger
-- transaction (receivable debited, customer_payments credited), shaped as the service posts
-- them, without records or events, which no refund reads. Then it vacuums and analyzes the
-- ledger, so that autovacuum does not run during the measurement.
--
--   psql -v charges=100000 -v run=1 -f ledger-history.sql

\set ON_ERROR_STOP on

BEGIN;
CREATE TEMPORARY TABLE history ON COMMIT DROP AS
SELECT gen_random_uuid() AS charge_id, gen_random_uuid() AS transaction_id,
       'sim_history_' || :'run' || '_' || n AS processor_charge_id
FROM generate_series(1, :charges) AS n;

INSERT INTO charges
    (id, tenant_id, amount, currency, source, description, status, processor_charge_id, created_at)
SELECT charge_id, 'acme', 100, 'USD', 'tok_visa', NULL, 'succeeded', processor_charge_id,
       now() - interval '1 day'
FROM history;

INSERT INTO ledger_transactions (id, tenant_id, charge_id)
SELECT transaction_id, 'acme', charge_id FROM history;

INSERT INTO ledger_entries (transaction_id, line, tenant_id, account, currency, amount)
SELECT transaction_id, e.line, 'acme', e.account, 'USD', e.amount
FROM history,
     (VALUES (1, 'processor_receivable', 100), (2, 'customer_payments', -100))
         AS e(line, account, amount);
COMMIT;

VACUUM (ANALYZE) charges, ledger_transactions, ledger_entries;
