-- Resolving reconciliation exceptions: an operator records, voids or accepts each one, under an
-- idempotency key, on the same engine as every other effect.

-- The generation of the resolution at work on an exception: a second resolution under another
-- key finds it held and changes nothing, so two voids never both reach the processor. Released
-- when that resolution ends without its effect.
ALTER TABLE reconciliation_exceptions ADD COLUMN held_by BLOB CHECK (length(held_by) = 16);

-- How each exception was resolved: one row at most (the primary key), written in the
-- transaction that completes the resolution's record and marks the exception resolved.
CREATE TABLE reconciliation_resolutions (
    exception_id       BLOB    NOT NULL PRIMARY KEY REFERENCES reconciliation_exceptions (id),
    action             TEXT    NOT NULL CHECK (action IN ('record', 'void', 'accept')),
    operator           TEXT    NOT NULL,
    note               TEXT    NOT NULL,
    resolved_at        TEXT    NOT NULL,
    -- `record`: the service's id of what it posted (`ch_...`).
    recorded_id        TEXT,
    -- `void`: what the processor gave back, under the resolution's own key; the books hold it
    -- here, so that the day's report of the void matches.
    void_tenant_id     TEXT,
    void_processor_id  TEXT UNIQUE,
    void_amount        INTEGER CHECK (void_amount > 0),
    void_currency      TEXT,
    CHECK ((action = 'void') = (void_processor_id IS NOT NULL)),
    CHECK ((action = 'record') = (recorded_id IS NOT NULL))
) STRICT;
