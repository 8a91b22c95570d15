-- Reconciliation: each day's run against the processor's settlement report, and every item of
-- it that a person must look at.

-- One row per reported day: a second run over the same day replaces the counts and adds no
-- exception already there.
CREATE TABLE reconciliation_runs (
    report_date date        PRIMARY KEY,
    ran_at      timestamptz NOT NULL,
    matched     bigint      NOT NULL CHECK (matched >= 0),
    settled     bigint      NOT NULL CHECK (settled >= 0),
    in_flight   bigint      NOT NULL CHECK (in_flight >= 0),
    exceptions  bigint      NOT NULL CHECK (exceptions >= 0)
);

-- The processor's side (`processor_*`), the books' side (`books_*`), or both; and for a
-- `processor_mismatch`, the pending record the processor's answer did not confirm (`record_*`).
CREATE TABLE reconciliation_exceptions (
    id                 uuid        PRIMARY KEY,
    report_date        date        NOT NULL REFERENCES reconciliation_runs (report_date),
    kind               text        NOT NULL
        CHECK (kind IN ('processor_only', 'books_only', 'amount_mismatch', 'processor_mismatch')),
    effect             text        NOT NULL CHECK (effect IN ('charge', 'refund', 'payout')),
    processor_id       text        NOT NULL,
    processor_key      text,
    tenant_id          text,
    resource_id        text,
    processor_amount   bigint,
    processor_currency text,
    books_amount       bigint,
    books_currency     text,
    record_operation   text,
    record_key         text,
    status             text        NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'resolved')),
    created_at         timestamptz NOT NULL,
    CONSTRAINT reconciliation_exceptions_once UNIQUE (report_date, kind, processor_id)
);

CREATE INDEX reconciliation_exceptions_open ON reconciliation_exceptions (created_at)
    WHERE status = 'open';

-- A run reads the books of a day (and the days beside it) across tenants.
CREATE INDEX charges_created ON charges (created_at);
CREATE INDEX refunds_created ON refunds (created_at) WHERE status = 'succeeded';
CREATE INDEX payouts_created ON payouts (created_at) WHERE status = 'paid';
