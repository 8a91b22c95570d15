//! What the handlers of the API's resources share: running an idempotent request through the
//! engine on an attempt that outlives its client, finding a tenant's object by the id its path
//! names, and the paging of a list.

use std::sync::Arc;

use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use payments_idempotency::Verbatim;
use payments_idempotency::engine::{Idempotent, KeyedRequest, Operation};
use payments_storage::{StoreError, Transaction};

use crate::extract::KeyedCall;
use crate::replay::respond;
use crate::{ApiError, AppState};

/// Runs the request of `op` that `validate` makes of the call's `body` through the engine under
/// the call's key, and answers with what it gives. `validate` gives the typed request and the
/// body as the client sent it, parsed (records from before request versions were
/// fingerprinted over it); the fingerprint covers the operation's canonical form of the
/// request (with its route), which is stored with the record for the completer.
///
/// A retry sent byte for byte as a request this instance answered or replayed lately (its
/// target and body) is replayed before `validate` runs: it was validated and judged the first
/// time. A replay from this instance's recent answers is served here too; anything else runs on a task of
/// its own, which holds the request's in-flight slots until it ends, and which the service waits
/// for when it stops. A client that goes away (its own timeout, a closed connection, a reset
/// HTTP/2 stream) and the request timeout end only the wait for the answer, never the attempt:
/// stopped halfway, an attempt would leave a charge the processor made unrecorded and its key
/// locked, until a retry took the lock over or the completer settled it.
pub(crate) async fn run_idempotent<O, Validated>(
    state: &AppState,
    op: &Arc<Idempotent<O>>,
    call: impl Into<KeyedCall>,
    body: &[u8],
    validate: impl FnOnce() -> Validated,
) -> Result<axum::response::Response, ApiError>
where
    O: Operation<Transaction = Transaction>,
    Validated: Future<Output = Result<(O::Request, serde_json::Value), ApiError>>,
{
    let KeyedCall {
        owner,
        key,
        target,
        wait,
        admitted,
    } = call.into();
    let verbatim = Verbatim::of(&[target.as_str().as_bytes(), body]);
    if let Some(answer) = state
        .engine
        .replay_verbatim(op, &owner, &key, &verbatim)
        .await
    {
        return Ok(respond(answer?));
    }
    let (request, as_sent) = validate().await?;
    let request = KeyedRequest::of_sent::<O>(owner, key, request, &as_sent, wait).sent_as(verbatim);
    // A replay from the caches writes no record: it needs no task of its own.
    if let Some(answer) = state.engine.replay_cached(op, &request).await {
        return Ok(respond(answer?));
    }
    let (engine, op) = (Arc::clone(&state.engine), Arc::clone(op));
    let attempt = async move {
        let answer = engine.run_past_caches(&op, request).await;
        drop(admitted);
        answer
    };
    match state.attempts.run(attempt).await {
        Ok(answer) => Ok(respond(answer?)),
        // The runtime is going away: the attempt stopped where a crash would have.
        Err(stopped) => Err(ApiError::Internal(stopped.into())),
    }
}

/// The tenant's object the path names (`find` looks it up by its id), or 404: for another
/// tenant's object, an unknown one, and a segment that is not an id of its kind or does not
/// even decode (invalid UTF-8) alike.
pub(crate) async fn tenants<Id, T, Found>(
    id: Result<Path<String>, PathRejection>,
    object: &str,
    find: impl FnOnce(Id) -> Found,
) -> Result<T, ApiError>
where
    Id: std::str::FromStr,
    Found: Future<Output = Result<Option<T>, StoreError>>,
{
    let Path(id) = id.map_err(|_| ApiError::NotFound(format!("No such {object}.")))?;
    let not_found = || ApiError::NotFound(format!("No such {object}: {id}"));
    let id: Id = id.parse().map_err(|_| not_found())?;
    find(id).await?.ok_or_else(not_found)
}

/// The query of a list (`GET /charges`, `GET /events` with its type, and every other list): a
/// page size and a keyset cursor.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListParams {
    pub(crate) limit: Option<u32>,
    pub(crate) starting_after: Option<String>,
}

impl ListParams {
    const DEFAULT_LIMIT: u32 = 10;
    const MAX_LIMIT: u32 = 100;

    /// The page of `object`s that `read` finds for the checked limit and cursor; a cursor that
    /// `read` does not find among them is a 400.
    pub(crate) async fn page<Id, Page, Read>(
        &self,
        object: &str,
        read: impl FnOnce(u32, Option<Id>) -> Read,
    ) -> Result<Page, ApiError>
    where
        Id: std::str::FromStr,
        Read: Future<Output = Result<Option<Page>, StoreError>>,
    {
        let page = read(self.limit()?, self.starting_after(object)?).await?;
        page.ok_or_else(|| self.unknown_cursor(object))
    }

    fn limit(&self) -> Result<u32, ApiError> {
        let limit = self.limit.unwrap_or(Self::DEFAULT_LIMIT);
        if !(1..=Self::MAX_LIMIT).contains(&limit) {
            return Err(ApiError::InvalidRequest(format!(
                "limit: must be between 1 and {}, got {limit}",
                Self::MAX_LIMIT
            )));
        }
        Ok(limit)
    }

    /// The cursor, an id of the listed `object`s.
    fn starting_after<Id: std::str::FromStr>(&self, object: &str) -> Result<Option<Id>, ApiError> {
        self.starting_after
            .as_deref()
            .map(|id| id.parse().map_err(|_| self.unknown_cursor(object)))
            .transpose()
    }

    /// 400 for a cursor that is not one of the listed objects.
    fn unknown_cursor(&self, object: &str) -> ApiError {
        let id = self.starting_after.as_deref().unwrap_or_default();
        ApiError::InvalidRequest(format!("starting_after: no such {object}: {id}"))
    }
}
