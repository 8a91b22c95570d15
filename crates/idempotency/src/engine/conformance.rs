//! The conformance suite of the [`RecordStore`] port: the promises every record store keeps,
//! written once and run against each store (the in-memory one, and a SQL store on each of its
//! databases), as one suite of tests runs against every store of a session library.
//!
//! A store under test is a [`Subject`]: the store, the policy it was opened with, and a way to
//! move its clock on. [`record_store_conformance!`](crate::record_store_conformance) writes one
//! test per check for a subject:
//!
//! ```ignore
//! payments_idempotency::record_store_conformance!(MySubject::open().await);
//! ```
//!
//! Each check starts on an empty store of its own, and panics with the promise it found broken.

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, Utc};

use super::ports::{
    Begin, Claim, Claimed, Completion, End, Finish, Owner, RecordBatches, RecordStore, Unmade,
};
use crate::{Fingerprint, IdempotencyKey, IdempotencyPolicy, RecordState, Scope, StoredResponse};

/// A record store under test.
#[async_trait]
pub trait Subject: Send + Sync {
    type Store: RecordStore;

    /// The store, empty when the check starts.
    fn store(&self) -> &Self::Store;

    /// The policy the store was opened with.
    fn policy(&self) -> IdempotencyPolicy;

    /// Moves the store's clock `by` on: for a store that keeps its database's clock, every time
    /// it has stored moves `by` into the past instead.
    async fn advance(&self, by: Duration);
}

/// How long a call that must wait for a transaction is given to show that it does not.
const WAIT: Duration = Duration::from_millis(300);

/// The settle grace the completer's checks use.
const SETTLE_AFTER: Duration = Duration::from_secs(5);

fn scope() -> Scope {
    Scope {
        tenant: "acme".to_owned(),
        operation: "conformance.check".to_owned(),
    }
}

fn key() -> IdempotencyKey {
    IdempotencyKey::parse("conformance-key").unwrap_or_else(|e| panic!("{e}"))
}

fn fingerprint(amount: u64) -> Fingerprint {
    let body = serde_json::json!({ "amount": amount });
    Fingerprint::of_json_request("POST", "/checks", &body)
}

fn response(text: &str) -> StoredResponse {
    let version = crate::SchemaVersion::new(1);
    let headers = [("content-type", "application/json")];
    StoredResponse::new(version, 201, headers, text.as_bytes().to_vec())
}

/// Claims the key for the request of `amount`, which must win it.
async fn claim_owned<S: Subject>(subject: &S, amount: u64) -> Claimed {
    let claim = subject
        .store()
        .claim(&scope(), &key(), &fingerprint(amount), b"{}")
        .await
        .unwrap_or_else(|e| panic!("claim: {e}"));
    match claim {
        Claim::Owned(claimed) => claimed,
        other => panic!("the claim should own the record, got {other:?}"),
    }
}

/// Ends the record `owner` holds as `end` in a transaction of its own, committed if it took.
async fn end_alone<S: Subject>(subject: &S, owner: Owner<'_>, end: End<'_>) -> Completion {
    let store = subject.store();
    let begun = store.begin(owner, Begin::ENDING.alone()).await;
    let Some(mut transaction) = begun.unwrap_or_else(|e| panic!("begin: {e}")) else {
        return Completion::Fenced;
    };
    let completion = store
        .end(&mut transaction, owner, end)
        .await
        .unwrap_or_else(|e| panic!("end: {e}"));
    if completion != Completion::Fenced {
        store
            .commit(transaction)
            .await
            .unwrap_or_else(|e| panic!("commit: {e}"));
    }
    completion
}

/// A transaction over the record `owner` holds, from its beginning ([`Begin::HOLDING`]).
async fn begin<R: RecordStore>(store: &R, owner: Owner<'_>) -> Option<R::Transaction> {
    store
        .begin(owner, Begin::HOLDING)
        .await
        .unwrap_or_else(|e| panic!("begin: {e}"))
}

/// The record under the key, and the store's clock.
async fn record<S: Subject>(subject: &S) -> (crate::IdempotencyRecord, DateTime<Utc>) {
    subject
        .store()
        .find_record(&scope(), &key())
        .await
        .unwrap_or_else(|e| panic!("find: {e}"))
        .unwrap_or_else(|| panic!("no record under the key"))
}

/// Whether `future` is still waiting after [`WAIT`]; it may be awaited again afterwards.
async fn still_waiting<F: Future + Unpin>(future: &mut F) -> bool {
    tokio::time::timeout(WAIT, future).await.is_err()
}

/// Of concurrent claims of one fresh key, exactly one owns it; the others are told it is in
/// flight.
pub async fn exactly_one_of_concurrent_claims_owns_a_fresh_key<S: Subject>(subject: &S) {
    let (scope, key, fingerprint) = (scope(), key(), fingerprint(100));
    let claims = (0..8).map(|_| subject.store().claim(&scope, &key, &fingerprint, b"{}"));
    let claims = futures::future::join_all(claims).await;
    let claims: Vec<Claim> = claims
        .into_iter()
        .map(|claim| claim.unwrap_or_else(|e| panic!("claim: {e}")))
        .collect();
    let owners = claims
        .iter()
        .filter(|c| matches!(c, Claim::Owned(_)))
        .count();
    let in_flight = claims
        .iter()
        .filter(|c| matches!(c, Claim::InFlight { .. }))
        .count();
    assert_eq!((owners, in_flight), (1, 7), "{claims:?}");
}

/// A completed record is replayed: its response as stored, its generation and its expiry; a
/// request of another payload under the key is a mismatch.
pub async fn a_completed_record_replays_its_response_and_refuses_another_request<S: Subject>(
    subject: &S,
) {
    let claimed = claim_owned(subject, 100).await;
    let (scope, key) = (scope(), key());
    let owner = Owner::new(&scope, &key, claimed.fence());
    let stored = response("the first answer");
    let Completion::Stored { expires_at } = end_alone(subject, owner, End::Made(&stored)).await
    else {
        panic!("the owner's completion is fenced off");
    };

    let replay = subject
        .store()
        .claim(&scope, &key, &fingerprint(100), b"{}")
        .await
        .unwrap_or_else(|e| panic!("claim: {e}"));
    assert_eq!(
        replay,
        Claim::Replay {
            response: stored,
            generation: claimed.generation,
            expires_at,
        }
    );
    let other = subject
        .store()
        .claim(&scope, &key, &fingerprint(200), b"{}")
        .await
        .unwrap_or_else(|e| panic!("claim: {e}"));
    assert_eq!(other, Claim::Mismatch);
}

/// A record's retention counts from its completion, never from its claim.
pub async fn retention_counts_from_the_completion<S: Subject>(subject: &S) {
    let claimed = claim_owned(subject, 100).await;
    let held_for = Duration::from_secs(60 * 60);
    subject.advance(held_for).await;
    let (scope, key) = (scope(), key());
    let owner = Owner::new(&scope, &key, claimed.fence());
    let Completion::Stored { expires_at } =
        end_alone(subject, owner, End::Made(&response("late"))).await
    else {
        panic!("the owner's completion is fenced off");
    };
    let (record, now) = record(subject).await;
    assert_eq!(record.expires_at, expires_at);
    let ttl = TimeDelta::from_std(subject.policy().ttl).unwrap_or(TimeDelta::MAX);
    let from_claim = now + ttl - TimeDelta::from_std(held_for).unwrap_or(TimeDelta::MAX);
    assert!(
        expires_at > from_claim + TimeDelta::minutes(1),
        "retention counted from the claim: expires at {expires_at}, the store's clock at {now}"
    );
}

/// A stale record is taken over by the next claim, in its generation and under its effect
/// key; every write of the attempt it replaced writes nothing.
pub async fn a_stale_record_is_taken_over_and_its_old_attempt_writes_nothing<S: Subject>(
    subject: &S,
) {
    let first = claim_owned(subject, 100).await;
    subject
        .advance(subject.policy().lock_timeout + Duration::from_secs(1))
        .await;
    let second = claim_owned(subject, 100).await;
    assert!(second.took_over, "{second:?}");
    assert_eq!(second.attempt.0, first.attempt.0 + 1);
    assert_eq!(
        (second.generation, &second.effect_key),
        (first.generation, &first.effect_key)
    );

    let (scope, key) = (scope(), key());
    let old = Owner::new(&scope, &key, first.fence());
    let store = subject.store();
    let written = store.record_effect(old, "effect_old").await;
    assert_eq!(written.unwrap_or_else(|e| panic!("{e}")), Finish::Fenced);
    let released = store.release(old).await;
    assert_eq!(released.unwrap_or_else(|e| panic!("{e}")), Finish::Fenced);
    assert!(
        begin(store, old).await.is_none(),
        "a transaction over a record another attempt owns"
    );
    // A transaction begun to end the record is refused at once, or fenced at its end.
    let ending = store.begin(old, Begin::ENDING).await;
    if let Some(mut transaction) = ending.unwrap_or_else(|e| panic!("begin ending: {e}")) {
        let ended = store
            .end(&mut transaction, old, End::Made(&response("old")))
            .await;
        assert_eq!(ended.unwrap_or_else(|e| panic!("{e}")), Completion::Fenced);
    }
    let (record, _) = record(subject).await;
    assert_eq!(
        (record.attempts, record.effect_id, record.state),
        (second.attempt, None, RecordState::Pending)
    );
}

/// The record's end is fenced too: ended as an attempt that no longer owns the record, it
/// writes nothing, even in a transaction over the record.
pub async fn an_end_by_an_attempt_that_lost_the_record_writes_nothing<S: Subject>(subject: &S) {
    let first = claim_owned(subject, 100).await;
    subject
        .advance(subject.policy().lock_timeout + Duration::from_secs(1))
        .await;
    let second = claim_owned(subject, 100).await;
    let (scope, key) = (scope(), key());
    let (old, new) = (
        Owner::new(&scope, &key, first.fence()),
        Owner::new(&scope, &key, second.fence()),
    );
    let store = subject.store();
    let Some(mut transaction) = begin(store, new).await else {
        panic!("no transaction over the owner's own record");
    };
    for end in [
        End::Made(&response("old")),
        End::Unmade(Unmade::Answered(&response("old"))),
        End::Unmade(Unmade::Tombstoned),
    ] {
        let ended = store.end(&mut transaction, old, end).await;
        assert_eq!(ended.unwrap_or_else(|e| panic!("{e}")), Completion::Fenced);
    }
    drop(transaction);
    let (record, _) = record(subject).await;
    assert_eq!(
        (record.state, record.response),
        (RecordState::Pending, None)
    );
}

/// A transaction over a record holds it until it ends: a retry that would take the stale
/// record over waits, then replays what the transaction completed; the completer takes nothing
/// over.
pub async fn a_transaction_holds_its_record_until_it_ends<S: Subject>(subject: &S) {
    let claimed = claimed_past_its_lock_and_grace(subject).await;
    let (scope, key) = (scope(), key());
    let owner = Owner::new(&scope, &key, claimed.fence());
    let store = subject.store();
    let Some(mut transaction) = begin(store, owner).await else {
        panic!("no transaction over the owner's own record");
    };

    let fingerprint = fingerprint(100);
    let mut retry = pin!(store.claim(&scope, &key, &fingerprint, b"{}"));
    let mut completer = pin!(store.take_over_abandoned(SETTLE_AFTER));
    assert!(
        still_waiting(&mut retry).await,
        "a retry took the record over from an open transaction"
    );
    // The completer passes the record by, or waits for it.
    let passed_by = tokio::time::timeout(WAIT, &mut completer).await.ok();

    let stored = response("held");
    let ended = store.end(&mut transaction, owner, End::Made(&stored)).await;
    assert!(matches!(
        ended.unwrap_or_else(|e| panic!("{e}")),
        Completion::Stored { .. }
    ));
    // The commit runs beside the waiting retry and completer, as concurrent requests do: a
    // store that commits several transactions together may commit this one with theirs.
    let completing = async {
        match passed_by {
            Some(taken) => taken,
            None => completer.await,
        }
    };
    let (committed, retried, taken) =
        tokio::join!(store.commit(transaction), &mut retry, completing);
    committed.unwrap_or_else(|e| panic!("commit: {e}"));

    let retried = retried.unwrap_or_else(|e| panic!("claim: {e}"));
    assert!(
        matches!(&retried, Claim::Replay { response, .. } if *response == stored),
        "the retry should replay the completed record, got {retried:?}"
    );
    let taken = taken.unwrap_or_else(|e| panic!("take over: {e}"));
    assert!(taken.is_none(), "the completer took over {taken:?}");
    let (record, _) = record(subject).await;
    assert_eq!(
        (record.state, record.attempts),
        (RecordState::Completed, claimed.attempt)
    );
}

/// A transaction begun to end a record holds it from its end on at the latest
/// ([`Begin::ENDING`]): once the record is ended in it, no retry takes the record
/// over and the completer passes it by until the commit, after which the retry replays.
pub async fn a_transaction_ending_its_record_holds_it_from_its_end_on<S: Subject>(subject: &S) {
    let claimed = claimed_past_its_lock_and_grace(subject).await;
    let (scope, key) = (scope(), key());
    let owner = Owner::new(&scope, &key, claimed.fence());
    let store = subject.store();
    let begun = store.begin(owner, Begin::ENDING).await;
    let Some(mut transaction) = begun.unwrap_or_else(|e| panic!("begin ending: {e}")) else {
        panic!("no transaction to end the owner's own record");
    };
    let stored = response("ending");
    let ended = store.end(&mut transaction, owner, End::Made(&stored)).await;
    assert!(matches!(
        ended.unwrap_or_else(|e| panic!("{e}")),
        Completion::Stored { .. }
    ));

    let fingerprint = fingerprint(100);
    let mut retry = pin!(store.claim(&scope, &key, &fingerprint, b"{}"));
    assert!(
        still_waiting(&mut retry).await,
        "a retry took the record over from a transaction that ended it"
    );
    let (committed, retried) = tokio::join!(store.commit(transaction), &mut retry);
    committed.unwrap_or_else(|e| panic!("commit: {e}"));
    let retried = retried.unwrap_or_else(|e| panic!("claim: {e}"));
    assert!(
        matches!(&retried, Claim::Replay { response, .. } if *response == stored),
        "the retry should replay the completed record, got {retried:?}"
    );
    let (record, _) = record(subject).await;
    assert_eq!(
        (record.state, record.attempts),
        (RecordState::Completed, claimed.attempt)
    );
}

/// A record claimed, its lock and the settle grace since passed: one that a retry would take
/// over and the completer would settle, but for a transaction that holds it.
async fn claimed_past_its_lock_and_grace<S: Subject>(subject: &S) -> Claimed {
    let claimed = claim_owned(subject, 100).await;
    subject
        .advance(subject.policy().lock_timeout + SETTLE_AFTER + Duration::from_secs(1))
        .await;
    claimed
}

/// A transaction dropped before its commit writes nothing, and lets its record go.
pub async fn a_dropped_transaction_writes_nothing<S: Subject>(subject: &S) {
    let claimed = claim_owned(subject, 100).await;
    let (scope, key) = (scope(), key());
    let owner = Owner::new(&scope, &key, claimed.fence());
    let store = subject.store();
    let Some(mut transaction) = begin(store, owner).await else {
        panic!("no transaction over the owner's own record");
    };
    let ended = store
        .end(&mut transaction, owner, End::Made(&response("dropped")))
        .await;
    assert!(matches!(
        ended.unwrap_or_else(|e| panic!("{e}")),
        Completion::Stored { .. }
    ));
    drop(transaction);

    let (record, _) = record(subject).await;
    assert_eq!(
        (record.state, record.response),
        (RecordState::Pending, None)
    );
    let stored = response("committed");
    let again = end_alone(subject, owner, End::Made(&stored)).await;
    assert!(
        matches!(again, Completion::Stored { .. }),
        "the record is still held: {again:?}"
    );
    assert_eq!(record_response(subject).await, Some(stored));
}

async fn record_response<S: Subject>(subject: &S) -> Option<StoredResponse> {
    record(subject).await.0.response
}

/// A record that holds an effect id never ends without that effect: neither completed with an
/// answer that made nothing, nor failed. It still completes with its effect.
pub async fn a_record_holding_an_effect_id_never_ends_without_it<S: Subject>(subject: &S) {
    let claimed = claim_owned(subject, 100).await;
    let (scope, key) = (scope(), key());
    let owner = Owner::new(&scope, &key, claimed.fence());
    let recorded = subject.store().record_effect(owner, "effect_1").await;
    assert_eq!(recorded.unwrap_or_else(|e| panic!("{e}")), Finish::Written);

    let declined = response("declined");
    for end in [
        End::Unmade(Unmade::Answered(&declined)),
        End::Unmade(Unmade::Tombstoned),
    ] {
        assert_eq!(end_alone(subject, owner, end).await, Completion::Fenced);
    }
    let (record, _) = record(subject).await;
    assert_eq!(
        (record.state, record.effect_id.as_deref()),
        (RecordState::Pending, Some("effect_1"))
    );
    let made = end_alone(subject, owner, End::Made(&response("made"))).await;
    assert!(matches!(made, Completion::Stored { .. }), "{made:?}");
}

/// A record whose effect's rows were refused for good ends completed with its answer, keeping
/// its effect id at the effect-made recovery point; every later claim replays that answer, even
/// past the record's retention, and never starts a new generation (which would make the effect
/// again under a new effect key).
pub async fn an_unrecorded_effect_is_replayed_and_kept_past_its_retention<S: Subject>(subject: &S) {
    let claimed = claim_owned(subject, 100).await;
    let (scope, key) = (scope(), key());
    let owner = Owner::new(&scope, &key, claimed.fence());
    let answer = response("unrecorded");
    let end = End::Unrecorded {
        effect_id: "effect_1",
        response: &answer,
    };
    let ended = end_alone(subject, owner, end).await;
    assert!(matches!(ended, Completion::Stored { .. }), "{ended:?}");
    let (kept, _) = record(subject).await;
    let kept = (kept.state, kept.recovery_point, kept.effect_id.as_deref());
    let effect_made = (RecordState::Completed, crate::RecoveryPoint::EffectMade);
    assert_eq!(kept, (effect_made.0, effect_made.1, Some("effect_1")));

    subject
        .advance(subject.policy().ttl + Duration::from_secs(60))
        .await;
    let claim = subject
        .store()
        .claim(&scope, &key, &fingerprint(100), b"{}")
        .await
        .unwrap_or_else(|e| panic!("claim: {e}"));
    match claim {
        Claim::Replay { response, .. } => assert_eq!(response, answer),
        other => panic!("a claim past the retention should replay the answer, got {other:?}"),
    }
    assert_eq!(record(subject).await.0.generation, claimed.generation);
}

/// A failed record is retried as a new generation, under a new effect key, in the same row.
pub async fn a_failed_record_starts_a_new_generation_under_a_new_effect_key<S: Subject>(
    subject: &S,
) {
    let first = claim_owned(subject, 100).await;
    let (scope, key) = (scope(), key());
    let owner = Owner::new(&scope, &key, first.fence());
    let failed = end_alone(subject, owner, End::Unmade(Unmade::Tombstoned)).await;
    assert!(matches!(failed, Completion::Stored { .. }), "{failed:?}");
    assert_eq!(record(subject).await.0.state, RecordState::Failed);

    let second = claim_owned(subject, 100).await;
    assert!(second.replaced, "{second:?}");
    assert_ne!(second.generation, first.generation);
    assert_ne!(second.effect_key, first.effect_key);
    assert!(
        begin(subject.store(), owner).await.is_none(),
        "the failed generation still owns the record"
    );
}

/// The completer takes over a released record only once the settle grace has passed since its
/// lock ended, fencing off the attempt that released it, with what it needs to settle it.
pub async fn the_completer_takes_over_a_released_record_only_after_the_settle_grace<S: Subject>(
    subject: &S,
) {
    let claimed = claim_owned(subject, 100).await;
    let (scope, key) = (scope(), key());
    let owner = Owner::new(&scope, &key, claimed.fence());
    let store = subject.store();
    let released = store.release(owner).await;
    assert_eq!(released.unwrap_or_else(|e| panic!("{e}")), Finish::Written);
    let early = store.take_over_abandoned(SETTLE_AFTER).await;
    assert!(
        early.unwrap_or_else(|e| panic!("{e}")).is_none(),
        "taken over within the settle grace"
    );

    subject.advance(SETTLE_AFTER + Duration::from_secs(1)).await;
    let taken = store.take_over_abandoned(SETTLE_AFTER).await;
    let Some(abandoned) = taken.unwrap_or_else(|e| panic!("{e}")) else {
        panic!("the released record was not taken over after the settle grace");
    };
    assert_eq!(
        (
            &abandoned.scope,
            &abandoned.key,
            abandoned.attempt.0,
            abandoned.generation,
            &abandoned.effect_key,
            abandoned.request_body.as_deref(),
        ),
        (
            &scope,
            &key,
            claimed.attempt.0 + 1,
            claimed.generation,
            &claimed.effect_key,
            Some(b"{}".as_slice()),
        )
    );
    assert!(
        begin(store, owner).await.is_none(),
        "the released attempt still owns the record"
    );
    let again = store.take_over_abandoned(SETTLE_AFTER).await;
    assert!(
        again.unwrap_or_else(|e| panic!("{e}")).is_none(),
        "one record taken over twice"
    );
}

/// The conformance checks of [`RecordBatches`], for a store that writes the finishes of
/// several records together: [`record_batches_conformance!`](crate::record_batches_conformance)
/// writes one test per check.
pub mod batches {
    use super::*;

    /// Claims the key named `name` for the request of `amount`, which must win it.
    async fn claim_named<S: Subject>(subject: &S, name: &str) -> (IdempotencyKey, Claimed) {
        let key = IdempotencyKey::parse(name).unwrap_or_else(|e| panic!("{e}"));
        let claim = subject
            .store()
            .claim(&scope(), &key, &fingerprint(100), b"{}")
            .await
            .unwrap_or_else(|e| panic!("claim: {e}"));
        match claim {
            Claim::Owned(claimed) => (key, claimed),
            other => panic!("the claim of {name} should own the record, got {other:?}"),
        }
    }

    /// Begins a batch and completes `records` in it, uncommitted.
    async fn complete_in_batch<R: RecordBatches>(
        store: &R,
        records: &[(Owner<'_>, &StoredResponse)],
    ) -> (R::Transaction, Vec<Completion>) {
        let begun = store.begin_batch().await;
        let mut transaction = begun.unwrap_or_else(|e| panic!("begin_batch: {e}"));
        let completed = store.complete_many(&mut transaction, records).await;
        let completed = completed.unwrap_or_else(|e| panic!("complete_many: {e}"));
        (transaction, completed)
    }

    async fn state_of<S: Subject>(subject: &S, key: &IdempotencyKey) -> crate::IdempotencyRecord {
        let found = subject.store().find_record(&scope(), key).await;
        let found = found.unwrap_or_else(|e| panic!("find: {e}"));
        found.unwrap_or_else(|| panic!("no record under {key}")).0
    }

    /// One transaction completes several records, each with its own response, and they are
    /// completed only once it commits.
    pub async fn a_batch_completes_its_records_at_its_commit<S>(subject: &S)
    where
        S: Subject,
        S::Store: RecordBatches,
    {
        let scope = scope();
        let (one, first) = claim_named(subject, "batch-one").await;
        let (two, second) = claim_named(subject, "batch-two").await;
        let (answer_one, answer_two) = (response("one"), response("two"));
        let store = subject.store();
        let records = [
            (Owner::new(&scope, &one, first.fence()), &answer_one),
            (Owner::new(&scope, &two, second.fence()), &answer_two),
        ];
        let (transaction, completed) = complete_in_batch(store, &records).await;
        assert!(
            completed
                .iter()
                .all(|c| matches!(c, Completion::Stored { .. })),
            "{completed:?}"
        );
        assert_eq!(
            state_of(subject, &one).await.state,
            RecordState::Pending,
            "completed before the batch committed"
        );
        let committed = store.commit(transaction).await;
        committed.unwrap_or_else(|e| panic!("commit: {e}"));
        for (key, answer) in [(&one, &answer_one), (&two, &answer_two)] {
            let record = state_of(subject, key).await;
            assert_eq!(record.state, RecordState::Completed, "{key}");
            assert_eq!(record.response.as_ref(), Some(answer), "{key}");
        }
    }

    /// A record of the batch that another attempt took over is fenced: it is not written, and
    /// the batch's other records are completed all the same.
    pub async fn a_record_taken_over_is_fenced_alone_in_its_batch<S>(subject: &S)
    where
        S: Subject,
        S::Store: RecordBatches,
    {
        let scope = scope();
        let (one, first) = claim_named(subject, "batch-one").await;
        subject
            .advance(subject.policy().lock_timeout + Duration::from_secs(1))
            .await;
        let (_, retry) = claim_named(subject, "batch-one").await;
        assert!(retry.took_over, "{retry:?}");
        let (two, second) = claim_named(subject, "batch-two").await;
        let answer = response("batch");
        let store = subject.store();
        let records = [
            (Owner::new(&scope, &one, first.fence()), &answer),
            (Owner::new(&scope, &two, second.fence()), &answer),
        ];
        let (transaction, completed) = complete_in_batch(store, &records).await;
        assert!(
            matches!(
                completed.as_slice(),
                [Completion::Fenced, Completion::Stored { .. }]
            ),
            "{completed:?}"
        );
        let committed = store.commit(transaction).await;
        committed.unwrap_or_else(|e| panic!("commit: {e}"));
        let taken = state_of(subject, &one).await;
        assert_eq!(
            (taken.state, taken.attempts),
            (RecordState::Pending, retry.attempt)
        );
        assert_eq!(state_of(subject, &two).await.state, RecordState::Completed);
    }

    /// A batch dropped before its commit writes nothing.
    pub async fn a_dropped_batch_writes_nothing<S>(subject: &S)
    where
        S: Subject,
        S::Store: RecordBatches,
    {
        let scope = scope();
        let (one, first) = claim_named(subject, "batch-one").await;
        let answer = response("dropped");
        let store = subject.store();
        let records = [(Owner::new(&scope, &one, first.fence()), &answer)];
        let (transaction, _) = complete_in_batch(store, &records).await;
        drop(transaction);
        let record = state_of(subject, &one).await;
        assert_eq!(
            (record.state, record.response),
            (RecordState::Pending, None)
        );
        // And the record is still its attempt's to end.
        let owner = Owner::new(&scope, &one, first.fence());
        let ended = end_alone(subject, owner, End::Made(&answer)).await;
        assert!(matches!(ended, Completion::Stored { .. }), "{ended:?}");
    }
}

/// Writes one test of each check of [`batches`] for the subject `$subject`, whose store
/// writes batches, in the module where it is called.
#[macro_export]
macro_rules! record_batches_conformance {
    ($subject:expr) => {
        $crate::record_batches_conformance!(@checks $subject;
            a_batch_completes_its_records_at_its_commit,
            a_record_taken_over_is_fenced_alone_in_its_batch,
            a_dropped_batch_writes_nothing,
        );
    };
    (@checks $subject:expr; $($check:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $check() {
                let subject = $subject.await;
                $crate::engine::conformance::batches::$check(&subject).await;
            }
        )*
    };
}

/// Writes one test of each check for the subject `$subject` (an expression, awaited, that
/// opens a fresh [`Subject`] for each test), in the module where it is called.
#[macro_export]
macro_rules! record_store_conformance {
    ($subject:expr) => {
        $crate::record_store_conformance!(@checks $subject;
            exactly_one_of_concurrent_claims_owns_a_fresh_key,
            a_completed_record_replays_its_response_and_refuses_another_request,
            retention_counts_from_the_completion,
            a_stale_record_is_taken_over_and_its_old_attempt_writes_nothing,
            an_end_by_an_attempt_that_lost_the_record_writes_nothing,
            a_transaction_holds_its_record_until_it_ends,
            a_transaction_ending_its_record_holds_it_from_its_end_on,
            a_dropped_transaction_writes_nothing,
            a_record_holding_an_effect_id_never_ends_without_it,
            an_unrecorded_effect_is_replayed_and_kept_past_its_retention,
            a_failed_record_starts_a_new_generation_under_a_new_effect_key,
            the_completer_takes_over_a_released_record_only_after_the_settle_grace,
        );
    };
    (@checks $subject:expr; $($check:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $check() {
                let subject = $subject.await;
                $crate::engine::conformance::$check(&subject).await;
            }
        )*
    };
}
