-- The idempotency records of the engine's SQL record store, on SQLite. Apply it as a
-- migration of your own service (copy it into your migrations directory), or with
-- `SqlRecords::create_schema` where a service has no migrations. The columns are
-- PostgreSQL's (schema/postgres.sql says what each holds); times are text in one format
-- (`%Y-%m-%dT%H:%M:%fZ`), so that text order is time order.
CREATE TABLE IF NOT EXISTS idempotency_records (
    tenant_id               TEXT    NOT NULL,
    operation               TEXT    NOT NULL,
    idempotency_key         TEXT    NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    fingerprint             BLOB    NOT NULL CHECK (length(fingerprint) = 32),
    request_version         INTEGER NOT NULL DEFAULT 0 CHECK (request_version >= 0),
    state                   TEXT    NOT NULL CHECK (state IN ('pending', 'completed', 'failed')),
    recovery_point          TEXT    NOT NULL CHECK (recovery_point IN ('started', 'charged', 'finished')),
    locked_until            TEXT,
    attempts                INTEGER NOT NULL CHECK (attempts >= 1),
    resource_id             BLOB    NOT NULL CHECK (length(resource_id) = 16),
    processor_key           TEXT    NOT NULL,
    effect_id               TEXT,
    response_status         INTEGER,
    response_headers        TEXT    CHECK (response_headers IS NULL OR json_valid(response_headers)),
    response_body           BLOB,
    response_schema_version INTEGER CHECK (response_schema_version >= 1),
    request_body            BLOB,
    created_at              TEXT    NOT NULL,
    expires_at              TEXT    NOT NULL,
    updated_at              TEXT    NOT NULL,
    PRIMARY KEY (tenant_id, operation, idempotency_key),
    CONSTRAINT completed_has_response
        CHECK ((state = 'completed') = (response_status IS NOT NULL AND response_body IS NOT NULL)),
    CONSTRAINT completed_has_schema_version
        CHECK ((state = 'completed') = (response_schema_version IS NOT NULL)),
    CONSTRAINT pending_is_locked CHECK (state <> 'pending' OR locked_until IS NOT NULL),
    CONSTRAINT charged_has_effect_id
        CHECK (recovery_point = 'started' OR state = 'completed' OR effect_id IS NOT NULL)
) STRICT;

CREATE INDEX IF NOT EXISTS idempotency_records_pending_lock
    ON idempotency_records (locked_until) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS idempotency_records_expiry
    ON idempotency_records (expires_at) WHERE state <> 'pending';
