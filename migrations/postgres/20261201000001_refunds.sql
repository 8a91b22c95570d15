-- Refunds.

-- What a charge has given back, and what its refunds have claimed: a refund reserves its
-- amount before it reaches the processor, so refunds under different keys can never together
-- exceed the charge. A reservation is released only when its refund has definitively failed.
ALTER TABLE charges
    ADD COLUMN amount_refunded bigint NOT NULL DEFAULT 0 CHECK (amount_refunded >= 0),
    ADD COLUMN amount_reserved bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT charges_refunds_within_amount
        CHECK (amount_reserved BETWEEN amount_refunded AND amount);

-- One row per refund, with the id of the idempotency record's generation. A pending row is
-- the refund's reservation on its charge; it becomes succeeded in the transaction that posts
-- the refund, or is deleted with its reservation when the refund definitively fails.
CREATE TABLE refunds (
    id                  uuid        PRIMARY KEY,
    tenant_id           text        NOT NULL,
    charge_id           uuid        NOT NULL REFERENCES charges (id),
    amount              bigint      NOT NULL CHECK (amount > 0),
    currency            text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    reason              text        CHECK (reason IN ('requested_by_customer', 'duplicate', 'fraudulent')),
    status              text        NOT NULL CHECK (status IN ('pending', 'succeeded')),
    processor_refund_id text,
    created_at          timestamptz NOT NULL,
    -- One processor refund is recorded once.
    CONSTRAINT refunds_processor_refund_unique UNIQUE (processor_refund_id),
    CONSTRAINT succeeded_has_processor_refund
        CHECK ((status = 'succeeded') = (processor_refund_id IS NOT NULL))
);

-- A charge's refunds, newest first, with the id as a tie-breaker for keyset pagination.
CREATE INDEX refunds_charge_created ON refunds (charge_id, created_at DESC, id DESC);

-- A ledger transaction now posts a charge or one of its refunds: every transaction names its
-- charge, a refund's also names the refund.
ALTER TABLE ledger_transactions
    DROP CONSTRAINT ledger_transactions_charge_unique,
    ADD COLUMN refund_id uuid REFERENCES refunds (id),
    -- A refund is posted exactly once.
    ADD CONSTRAINT ledger_transactions_refund_unique UNIQUE (refund_id);

-- A charge is posted exactly once.
CREATE UNIQUE INDEX ledger_transactions_charge_unique ON ledger_transactions (charge_id)
    WHERE refund_id IS NULL;
