//! The record store's statements on PostgreSQL, each whole, its values bound in the order of
//! its numbered placeholders. `sqlite/statements.rs` has SQLite's, under the same names and in
//! the same order.

/// A fresh pending record at attempt 1, locked for the lock timeout (`$6` seconds), with a
/// provisional expiry (`$9`) that its completion replaces. No row: the key exists.
pub(super) const INSERT_PENDING: &str = "
INSERT INTO idempotency_records
    (tenant_id, operation, idempotency_key, fingerprint, request_version, state, recovery_point,
     locked_until, attempts, resource_id, processor_key, created_at, expires_at, updated_at,
     request_body)
VALUES ($1, $2, $3, $4, $5, 'pending', 'started', now() + make_interval(secs => $6), 1, $7, $8,
        now(), now() + make_interval(secs => $9), now(), $10)
ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING
RETURNING attempts";

/// The claims of many requests in one statement and one commit: `INSERT_PENDING` for each key
/// the statement does not find, and the record each found instead, read without a lock. Their
/// columns are the arrays `$3` to `$10` (the lock timeout `$1` and the retention `$2` are the
/// store's, the same for all), inserted in the arrays' order. One row per claim, by its
/// `position` in the arrays: the attempt number if its key was inserted (`inserted_attempts`),
/// and the record as it was when the statement began (`r.*` and the database's clock), which
/// the inserts do not change: a key that exists comes back with its record, to be answered from
/// without the lock; a key that an earlier claim of the same statement inserted, or that another
/// transaction committed while the statement ran, comes back with neither.
///
/// A key the statement finds is not inserted at all (`NOT EXISTS`), only read: an insert that
/// met its row would wait for whatever transaction holds that row (a finish between its
/// completion and its commit, or an instance frozen in one), and every claim of the statement,
/// of every tenant, would wait with it. Only a key another transaction is inserting at that
/// moment can hold the statement, for as long as that insert's transaction and at most the
/// connection's `lock_timeout`; the statement then fails, and its claims are written each
/// alone (`claims.rs`). The arrays are read
/// through `input`, materialized, so that PostgreSQL plans the statement once, for batches of
/// every size: arrays it could see would be planned for their length, again for every batch of
/// fewer claims than its generic plan counts on (which costs more than the statement's run).
/// PostgreSQL's only: on SQLite, concurrent claims share a transaction instead
/// (`sqlite/batch.rs`).
pub(super) const CLAIM_MANY: &str = "
WITH input AS MATERIALIZED (
    SELECT $3::text[] AS tenant_ids, $4::text[] AS operations, $5::text[] AS idempotency_keys,
           $6::bytea[] AS fingerprints, $7::bigint[] AS request_versions,
           $8::uuid[] AS resource_ids, $9::text[] AS processor_keys,
           $10::bytea[] AS request_bodies
),
claim AS (
    SELECT claim.*
    FROM input, UNNEST(input.tenant_ids, input.operations, input.idempotency_keys,
                       input.fingerprints, input.request_versions, input.resource_ids,
                       input.processor_keys, input.request_bodies) WITH ORDINALITY
        AS claim(tenant_id, operation, idempotency_key, fingerprint, request_version,
                 resource_id, processor_key, request_body, position)
),
inserted AS (
    INSERT INTO idempotency_records
        (tenant_id, operation, idempotency_key, fingerprint, request_version, state,
         recovery_point, locked_until, attempts, resource_id, processor_key, created_at,
         expires_at, updated_at, request_body)
    SELECT claim.tenant_id, claim.operation, claim.idempotency_key, claim.fingerprint,
           claim.request_version, 'pending', 'started', now() + make_interval(secs => $1), 1,
           claim.resource_id, claim.processor_key, now(), now() + make_interval(secs => $2),
           now(), claim.request_body
    FROM claim
    WHERE NOT EXISTS (
        SELECT 1 FROM idempotency_records r
        WHERE r.tenant_id = claim.tenant_id AND r.operation = claim.operation
          AND r.idempotency_key = claim.idempotency_key)
    ORDER BY claim.position
    ON CONFLICT (tenant_id, operation, idempotency_key) DO NOTHING
    RETURNING resource_id, attempts
)
SELECT claim.position, inserted.attempts AS inserted_attempts, r.*, now() AS db_now
FROM claim
LEFT JOIN inserted ON inserted.resource_id = claim.resource_id
LEFT JOIN idempotency_records r
    ON r.tenant_id = claim.tenant_id AND r.operation = claim.operation
   AND r.idempotency_key = claim.idempotency_key";

/// A record and the database's clock, without a lock.
pub(super) const READ: &str = "
SELECT r.*, now() AS db_now FROM idempotency_records r
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3";

/// The same, under the row lock: concurrent claims of one existing key queue here, so that
/// exactly one of them can take a stale record over. A row another transaction holds for
/// longer than the connection's `lock_timeout` (an instance frozen mid-transaction) cancels
/// the wait, and the claim is answered as in flight.
pub(super) const READ_LOCKED: &str = "
SELECT r.*, now() AS db_now FROM idempotency_records r
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
FOR UPDATE";

/// Gives a stale record to this attempt, keeping its generation, effect key and recovery
/// point: it resumes the same request. `attempts + 1` fences off the attempt it takes over.
pub(super) const TAKE_OVER: &str = "
UPDATE idempotency_records
SET state = 'pending', attempts = attempts + 1, locked_until = now() + make_interval(secs => $4),
    updated_at = now()
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
RETURNING attempts, resource_id, processor_key";

/// Reuses an expired or failed record's row for a new generation, `attempts` still counting:
/// a straggler of the old generation can never pass the new one's fence.
pub(super) const REPLACE: &str = "
UPDATE idempotency_records
SET fingerprint = $4, request_version = $5, state = 'pending', recovery_point = 'started',
    attempts = attempts + 1, locked_until = now() + make_interval(secs => $6), resource_id = $7,
    processor_key = $8, effect_id = NULL, response_status = NULL, response_headers = NULL,
    response_body = NULL, response_schema_version = NULL, created_at = now(),
    expires_at = now() + make_interval(secs => $9), updated_at = now(), request_body = $10
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
RETURNING attempts";

/// The effect is made: a takeover resumes from here without making it again. Fenced, as every
/// statement below: it matches only while the record is pending and still holds the attempt
/// number (`$4`) and generation (`$5`) its owner claimed with.
pub(super) const RECORD_EFFECT: &str = "
UPDATE idempotency_records SET recovery_point = 'charged', effect_id = $6, updated_at = now()
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
  AND attempts = $4 AND resource_id = $5 AND state = 'pending'";

/// Gives up the lock after an unknown outcome: the record stays pending and is stale at once.
pub(super) const RELEASE: &str = "
UPDATE idempotency_records SET locked_until = now(), updated_at = now()
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
  AND attempts = $4 AND resource_id = $5 AND state = 'pending'";

/// Locks the record its owner holds, in a transaction that holds a preparation (a
/// reservation): no takeover or completer ends this generation meanwhile. A lock, not a
/// write. The transaction a record ends in takes no lock first: the fenced `UPDATE` that ends
/// it (`COMPLETE`, `COMPLETE_WITHOUT_EFFECT`, `FAIL`) locks the record and checks the fence in
/// one statement.
pub(super) const LOCK: &str = "
SELECT attempts FROM idempotency_records
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
  AND attempts = $4 AND resource_id = $5 AND state = 'pending'
FOR UPDATE";

/// Completes the record with its response. Retention counts from the completion (`$10`
/// seconds), never from the claim.
pub(super) const COMPLETE: &str = "
UPDATE idempotency_records
SET state = 'completed', recovery_point = 'finished', locked_until = NULL, response_status = $6,
    response_headers = $7, response_body = $8, response_schema_version = $9,
    expires_at = now() + make_interval(secs => $10), updated_at = now()
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
  AND attempts = $4 AND resource_id = $5 AND state = 'pending'
RETURNING expires_at";

/// Completes the records of a batch of finishes, each as `COMPLETE` completes one: by its key
/// and fence (`$1`..`$5`, one array element per record) with its response (`$6`..`$9`). A
/// record another attempt or generation owns now matches nothing and is not returned, and
/// the others complete all the same; each record completed is returned by its position in the
/// arrays (from 1). The records are locked in the arrays' order, which is the keys' order.
pub(super) const COMPLETE_MANY: &str = "
UPDATE idempotency_records AS r
SET state = 'completed', recovery_point = 'finished', locked_until = NULL,
    response_status = f.status, response_headers = f.headers, response_body = f.body,
    response_schema_version = f.schema_version,
    expires_at = now() + make_interval(secs => $10), updated_at = now()
FROM UNNEST($1::text[], $2::text[], $3::text[], $4::integer[], $5::uuid[], $6::smallint[],
            $7::jsonb[], $8::bytea[], $9::bigint[]) WITH ORDINALITY
     AS f(tenant_id, operation, idempotency_key, attempts, resource_id, status, headers, body,
          schema_version, position)
WHERE r.tenant_id = f.tenant_id AND r.operation = f.operation
  AND r.idempotency_key = f.idempotency_key AND r.attempts = f.attempts
  AND r.resource_id = f.resource_id AND r.state = 'pending'
RETURNING f.position, r.expires_at";

/// Completes a record that made no effect (a decline, a refusal): a record holding an effect
/// id never ends this way, since its effect must be written with its operation's rows.
pub(super) const COMPLETE_WITHOUT_EFFECT: &str = "
UPDATE idempotency_records
SET state = 'completed', recovery_point = 'finished', locked_until = NULL, response_status = $6,
    response_headers = $7, response_body = $8, response_schema_version = $9,
    expires_at = now() + make_interval(secs => $10), updated_at = now()
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
  AND attempts = $4 AND resource_id = $5 AND state = 'pending' AND effect_id IS NULL
RETURNING expires_at";

/// Completes the record with its answer, its effect (`$11`) made but its rows refused for good:
/// it keeps the effect id and the effect-made recovery point, so that an operator finds it and
/// the reaper never deletes it.
pub(super) const COMPLETE_UNRECORDED: &str = "
UPDATE idempotency_records
SET state = 'completed', recovery_point = 'charged', effect_id = $11, locked_until = NULL,
    response_status = $6, response_headers = $7, response_body = $8, response_schema_version = $9,
    expires_at = now() + make_interval(secs => $10), updated_at = now()
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
  AND attempts = $4 AND resource_id = $5 AND state = 'pending'
RETURNING expires_at";

/// Fails the record once its effect key is tombstoned: the next claim starts a new generation.
/// A record holding an effect id is never failed.
pub(super) const FAIL: &str = "
UPDATE idempotency_records
SET state = 'failed', locked_until = NULL, expires_at = now() + make_interval(secs => $6),
    updated_at = now()
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
  AND attempts = $4 AND resource_id = $5 AND state = 'pending' AND effect_id IS NULL
RETURNING expires_at";

/// The completer's takeover: the pending record whose lock ended longest ago, if at least `$2`
/// seconds ago, locked for `$1` seconds. `SKIP LOCKED`: each instance takes a different row.
pub(super) const TAKE_OVER_ABANDONED: &str = "
UPDATE idempotency_records
SET attempts = attempts + 1, locked_until = now() + make_interval(secs => $1), updated_at = now()
WHERE (tenant_id, operation, idempotency_key) IN (
    SELECT tenant_id, operation, idempotency_key FROM idempotency_records
    WHERE state = 'pending' AND locked_until < now() - make_interval(secs => $2)
    ORDER BY locked_until
    LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING tenant_id, operation, idempotency_key, attempts, resource_id, processor_key,
          recovery_point, effect_id, request_body, request_version";

/// The reaper: up to `$1` expired finished records, the longest expired first, along the
/// partial index `idempotency_records_expiry`. Never a pending record, nor a failed one that
/// holds an effect id.
pub(super) const REAP_EXPIRED: &str = "
DELETE FROM idempotency_records
WHERE (tenant_id, operation, idempotency_key) IN (
    SELECT tenant_id, operation, idempotency_key FROM idempotency_records
    WHERE state <> 'pending' AND expires_at <= now()
      AND (effect_id IS NULL OR (state = 'completed' AND recovery_point = 'finished'))
    ORDER BY expires_at
    LIMIT $1 FOR UPDATE SKIP LOCKED)";

/// How many rows of the records table changed (inserted, updated or deleted) since it was last
/// analyzed, and how many rows that analyze counted (-1: never analyzed), as the statistics
/// system knows them. No row for a role that may not analyze the table (only its owner, a
/// member of the owner's role, or a superuser may), which PostgreSQL would answer with a
/// warning and nothing done.
pub(super) const CHANGES_SINCE_ANALYZE: &str = "
SELECT s.n_mod_since_analyze, c.reltuples::float8
FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
WHERE s.relid = 'idempotency_records'::regclass AND pg_has_role(c.relowner, 'USAGE')";

/// Gathers the records table's statistics afresh, which makes every connection plan its
/// statements over the table again. An analyze already under way (another instance's, or
/// autovacuum's) is not waited for.
pub(super) const ANALYZE: &str = "ANALYZE (SKIP_LOCKED) idempotency_records";

/// Takes over the pending record that made (or is making) the effect under effect key `$2`,
/// once its lock has ended, for `$1` seconds: a reconciler found the effect at its maker, so
/// no call under the key can still be on its way, and there is no grace to wait for.
pub(super) const TAKE_OVER_BY_EFFECT_KEY: &str = "
UPDATE idempotency_records
SET attempts = attempts + 1, locked_until = now() + make_interval(secs => $1), updated_at = now()
WHERE (tenant_id, operation, idempotency_key) IN (
    SELECT tenant_id, operation, idempotency_key FROM idempotency_records
    WHERE state = 'pending' AND processor_key = $2 AND locked_until < now()
    LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING tenant_id, operation, idempotency_key, attempts, resource_id, processor_key,
          recovery_point, effect_id, request_body, request_version";

/// Whether a pending record holds effect key `$1`.
pub(super) const COUNT_PENDING_BY_EFFECT_KEY: &str = "
SELECT count(*) FROM idempotency_records WHERE state = 'pending' AND processor_key = $1";

/// Completes a pending record that no attempt will ever finish (an operator voided its
/// effect), whichever attempt holds it: `attempts + 1` fences off an attempt still at work,
/// which then answers from the record. A record holding an effect id is left alone.
pub(super) const COMPLETE_HELD: &str = "
UPDATE idempotency_records
SET state = 'completed', recovery_point = 'finished', locked_until = NULL, response_status = $4,
    response_headers = $5, response_body = $6, response_schema_version = $7,
    expires_at = now() + make_interval(secs => $8), attempts = attempts + 1, updated_at = now()
WHERE tenant_id = $1 AND operation = $2 AND idempotency_key = $3
  AND state = 'pending' AND effect_id IS NULL";
