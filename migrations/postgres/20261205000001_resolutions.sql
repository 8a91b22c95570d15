-- Resolving reconciliation exceptions: an operator records, voids or accepts each one, under an
-- idempotency key, on the same engine as every other effect.

-- The generation of the resolution at work on an exception: a second resolution under another
-- key finds it held and changes nothing, so two voids never both reach the processor. Released
-- when that resolution ends without its effect.
ALTER TABLE reconciliation_exceptions ADD COLUMN held_by uuid;

-- How each exception was resolved: one row at most (the primary key), written in the
-- transaction that completes the resolution's record and marks the exception resolved.
CREATE TABLE reconciliation_resolutions (
    exception_id       uuid        PRIMARY KEY REFERENCES reconciliation_exceptions (id),
    action             text        NOT NULL CHECK (action IN ('record', 'void', 'accept')),
    operator           text        NOT NULL,
    note               text        NOT NULL,
    resolved_at        timestamptz NOT NULL,
    -- `record`: the service's id of what it posted (`ch_...`).
    recorded_id        text,
    -- `void`: what the processor gave back, under the resolution's own key; the books hold it
    -- here, so that the day's report of the void matches.
    void_tenant_id     text,
    void_processor_id  text UNIQUE,
    void_amount        bigint CHECK (void_amount > 0),
    void_currency      text,
    CHECK ((action = 'void') = (void_processor_id IS NOT NULL)),
    CHECK ((action = 'record') = (recorded_id IS NOT NULL))
);
