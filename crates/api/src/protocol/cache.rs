//! The Redis replay cache in front of the records: it can make a replay faster, never make a
//! request fail. A miss, or any Redis failure, falls through to the database.

use chrono::{DateTime, Utc};
use payments_idempotency::{IdempotencyKey, Scope, StoredResponse};
use payments_storage::CacheRead;
use uuid::Uuid;

use super::{Answer, Attempt, Engine, ProtocolError};
use crate::error_chain;
use crate::metrics::{self, Outcome, RedisCall};

/// Serves a replay from Redis when it has one.
pub(super) async fn replay<R>(
    engine: Engine<'_>,
    scope: &Scope,
    attempt: &Attempt<R>,
) -> Option<Result<Answer, ProtocolError>> {
    let cache = engine.cache?;
    match cache.get(scope, &attempt.key).await {
        // An entry outliving its record (Redis's clock behind) is a miss: the claim judges the
        // key by the database's clock, and replacing the record deletes the entry.
        Ok(CacheRead::Hit(hit)) if hit.expires_at <= Utc::now() => None,
        Ok(CacheRead::Hit(hit)) if hit.fingerprint == attempt.fingerprint => {
            metrics::outcome(Outcome::ReplayedCache);
            Some(Ok(Answer::replayed(hit.response, hit.expires_at)))
        }
        Ok(CacheRead::Hit(_)) => {
            metrics::outcome(Outcome::Mismatch);
            Some(Err(ProtocolError::KeyReused))
        }
        Ok(CacheRead::Miss) => None,
        Ok(CacheRead::Rejected(rejection)) => {
            // Someone with write access to Redis, or a build with another secret, wrote it:
            // never served, and the database answers instead (and overwrites it if the key
            // has a final answer).
            metrics::replay_cache_rejected();
            tracing::warn!(
                idempotency.tenant = %scope.tenant,
                idempotency.operation = %scope.operation,
                idempotency.key = %attempt.key,
                reason = %rejection,
                "replay cache entry rejected; using the database"
            );
            None
        }
        Err(error) => {
            metrics::redis_error(RedisCall::CacheGet);
            tracing::warn!(error = %error_chain(&error), "replay cache read failed; using the database");
            None
        }
    }
}

/// Puts a final response in the replay cache until the record's own expiry, an absolute
/// time from the database's clock; Redis expires the entry at that instant by its own clock,
/// which NTP keeps far closer to the database's than the retention is long.
pub(super) async fn remember<R>(
    engine: Engine<'_>,
    scope: &Scope,
    attempt: &Attempt<R>,
    generation: Uuid,
    response: &StoredResponse,
    expires_at: DateTime<Utc>,
) {
    let Some(cache) = engine.cache else { return };
    if let Err(error) = cache
        .put(
            scope,
            &attempt.key,
            generation,
            &attempt.fingerprint,
            response,
            expires_at,
        )
        .await
    {
        metrics::redis_error(RedisCall::CachePut);
        tracing::warn!(error = %error_chain(&error), "replay cache write failed");
    }
}

/// Drops the cached response of a generation the claim just replaced. The entry expires with
/// its record anyway; this covers clocks that disagree.
pub(super) async fn forget(engine: Engine<'_>, scope: &Scope, key: &IdempotencyKey) {
    let Some(cache) = engine.cache else { return };
    if let Err(error) = cache.forget(scope, key).await {
        metrics::redis_error(RedisCall::CacheForget);
        tracing::warn!(error = %error_chain(&error), "replay cache delete failed");
    }
}
