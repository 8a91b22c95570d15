//! The replay cache in front of the records: it can make a replay faster, never make a request
//! fail. A miss, or any cache failure, falls through to the records.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::error::error_chain;
use super::ports::{CacheCall, CacheRead, Outcome};
use super::{Answer, Engine, Idempotent, KeyedRequest, Operation, ProtocolError};
use crate::{Comparison, IdempotencyKey, Scope, StoredResponse};

impl<T: Send + 'static> Engine<T> {
    /// Serves a replay from the cache when it has one.
    pub(super) async fn cached_replay<O: Operation<Transaction = T>>(
        &self,
        op: &Idempotent<O>,
        scope: &Scope,
        request: &KeyedRequest<O::Request>,
    ) -> Option<Result<Answer, ProtocolError>> {
        let cache = self.cache.as_deref()?;
        match cache.get(scope, &request.key).await {
            // An entry outliving its record (the cache's clock behind) is a miss: the claim
            // judges the key by the store's clock, and replacing the record deletes the entry.
            Ok(CacheRead::Hit(hit)) if hit.expires_at <= Utc::now() => None,
            Ok(CacheRead::Hit(hit)) => match request.fingerprint.compare(&hit.fingerprint) {
                Comparison::Same => {
                    self.observer.outcome(Outcome::ReplayedCache);
                    Some(
                        self.replay(op, hit.generation, hit.response, hit.expires_at)
                            .await,
                    )
                }
                Comparison::Different => {
                    self.observer.outcome(Outcome::Mismatch);
                    Some(Err(ProtocolError::KeyReused))
                }
                Comparison::Incomparable => {
                    self.observer.outcome(Outcome::Incomparable);
                    Some(Err(ProtocolError::KeyIncomparable))
                }
            },
            Ok(CacheRead::Miss) => None,
            Ok(CacheRead::Rejected(rejection)) => {
                // Someone with write access to the cache, or a build with another secret,
                // wrote it: never served, and the records answer instead (and overwrite it if
                // the key has a final answer).
                self.observer.cache_rejected();
                tracing::warn!(
                    idempotency.tenant = %scope.tenant,
                    idempotency.operation = %scope.operation,
                    idempotency.key = %request.key,
                    reason = %rejection,
                    "replay cache entry rejected; using the records"
                );
                None
            }
            Err(error) => {
                self.observer.cache_failed(CacheCall::Get);
                tracing::warn!(error = %error_chain(error.as_ref()), "replay cache read failed; using the records");
                None
            }
        }
    }

    /// Puts a final response in the replay cache until the record's own expiry, an absolute
    /// time from the store's clock; the cache expires the entry at that instant by its own
    /// clock, which NTP keeps far closer to the store's than the retention is long.
    pub(super) async fn remember<R>(
        &self,
        scope: &Scope,
        request: &KeyedRequest<R>,
        generation: Uuid,
        response: &StoredResponse,
        expires_at: DateTime<Utc>,
    ) {
        let Some(cache) = self.cache.as_deref() else {
            return;
        };
        if let Err(error) = cache
            .put(
                scope,
                &request.key,
                generation,
                &request.fingerprint,
                response,
                expires_at,
            )
            .await
        {
            self.observer.cache_failed(CacheCall::Put);
            tracing::warn!(error = %error_chain(error.as_ref()), "replay cache write failed");
        }
    }

    /// Drops the cached response of a generation the claim just replaced. The entry expires
    /// with its record anyway; this covers clocks that disagree.
    pub(super) async fn forget(&self, scope: &Scope, key: &IdempotencyKey) {
        let Some(cache) = self.cache.as_deref() else {
            return;
        };
        if let Err(error) = cache.forget(scope, key).await {
            self.observer.cache_failed(CacheCall::Forget);
            tracing::warn!(error = %error_chain(error.as_ref()), "replay cache delete failed");
        }
    }
}
