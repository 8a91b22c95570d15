-- Two views over the effects' tables, so that what reads across every kind of effect names no
-- table of one: an effect added later replaces them (DROP VIEW, then CREATE VIEW) with its own
-- rows added, and its storage is the only code that knows its table.

-- The books as reconciliation reads them: what the processor made that the ledger holds
-- (every charge, every succeeded refund, every paid payout) and what operators' voids gave
-- back (a void is kept in its resolution, so that the processor's report of it matches), each
-- under the processor's id of it. Reads filter on `created_at`, or on `kind` and
-- `processor_id`: both backends take the filter into each branch, onto its table's index.
-- A later migration that rebuilds one of these tables drops the views first: SQLite checks
-- every view when a table is renamed.
CREATE VIEW books (kind, id, tenant_id, processor_id, amount, currency, created_at) AS
SELECT 'charge', id, tenant_id, processor_charge_id, amount, currency, created_at
FROM charges
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

-- What a tenant's money is made of, a row per part: what the ledger holds for it
-- (`customer_payments`), less what pending refunds and payouts reserve; what pending payouts
-- hold is also `pending`. A tenant's funds in a currency are the sums of its rows, never a
-- stored counter.
CREATE VIEW funds (tenant_id, currency, available, pending) AS
SELECT tenant_id, currency, -amount, 0 FROM ledger_entries WHERE account = 'customer_payments'
UNION ALL
SELECT tenant_id, currency, -amount, 0 FROM refunds WHERE status = 'pending'
UNION ALL
SELECT tenant_id, currency, -amount, amount FROM payouts WHERE status = 'pending';
