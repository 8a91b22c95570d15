-- What ended a hold, in the books: PostgreSQL's migration of the same name says what the columns
-- mean. SQLite adds a column at a time, each with its own check.
ALTER TABLE charges ADD COLUMN processor_capture_id TEXT
    CHECK (processor_capture_id IS NULL OR coalesce(capture_status, '') = 'captured');
ALTER TABLE charges ADD COLUMN processor_void_id TEXT
    CHECK (processor_void_id IS NULL OR coalesce(capture_status, '') = 'canceled');
ALTER TABLE charges ADD COLUMN hold_ended_at TEXT
    CHECK ((hold_ended_at IS NULL) = (processor_capture_id IS NULL AND processor_void_id IS NULL));

CREATE UNIQUE INDEX charges_processor_capture_unique ON charges (processor_capture_id)
    WHERE processor_capture_id IS NOT NULL;
CREATE UNIQUE INDEX charges_processor_void_unique ON charges (processor_void_id)
    WHERE processor_void_id IS NOT NULL;
CREATE INDEX charges_hold_ended_at ON charges (hold_ended_at) WHERE hold_ended_at IS NOT NULL;

-- An exception may be of a capture or a void. SQLite cannot change a check in place, so the
-- exceptions are rebuilt, and with them their resolutions, which refer to them (a table another
-- refers to cannot be dropped while foreign keys are enforced): the rows are kept aside, both
-- tables are created anew as they stand after the resolutions migration, and the rows go back.
-- The view over them goes first and comes back below, with the hold's ends added.
DROP VIEW books;
CREATE TEMPORARY TABLE reconciliation_exceptions_before AS SELECT * FROM reconciliation_exceptions;
CREATE TEMPORARY TABLE reconciliation_resolutions_before AS
    SELECT * FROM reconciliation_resolutions;
DROP TABLE reconciliation_resolutions;
DROP TABLE reconciliation_exceptions;

CREATE TABLE reconciliation_exceptions (
    id                 BLOB    NOT NULL PRIMARY KEY CHECK (length(id) = 16),
    report_date        TEXT    NOT NULL REFERENCES reconciliation_runs (report_date),
    kind               TEXT    NOT NULL
        CHECK (kind IN ('processor_only', 'books_only', 'amount_mismatch', 'processor_mismatch')),
    effect             TEXT    NOT NULL
        CHECK (effect IN ('charge', 'refund', 'payout', 'capture', 'void')),
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
    held_by            BLOB    CHECK (length(held_by) = 16),
    CONSTRAINT reconciliation_exceptions_once UNIQUE (report_date, kind, processor_id)
) STRICT;

CREATE INDEX reconciliation_exceptions_open ON reconciliation_exceptions (created_at)
    WHERE status = 'open';

CREATE TABLE reconciliation_resolutions (
    exception_id       BLOB    NOT NULL PRIMARY KEY REFERENCES reconciliation_exceptions (id),
    action             TEXT    NOT NULL CHECK (action IN ('record', 'void', 'accept')),
    operator           TEXT    NOT NULL,
    note               TEXT    NOT NULL,
    resolved_at        TEXT    NOT NULL,
    recorded_id        TEXT,
    void_tenant_id     TEXT,
    void_processor_id  TEXT UNIQUE,
    void_amount        INTEGER CHECK (void_amount > 0),
    void_currency      TEXT,
    CHECK ((action = 'void') = (void_processor_id IS NOT NULL)),
    CHECK ((action = 'record') = (recorded_id IS NOT NULL))
) STRICT;

INSERT INTO reconciliation_exceptions
    (id, report_date, kind, effect, processor_id, processor_key, tenant_id, resource_id,
     processor_amount, processor_currency, books_amount, books_currency, record_operation,
     record_key, status, created_at, held_by)
SELECT id, report_date, kind, effect, processor_id, processor_key, tenant_id, resource_id,
       processor_amount, processor_currency, books_amount, books_currency, record_operation,
       record_key, status, created_at, held_by
FROM reconciliation_exceptions_before;

INSERT INTO reconciliation_resolutions
    (exception_id, action, operator, note, resolved_at, recorded_id, void_tenant_id,
     void_processor_id, void_amount, void_currency)
SELECT exception_id, action, operator, note, resolved_at, recorded_id, void_tenant_id,
       void_processor_id, void_amount, void_currency
FROM reconciliation_resolutions_before;

DROP TABLE reconciliation_exceptions_before;
DROP TABLE reconciliation_resolutions_before;

CREATE VIEW books (kind, id, tenant_id, processor_id, amount, currency, created_at) AS
SELECT 'charge', id, tenant_id, processor_charge_id, amount, currency, created_at
FROM charges
UNION ALL
SELECT 'capture', id, tenant_id, processor_capture_id, amount_captured, currency, hold_ended_at
FROM charges WHERE processor_capture_id IS NOT NULL
UNION ALL
SELECT 'void', id, tenant_id, processor_void_id, amount, currency, hold_ended_at
FROM charges WHERE processor_void_id IS NOT NULL
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
