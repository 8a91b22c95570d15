-- Reconciliation: each day's run against the processor's settlement report, and every item of
-- it that a person must look at.

-- One row per reported day: a second run over the same day replaces the counts and adds no
-- exception already there.
CREATE TABLE reconciliation_runs (
    report_date TEXT    NOT NULL PRIMARY KEY
        CHECK (report_date GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]'),
    ran_at      TEXT    NOT NULL,
    matched     INTEGER NOT NULL CHECK (matched >= 0),
    settled     INTEGER NOT NULL CHECK (settled >= 0),
    in_flight   INTEGER NOT NULL CHECK (in_flight >= 0),
    exceptions  INTEGER NOT NULL CHECK (exceptions >= 0)
) STRICT;

-- The processor's side (`processor_*`), the books' side (`books_*`), or both; and for a
-- `processor_mismatch`, the pending record the processor's answer did not confirm (`record_*`).
CREATE TABLE reconciliation_exceptions (
    id                 BLOB    NOT NULL PRIMARY KEY CHECK (length(id) = 16),
    report_date        TEXT    NOT NULL REFERENCES reconciliation_runs (report_date),
    kind               TEXT    NOT NULL
        CHECK (kind IN ('processor_only', 'books_only', 'amount_mismatch', 'processor_mismatch')),
    effect             TEXT    NOT NULL CHECK (effect IN ('charge', 'refund', 'payout')),
    processor_id       TEXT    NOT NULL,
    processor_key      TEXT,
    tenant_id          TEXT,
    resource_id        TEXT,
    processor_amount   INTEGER,
    processor_currency TEXT,
    books_amount       INTEGER,
    books_currency     TEXT,
    record_operation   TEXT,
    record_key         TEXT,
    status             TEXT    NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'resolved')),
    created_at         TEXT    NOT NULL,
    CONSTRAINT reconciliation_exceptions_once UNIQUE (report_date, kind, processor_id)
) STRICT;

CREATE INDEX reconciliation_exceptions_open ON reconciliation_exceptions (created_at)
    WHERE status = 'open';

-- A run reads the books of a day (and the days beside it) across tenants.
CREATE INDEX charges_created ON charges (created_at);
CREATE INDEX refunds_created ON refunds (created_at) WHERE status = 'succeeded';
CREATE INDEX payouts_created ON payouts (created_at) WHERE status = 'paid';
