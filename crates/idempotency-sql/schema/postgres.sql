-- The idempotency records of the engine's SQL record store, on PostgreSQL. Apply it as a
-- migration of your own service (copy it into your migrations directory), or with
-- `SqlRecords::create_schema` where a service has no migrations. One row per key of an
-- operation of a tenant; the engine's states, fence and stored response.
CREATE TABLE IF NOT EXISTS idempotency_records (
    tenant_id               text        NOT NULL,
    operation               text        NOT NULL,
    idempotency_key         text        NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    fingerprint             bytea       NOT NULL CHECK (length(fingerprint) = 32),
    -- The request version the fingerprint was made under (0: the body as sent).
    request_version         integer     NOT NULL DEFAULT 0 CHECK (request_version >= 0),
    state                   text        NOT NULL CHECK (state IN ('pending', 'completed', 'failed')),
    -- 'charged' is the effect's recovery point (the effect was made): the name is kept for
    -- the rows already written.
    recovery_point          text        NOT NULL CHECK (recovery_point IN ('started', 'charged', 'finished')),
    -- While pending, the owning attempt's lock ends here; another attempt may then take over.
    locked_until            timestamptz,
    -- The attempt count is half of the fence every write of an attempt is conditioned on.
    attempts                integer     NOT NULL CHECK (attempts >= 1),
    -- The generation, the fence's other half: fixed at claim time, the same on every attempt
    -- of one request, new for each generation of the key.
    resource_id             uuid        NOT NULL,
    -- The effect key, sent with the effect so that the effect itself is made at most once.
    processor_key           text        NOT NULL,
    -- The effect's id, once the effect is known to be made.
    effect_id               text,
    response_status         smallint,
    response_headers        jsonb,
    response_body           bytea,
    response_schema_version integer     CHECK (response_schema_version >= 1),
    -- The canonical request, so the completer can finish without the client.
    request_body            bytea,
    created_at              timestamptz NOT NULL DEFAULT now(),
    expires_at              timestamptz NOT NULL,
    updated_at              timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, operation, idempotency_key),
    CONSTRAINT completed_has_response
        CHECK ((state = 'completed') = (response_status IS NOT NULL AND response_body IS NOT NULL)),
    CONSTRAINT completed_has_schema_version
        CHECK ((state = 'completed') = (response_schema_version IS NOT NULL)),
    CONSTRAINT pending_is_locked CHECK (state <> 'pending' OR locked_until IS NOT NULL),
    CONSTRAINT charged_has_effect_id
        CHECK (recovery_point = 'started' OR state = 'completed' OR effect_id IS NOT NULL)
);

-- The completer's walk: pending records by the end of their lock.
CREATE INDEX IF NOT EXISTS idempotency_records_pending_lock
    ON idempotency_records (locked_until) WHERE state = 'pending';
-- The reaper's walk: finished records by expiry.
CREATE INDEX IF NOT EXISTS idempotency_records_expiry
    ON idempotency_records (expires_at) WHERE state <> 'pending';
