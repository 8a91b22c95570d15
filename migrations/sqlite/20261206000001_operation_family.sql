-- A key's identity is its tenant, its operation's family and the key: no schema version. Every
-- version of an operation shares its records, so a retry answered by another build of a fleet
-- mid-deploy (or after a rollback) finds the effect the first one made. The schema version
-- moves to the stored response it describes, and decides only how a replay is rendered.
--
-- Records written under `<family>.v<N>` scopes keep their data: the family is what precedes the
-- suffix, and a completed record's response keeps N. Only `.v1` scopes were ever written (a
-- one-digit N is all this reads), so no two rows of one key meet under the primary key.
ALTER TABLE idempotency_records ADD COLUMN response_schema_version INTEGER
    CHECK (response_schema_version >= 1);

UPDATE idempotency_records
SET response_schema_version =
    CASE WHEN operation GLOB '*.v[1-9]' THEN CAST(substr(operation, -1) AS INTEGER) ELSE 1 END
WHERE state = 'completed';

UPDATE idempotency_records
SET operation = substr(operation, 1, length(operation) - 3)
WHERE operation GLOB '*.v[1-9]';

UPDATE reconciliation_exceptions
SET record_operation = substr(record_operation, 1, length(record_operation) - 3)
WHERE record_operation GLOB '*.v[1-9]';

-- What a record's fingerprint covers: the request in the form every version of its operation
-- shares, under this request version (bumped only when a field changes meaning; records of
-- another are never compared). 0: the body as the client sent it, as every record before this
-- migration was fingerprinted, which a request still carries to compare with them.
ALTER TABLE idempotency_records ADD COLUMN request_version INTEGER NOT NULL DEFAULT 0
    CHECK (request_version >= 0);
