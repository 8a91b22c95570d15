-- Payouts.

-- One row per payout, with the id of the idempotency record's generation. A pending row is
-- the payout's reservation on the tenant's balance; it becomes paid in the transaction that
-- posts the payout, or is deleted when the payout is definitively not made.
CREATE TABLE payouts (
    id                  uuid        PRIMARY KEY,
    tenant_id           text        NOT NULL,
    amount              bigint      NOT NULL CHECK (amount > 0),
    currency            text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    destination         text        NOT NULL CHECK (destination ~ '^ba_[A-Za-z0-9_]+$'),
    description         text,
    status              text        NOT NULL CHECK (status IN ('pending', 'paid')),
    processor_payout_id text,
    created_at          timestamptz NOT NULL,
    -- One processor payout is recorded once.
    CONSTRAINT payouts_processor_payout_unique UNIQUE (processor_payout_id),
    CONSTRAINT paid_has_processor_payout
        CHECK ((status = 'paid') = (processor_payout_id IS NOT NULL))
);

-- A tenant's payouts, newest first, with the id as a tie-breaker for keyset pagination; and
-- the amounts its payouts in flight hold.
CREATE INDEX payouts_tenant_created ON payouts (tenant_id, created_at DESC, id DESC);
CREATE INDEX payouts_pending ON payouts (tenant_id, currency) WHERE status = 'pending';
-- The amounts refunds in flight hold, per tenant.
CREATE INDEX refunds_pending ON refunds (tenant_id, currency) WHERE status = 'pending';

-- One row per tenant and currency that has ever reserved money: payouts and refunds lock it,
-- so that the balance of one tenant is judged by one reservation at a time.
CREATE TABLE balance_locks (
    tenant_id text NOT NULL,
    currency  text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    PRIMARY KEY (tenant_id, currency)
);

-- A ledger transaction now posts a charge, one of its refunds, or a payout.
ALTER TABLE ledger_transactions
    ALTER COLUMN charge_id DROP NOT NULL,
    ADD COLUMN payout_id uuid REFERENCES payouts (id),
    -- A payout is posted exactly once.
    ADD CONSTRAINT ledger_transactions_payout_unique UNIQUE (payout_id),
    ADD CONSTRAINT ledger_transactions_posts_one
        CHECK ((charge_id IS NULL) = (payout_id IS NOT NULL)
               AND (refund_id IS NULL OR charge_id IS NOT NULL));

-- A paid payout moves its amount from the tenant's balance to the money on its way out.
ALTER TABLE ledger_entries
    DROP CONSTRAINT ledger_entries_account_check,
    ADD CONSTRAINT ledger_entries_account_check
        CHECK (account IN ('processor_receivable', 'customer_payments', 'payouts_in_transit'));
