-- The payments schema: idempotency records, charges, a double-entry ledger and the outbox.
-- Amounts are bigint minor units; states are CHECK-constrained text so that a bad write fails
-- loudly instead of storing a state the code cannot read back.

-- One row per (tenant, operation, key): the primary key is what makes the claim atomic.
CREATE TABLE idempotency_records (
    tenant_id           text        NOT NULL,
    operation           text        NOT NULL,
    idempotency_key     text        NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    fingerprint         bytea       NOT NULL CHECK (length(fingerprint) = 32),
    state               text        NOT NULL CHECK (state IN ('pending', 'completed', 'failed')),
    recovery_point      text        NOT NULL CHECK (recovery_point IN ('started', 'charged', 'finished')),
    -- While pending, the owning attempt's lock ends here; another attempt may then take over.
    locked_until        timestamptz,
    -- The attempt count is also the fencing token every write of an attempt is conditioned on.
    attempts            integer     NOT NULL CHECK (attempts >= 1),
    -- Fixed at claim time, so every attempt of one request creates the same charge id and
    -- sends the same processor key.
    resource_id         uuid        NOT NULL,
    processor_key       text        NOT NULL,
    processor_charge_id text,
    response_status     smallint,
    response_headers    jsonb,
    response_body       bytea,
    created_at          timestamptz NOT NULL DEFAULT now(),
    expires_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, operation, idempotency_key),
    CONSTRAINT completed_has_response
        CHECK ((state = 'completed') = (response_status IS NOT NULL AND response_body IS NOT NULL)),
    CONSTRAINT pending_is_locked CHECK (state <> 'pending' OR locked_until IS NOT NULL),
    CONSTRAINT charged_has_processor_charge
        CHECK (recovery_point = 'started' OR state = 'completed' OR processor_charge_id IS NOT NULL)
);

-- The completer scans abandoned pending records; the reaper scans expired finished ones.
CREATE INDEX idempotency_records_pending_lock ON idempotency_records (locked_until) WHERE state = 'pending';
CREATE INDEX idempotency_records_expiry ON idempotency_records (expires_at) WHERE state <> 'pending';

CREATE TABLE charges (
    id                  uuid        PRIMARY KEY,
    tenant_id           text        NOT NULL,
    amount              bigint      NOT NULL CHECK (amount > 0),
    currency            text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    source              text        NOT NULL,
    description         text,
    status              text        NOT NULL CHECK (status = 'succeeded'),
    processor_charge_id text        NOT NULL,
    created_at          timestamptz NOT NULL,
    -- One processor charge is recorded once, whatever happens to the idempotency records.
    CONSTRAINT charges_processor_charge_unique UNIQUE (processor_charge_id)
);

-- Newest first, per tenant, with the id as a tie-breaker for keyset pagination.
CREATE INDEX charges_tenant_created ON charges (tenant_id, created_at DESC, id DESC);

CREATE TABLE ledger_transactions (
    id         uuid        PRIMARY KEY,
    tenant_id  text        NOT NULL,
    charge_id  uuid        NOT NULL REFERENCES charges (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    -- A charge is posted exactly once.
    CONSTRAINT ledger_transactions_charge_unique UNIQUE (charge_id)
);

CREATE TABLE ledger_entries (
    transaction_id uuid     NOT NULL REFERENCES ledger_transactions (id),
    line           smallint NOT NULL,
    tenant_id      text     NOT NULL,
    account        text     NOT NULL CHECK (account IN ('processor_receivable', 'customer_payments')),
    currency       text     NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    -- Debits positive, credits negative, never zero.
    amount         bigint   NOT NULL CHECK (amount <> 0),
    PRIMARY KEY (transaction_id, line)
);

CREATE INDEX ledger_entries_balances ON ledger_entries (tenant_id, account, currency);

-- The domain only builds balanced transactions; this deferred check makes the database refuse
-- an unbalanced one too, at commit, whatever code wrote it.
CREATE FUNCTION ledger_transaction_must_balance() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM ledger_entries
        WHERE transaction_id = NEW.transaction_id
        GROUP BY currency
        HAVING sum(amount) <> 0
    ) THEN
        RAISE EXCEPTION 'ledger transaction % does not balance', NEW.transaction_id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ledger_entries_balanced';
    END IF;
    RETURN NULL;
END;
$$;

CREATE CONSTRAINT TRIGGER ledger_entries_balanced
    AFTER INSERT OR UPDATE ON ledger_entries
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION ledger_transaction_must_balance();

-- Events written in the same transaction as the charge; a relay publishes them afterwards.
CREATE TABLE outbox_events (
    id           uuid        PRIMARY KEY,
    tenant_id    text        NOT NULL,
    event_type   text        NOT NULL,
    aggregate_id uuid        NOT NULL,
    payload      jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz,
    -- One event of each type per charge.
    CONSTRAINT outbox_events_once_per_aggregate UNIQUE (event_type, aggregate_id)
);

CREATE INDEX outbox_events_unpublished ON outbox_events (created_at) WHERE published_at IS NULL;
