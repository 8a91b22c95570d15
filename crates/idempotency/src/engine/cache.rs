//! The answers in front of the records: this process's recent answers first, then the replay
//! cache. They can make a replay faster, never make a request fail: a miss, or any cache
//! failure, falls through to the records.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::error::error_chain;
use super::ports::{CacheCall, CacheRead, CachedReplay, Outcome};
use super::{Answer, Engine, Idempotent, KeyedRequest, Operation, ProtocolError, scope_of};
use crate::{Comparison, IdempotencyKey, Scope, StoredResponse, Verbatim};

impl<T: Send + 'static> Engine<T> {
    /// Serves a replay from this process's recent answers, or else from the replay cache,
    /// when either holds one for the request's key: what [`Engine::run`] does first. It writes
    /// nothing but this process's recent answers (a cache's answer is copied there), so a
    /// caller may stop waiting for it at any point, and needs no task of its own to run it on,
    /// as the rest of `run` does ([`run_past_caches`](Engine::run_past_caches)).
    pub async fn replay_cached<O: Operation<Transaction = T>>(
        &self,
        op: &Idempotent<O>,
        request: &KeyedRequest<O::Request>,
    ) -> Option<Result<Answer, ProtocolError>> {
        let scope = &scope_of::<O>(&request.tenant);
        if let Some(answer) = self.recent_replay(op, scope, request).await {
            return Some(answer);
        }
        let cache = self.cache.as_deref()?;
        match cache.get(scope, &request.key).await {
            // An entry outliving its record (the cache's clock behind) is a miss: the claim
            // judges the key by the store's clock, and replacing the record deletes the entry.
            Ok(CacheRead::Hit(hit)) if hit.expires_at <= Utc::now() => None,
            Ok(CacheRead::Hit(hit)) => {
                if let Some(recent) = &self.recent {
                    let totals = recent.put(scope, &request.key, hit.clone());
                    self.observer.recent_answers(totals);
                }
                Some(
                    self.serve(op, scope, request, hit, Outcome::ReplayedCache)
                        .await,
                )
            }
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

    /// Serves a replay from this process's recent answers to `tenant`'s request under `key`
    /// sent as `verbatim`, if the answer held for `key` was made for, or already replayed to, a
    /// request sent byte for byte the same: before the request is parsed, validated or
    /// fingerprinted, which its first sending already was. Otherwise `None`, and the request
    /// goes the whole way ([`replay_cached`](Self::replay_cached), then
    /// [`run_past_caches`](Engine::run_past_caches)).
    pub async fn replay_verbatim<O: Operation<Transaction = T>>(
        &self,
        op: &Idempotent<O>,
        tenant: &str,
        key: &IdempotencyKey,
        verbatim: &Verbatim,
    ) -> Option<Result<Answer, ProtocolError>> {
        let scope = scope_of::<O>(tenant);
        let hit = self
            .recent
            .as_ref()?
            .get_verbatim(&scope, key, verbatim, Utc::now())?;
        self.observer.outcome(Outcome::ReplayedMemory);
        Some(
            self.replay(op, hit.generation, hit.response, hit.expires_at)
                .await,
        )
    }

    async fn recent_replay<O: Operation<Transaction = T>>(
        &self,
        op: &Idempotent<O>,
        scope: &Scope,
        request: &KeyedRequest<O::Request>,
    ) -> Option<Result<Answer, ProtocolError>> {
        let hit = self.recent.as_ref()?.get(scope, &request.key, Utc::now())?;
        Some(
            self.serve(op, scope, request, hit, Outcome::ReplayedMemory)
                .await,
        )
    }

    /// A held answer, for a request under its key: its replay when the request is the same
    /// one, a refusal when it is not, exactly as the records would answer.
    async fn serve<O: Operation<Transaction = T>>(
        &self,
        op: &Idempotent<O>,
        scope: &Scope,
        request: &KeyedRequest<O::Request>,
        hit: CachedReplay,
        outcome: Outcome,
    ) -> Result<Answer, ProtocolError> {
        match request.fingerprint.compare(&hit.fingerprint) {
            Comparison::Same => {
                self.vouch(scope, request, hit.generation);
                self.observer.outcome(outcome);
                self.replay(op, hit.generation, hit.response, hit.expires_at)
                    .await
            }
            Comparison::Different => {
                self.observer.outcome(Outcome::Mismatch);
                Err(ProtocolError::KeyReused)
            }
            Comparison::Incomparable => {
                self.observer.outcome(Outcome::Incomparable);
                Err(ProtocolError::KeyIncomparable)
            }
        }
    }

    /// Holds a final response among this process's recent answers and puts it in the replay
    /// cache, both until the record's own expiry, an absolute time from the store's clock;
    /// each expires the entry at that instant by its own clock, which NTP keeps far closer to
    /// the store's than the retention is long.
    pub(super) async fn remember<R>(
        &self,
        scope: &Scope,
        request: &KeyedRequest<R>,
        generation: Uuid,
        response: &StoredResponse,
        expires_at: DateTime<Utc>,
    ) {
        if let Some(recent) = &self.recent {
            let held = CachedReplay {
                generation,
                fingerprint: request.fingerprint.to_stored(),
                response: response.clone(),
                expires_at,
            };
            let totals = recent.put(scope, &request.key, held);
            self.observer.recent_answers(totals);
            self.vouch(scope, request, generation);
        }
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

    /// Notes, among the recent answers, that `request` as it was sent is answered by the
    /// answer of `generation`: it made that answer, or its fingerprint was judged the same.
    fn vouch<R>(&self, scope: &Scope, request: &KeyedRequest<R>, generation: Uuid) {
        if let (Some(recent), Some(verbatim)) = (&self.recent, request.verbatim) {
            recent.vouch(scope, &request.key, generation, verbatim);
        }
    }

    /// Drops the cached response of a generation the claim just replaced. The entry expires
    /// with its record anyway; this covers clocks that disagree.
    pub(super) async fn forget(&self, scope: &Scope, key: &IdempotencyKey) {
        if let Some(recent) = &self.recent {
            let totals = recent.forget(scope, key);
            self.observer.recent_answers(totals);
        }
        let Some(cache) = self.cache.as_deref() else {
            return;
        };
        if let Err(error) = cache.forget(scope, key).await {
            self.observer.cache_failed(CacheCall::Forget);
            tracing::warn!(error = %error_chain(error.as_ref()), "replay cache delete failed");
        }
    }
}
