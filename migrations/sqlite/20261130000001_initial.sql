-- The payments schema for the embedded SQLite backend: the same tables, columns, constraint
-- names and guarantees as migrations/postgres, in SQLite's terms.
--
-- STRICT tables refuse a value of the wrong type instead of storing it. Times are TEXT in one
-- fixed UTC format ('YYYY-MM-DDTHH:MM:SS.SSSZ', written by the database's own clock through
-- strftime, or microseconds for charges written by the service), so that comparing them as
-- text compares them as times. UUIDs are 16-byte BLOBs. Amounts are INTEGER minor units.

-- One row per (tenant, operation, key): the primary key is what makes the claim atomic.
CREATE TABLE idempotency_records (
    tenant_id           TEXT    NOT NULL,
    operation           TEXT    NOT NULL,
    idempotency_key     TEXT    NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    fingerprint         BLOB    NOT NULL CHECK (length(fingerprint) = 32),
    state               TEXT    NOT NULL CHECK (state IN ('pending', 'completed', 'failed')),
    recovery_point      TEXT    NOT NULL CHECK (recovery_point IN ('started', 'charged', 'finished')),
    -- While pending, the owning attempt's lock ends here; another attempt may then take over.
    locked_until        TEXT,
    -- The attempt count is also the fencing token every write of an attempt is conditioned on.
    attempts            INTEGER NOT NULL CHECK (attempts >= 1),
    -- Fixed at claim time, so every attempt of one request creates the same charge id and
    -- sends the same processor key.
    resource_id         BLOB    NOT NULL CHECK (length(resource_id) = 16),
    processor_key       TEXT    NOT NULL,
    processor_charge_id TEXT,
    response_status     INTEGER,
    response_headers    TEXT    CHECK (response_headers IS NULL OR json_valid(response_headers)),
    response_body       BLOB,
    -- The canonical JSON of the request, so the completer can finish without the client.
    request_body        BLOB,
    created_at          TEXT    NOT NULL,
    expires_at          TEXT    NOT NULL,
    updated_at          TEXT    NOT NULL,
    PRIMARY KEY (tenant_id, operation, idempotency_key),
    CONSTRAINT completed_has_response
        CHECK ((state = 'completed') = (response_status IS NOT NULL AND response_body IS NOT NULL)),
    CONSTRAINT pending_is_locked CHECK (state <> 'pending' OR locked_until IS NOT NULL),
    CONSTRAINT charged_has_processor_charge
        CHECK (recovery_point = 'started' OR state = 'completed' OR processor_charge_id IS NOT NULL)
) STRICT;

-- The completer scans abandoned pending records; the reaper scans expired finished ones.
CREATE INDEX idempotency_records_pending_lock ON idempotency_records (locked_until) WHERE state = 'pending';
CREATE INDEX idempotency_records_expiry ON idempotency_records (expires_at) WHERE state <> 'pending';

CREATE TABLE charges (
    id                  BLOB    PRIMARY KEY CHECK (length(id) = 16),
    tenant_id           TEXT    NOT NULL,
    amount              INTEGER NOT NULL CHECK (amount > 0),
    currency            TEXT    NOT NULL CHECK (currency GLOB '[A-Z][A-Z][A-Z]'),
    source              TEXT    NOT NULL,
    description         TEXT,
    status              TEXT    NOT NULL CHECK (status = 'succeeded'),
    processor_charge_id TEXT    NOT NULL,
    created_at          TEXT    NOT NULL,
    -- One processor charge is recorded once, whatever happens to the idempotency records.
    CONSTRAINT charges_processor_charge_unique UNIQUE (processor_charge_id)
) STRICT;

-- Newest first, per tenant, with the id as a tie-breaker for keyset pagination.
CREATE INDEX charges_tenant_created ON charges (tenant_id, created_at DESC, id DESC);

-- A transaction's entries are written first and the transaction row last: inserting the row
-- seals the transaction, and the triggers below check the balance at that moment. The
-- deferred foreign key lets the entries name a transaction that is inserted later in the
-- same database transaction.
CREATE TABLE ledger_transactions (
    id         BLOB NOT NULL PRIMARY KEY CHECK (length(id) = 16),
    tenant_id  TEXT NOT NULL,
    charge_id  BLOB NOT NULL REFERENCES charges (id),
    created_at TEXT NOT NULL,
    -- A charge is posted exactly once.
    CONSTRAINT ledger_transactions_charge_unique UNIQUE (charge_id)
) STRICT;

CREATE TABLE ledger_entries (
    transaction_id BLOB    NOT NULL
        REFERENCES ledger_transactions (id) DEFERRABLE INITIALLY DEFERRED,
    line           INTEGER NOT NULL,
    tenant_id      TEXT    NOT NULL,
    account        TEXT    NOT NULL CHECK (account IN ('processor_receivable', 'customer_payments')),
    currency       TEXT    NOT NULL CHECK (currency GLOB '[A-Z][A-Z][A-Z]'),
    -- Debits positive, credits negative, never zero.
    amount         INTEGER NOT NULL CHECK (amount <> 0),
    PRIMARY KEY (transaction_id, line)
) STRICT;

CREATE INDEX ledger_entries_balances ON ledger_entries (tenant_id, account, currency);

-- SQLite has no deferred constraint triggers, so the balance is checked when the transaction
-- row is inserted (after its entries), and a sealed transaction takes no more entries. The
-- error text is the constraint's name, as in PostgreSQL.
CREATE TRIGGER ledger_entries_balanced
    AFTER INSERT ON ledger_transactions
    WHEN NOT EXISTS (SELECT 1 FROM ledger_entries WHERE transaction_id = NEW.id)
      OR EXISTS (
          SELECT 1 FROM ledger_entries
          WHERE transaction_id = NEW.id
          GROUP BY currency
          HAVING sum(amount) <> 0)
BEGIN
    SELECT RAISE(ABORT, 'ledger_entries_balanced');
END;

CREATE TRIGGER ledger_entries_sealed_insert
    BEFORE INSERT ON ledger_entries
    WHEN EXISTS (SELECT 1 FROM ledger_transactions WHERE id = NEW.transaction_id)
BEGIN
    SELECT RAISE(ABORT, 'ledger_entries_balanced');
END;

CREATE TRIGGER ledger_entries_sealed_update
    BEFORE UPDATE ON ledger_entries
BEGIN
    SELECT RAISE(ABORT, 'ledger_entries_balanced');
END;

-- Events written in the same transaction as the charge; a relay publishes them afterwards.
CREATE TABLE outbox_events (
    id           BLOB NOT NULL PRIMARY KEY CHECK (length(id) = 16),
    tenant_id    TEXT NOT NULL,
    event_type   TEXT NOT NULL,
    aggregate_id BLOB NOT NULL,
    payload      TEXT NOT NULL CHECK (json_valid(payload)),
    created_at   TEXT NOT NULL,
    published_at TEXT,
    -- SQLite has no SKIP LOCKED: a relay leases the rows it is publishing until this time, so
    -- relays in several processes take disjoint rows. A relay that dies leaves a lease that
    -- runs out, and the rows are published by the next one (at least once, never lost).
    relay_lease_until TEXT,
    -- One event of each type per charge.
    CONSTRAINT outbox_events_once_per_aggregate UNIQUE (event_type, aggregate_id)
) STRICT;

CREATE INDEX outbox_events_unpublished ON outbox_events (created_at) WHERE published_at IS NULL;
