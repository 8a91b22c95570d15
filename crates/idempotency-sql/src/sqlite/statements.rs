//! The record store's statements on SQLite: PostgreSQL's (`postgres/statements.rs`), under the
//! same names and in the same order, with SQLite's clock (`strftime('%Y-%m-%dT%H:%M:%fZ',
//! 'now', ?)`, its modifier bound as `+N seconds`) and without its row locks.

pub(super) const INSERT_PENDING: &str = "
INSERT INTO idempotency_records
    (tenant_id, operation, idempotency_key, fingerprint, request_version, state, recovery_point,
     locked_until, attempts, resource_id, processor_key, created_at, expires_at, updated_at,
     request_body)
VALUES (?1, ?2, ?3, ?4, ?5, 'pending', 'started', strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?6), 1,
        ?7, ?8, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
        strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?9), strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), ?10)
ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING
RETURNING attempts";

/// Without a row lock: under the claim's write transaction, the whole database is locked.
pub(super) const READ: &str = "
SELECT r.*, strftime('%Y-%m-%dT%H:%M:%fZ', 'now') AS db_now FROM idempotency_records r
WHERE tenant_id = ?1 AND operation = ?2 AND idempotency_key = ?3";

pub(super) const TAKE_OVER: &str = "
UPDATE idempotency_records
SET state = 'pending', attempts = attempts + 1,
    locked_until = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?4),
    updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
WHERE tenant_id = ?1 AND operation = ?2 AND idempotency_key = ?3
RETURNING attempts, resource_id, processor_key";

pub(super) const REPLACE: &str = "
UPDATE idempotency_records
SET fingerprint = ?4, request_version = ?5, state = 'pending', recovery_point = 'started',
    attempts = attempts + 1, locked_until = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?6),
    resource_id = ?7, processor_key = ?8, effect_id = NULL, response_status = NULL,
    response_headers = NULL, response_body = NULL, response_schema_version = NULL,
    created_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
    expires_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?9),
    updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), request_body = ?10
WHERE tenant_id = ?1 AND operation = ?2 AND idempotency_key = ?3
RETURNING attempts";

pub(super) const RECORD_EFFECT: &str = "
UPDATE idempotency_records
SET recovery_point = 'charged', effect_id = ?6, updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
WHERE tenant_id = ?1 AND operation = ?2 AND idempotency_key = ?3
  AND attempts = ?4 AND resource_id = ?5 AND state = 'pending'";

pub(super) const RELEASE: &str = "
UPDATE idempotency_records
SET locked_until = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
    updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
WHERE tenant_id = ?1 AND operation = ?2 AND idempotency_key = ?3
  AND attempts = ?4 AND resource_id = ?5 AND state = 'pending'";

/// The fence's check: the write transaction it runs in holds the whole database already.
pub(super) const LOCK: &str = "
SELECT attempts FROM idempotency_records
WHERE tenant_id = ?1 AND operation = ?2 AND idempotency_key = ?3
  AND attempts = ?4 AND resource_id = ?5 AND state = 'pending'";

pub(super) const COMPLETE: &str = "
UPDATE idempotency_records
SET state = 'completed', recovery_point = 'finished', locked_until = NULL, response_status = ?6,
    response_headers = ?7, response_body = ?8, response_schema_version = ?9,
    expires_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?10),
    updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
WHERE tenant_id = ?1 AND operation = ?2 AND idempotency_key = ?3
  AND attempts = ?4 AND resource_id = ?5 AND state = 'pending'
RETURNING expires_at";

pub(super) const COMPLETE_WITHOUT_EFFECT: &str = "
UPDATE idempotency_records
SET state = 'completed', recovery_point = 'finished', locked_until = NULL, response_status = ?6,
    response_headers = ?7, response_body = ?8, response_schema_version = ?9,
    expires_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?10),
    updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
WHERE tenant_id = ?1 AND operation = ?2 AND idempotency_key = ?3
  AND attempts = ?4 AND resource_id = ?5 AND state = 'pending' AND effect_id IS NULL
RETURNING expires_at";

pub(super) const COMPLETE_UNRECORDED: &str = "
UPDATE idempotency_records
SET state = 'completed', recovery_point = 'charged', effect_id = ?11, locked_until = NULL,
    response_status = ?6, response_headers = ?7, response_body = ?8, response_schema_version = ?9,
    expires_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?10),
    updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
WHERE tenant_id = ?1 AND operation = ?2 AND idempotency_key = ?3
  AND attempts = ?4 AND resource_id = ?5 AND state = 'pending'
RETURNING expires_at";

pub(super) const FAIL: &str = "
UPDATE idempotency_records
SET state = 'failed', locked_until = NULL, expires_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?6),
    updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
WHERE tenant_id = ?1 AND operation = ?2 AND idempotency_key = ?3
  AND attempts = ?4 AND resource_id = ?5 AND state = 'pending' AND effect_id IS NULL
RETURNING expires_at";

/// One writer at a time: the write lock keeps every other completer out, so no `SKIP LOCKED`.
pub(super) const TAKE_OVER_ABANDONED: &str = "
UPDATE idempotency_records
SET attempts = attempts + 1, locked_until = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?1),
    updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
WHERE (tenant_id, operation, idempotency_key) IN (
    SELECT tenant_id, operation, idempotency_key FROM idempotency_records
    WHERE state = 'pending' AND locked_until < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?2)
    ORDER BY locked_until
    LIMIT 1)
RETURNING tenant_id, operation, idempotency_key, attempts, resource_id, processor_key,
          recovery_point, effect_id, request_body, request_version";

pub(super) const REAP_EXPIRED: &str = "
DELETE FROM idempotency_records
WHERE (tenant_id, operation, idempotency_key) IN (
    SELECT tenant_id, operation, idempotency_key FROM idempotency_records
    WHERE state <> 'pending' AND expires_at <= strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
      AND (effect_id IS NULL OR (state = 'completed' AND recovery_point = 'finished'))
    ORDER BY expires_at
    LIMIT ?1)";

pub(super) const TAKE_OVER_BY_EFFECT_KEY: &str = "
UPDATE idempotency_records
SET attempts = attempts + 1, locked_until = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?1),
    updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
WHERE (tenant_id, operation, idempotency_key) IN (
    SELECT tenant_id, operation, idempotency_key FROM idempotency_records
    WHERE state = 'pending' AND processor_key = ?2
      AND locked_until < strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
    LIMIT 1)
RETURNING tenant_id, operation, idempotency_key, attempts, resource_id, processor_key,
          recovery_point, effect_id, request_body, request_version";

pub(super) const COUNT_PENDING_BY_EFFECT_KEY: &str = "
SELECT count(*) FROM idempotency_records WHERE state = 'pending' AND processor_key = ?1";

pub(super) const COMPLETE_HELD: &str = "
UPDATE idempotency_records
SET state = 'completed', recovery_point = 'finished', locked_until = NULL, response_status = ?4,
    response_headers = ?5, response_body = ?6, response_schema_version = ?7,
    expires_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?8), attempts = attempts + 1,
    updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
WHERE tenant_id = ?1 AND operation = ?2 AND idempotency_key = ?3
  AND state = 'pending' AND effect_id IS NULL";
