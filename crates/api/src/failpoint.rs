//! Crash and pause injection for the crash tests, compiled in only with the `failpoints`
//! feature. Without it, [`hit`] is an empty inline function and the variables do nothing.
//!
//! `PAYMENTS_CRASH_AT=<point>` aborts the process at that point (`std::process::abort`: no
//! unwinding, no destructors, no flushing, like `kill -9`). `PAYMENTS_PAUSE_AT=<point>:<ms>`
//! sleeps there instead, to stage races between attempts. `PAYMENTS_FAIL_AT=finish` makes the
//! finishing transaction fail as if the database had gone away, to reach the path that leaves
//! the `charged` recovery point behind.

use payments_idempotency::engine::Checkpoint;
use payments_storage::GroupCommit;

/// The engine's checkpoints by the names `PAYMENTS_CRASH_AT` and `PAYMENTS_PAUSE_AT` take.
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
fn name(point: Checkpoint) -> &'static str {
    match point {
        Checkpoint::AfterClaim => "after_claim",
        Checkpoint::AfterEffect => "after_charge",
        Checkpoint::AfterRecordEffect => "after_charged",
        Checkpoint::AfterCommit => "after_commit",
    }
}

/// The steps that can be made to fail (`PAYMENTS_FAIL_AT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The finishing transaction of a charge.
    Finish,
}

impl Failure {
    #[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
    fn name(self) -> &'static str {
        match self {
            Self::Finish => "finish",
        }
    }
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) async fn hit(_point: Checkpoint) {}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn fails(_step: Failure) -> bool {
    false
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn in_group_commit(_commit: GroupCommit) {}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn after_group_commit_of_claims(_commit: GroupCommit) {}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn in_batch_of_finishes(_finishes: usize) {}

/// `PAYMENTS_CRASH_AT=in_batch_of_finishes` aborts once a batch of at least two finishes of
/// one operation (charges, refunds or payouts) is written on PostgreSQL, before its commit:
/// their records are completed and their rows written in a transaction that is never
/// committed.
#[cfg(feature = "failpoints")]
pub(crate) fn in_batch_of_finishes(finishes: usize) {
    if finishes >= 2 {
        crash_if_at(
            "in_batch_of_finishes",
            format_args!("in a batch of {finishes} finishes"),
        );
    }
}

/// `PAYMENTS_CRASH_AT=in_group_commit` aborts just before a group commit on SQLite that holds
/// at least two records' transactions: their operations' rows and their records' ends are
/// written, and none is committed.
#[cfg(feature = "failpoints")]
pub(crate) fn in_group_commit(commit: GroupCommit) {
    if commit.records >= 2 {
        let writes = commit.writes;
        crash_if_at(
            "in_group_commit",
            format_args!("in a group commit of {writes} writes"),
        );
    }
}

/// `PAYMENTS_CRASH_AT=after_group_commit_of_claims` aborts once a group commit of at least two
/// fresh claims and nothing else is made (on PostgreSQL, one statement of claims), before any
/// of them hears it: their records are pending, and no effect was asked for.
#[cfg(feature = "failpoints")]
pub(crate) fn after_group_commit_of_claims(commit: GroupCommit) {
    if commit.records == 0 && commit.writes >= 2 {
        let claims = commit.writes;
        crash_if_at(
            "after_group_commit_of_claims",
            format_args!("after a group commit of {claims} claims"),
        );
    }
}

/// Aborts the process if `PAYMENTS_CRASH_AT` names `point`, saying where (`place`).
#[cfg(feature = "failpoints")]
fn crash_if_at(point: &str, place: std::fmt::Arguments<'_>) {
    if std::env::var("PAYMENTS_CRASH_AT").is_ok_and(|at| at == point) {
        eprintln!("failpoint: aborting {place}");
        std::process::abort();
    }
}

/// Whether `PAYMENTS_FAIL_AT` names `step`.
#[cfg(feature = "failpoints")]
pub(crate) fn fails(step: Failure) -> bool {
    let failing = std::env::var("PAYMENTS_FAIL_AT").is_ok_and(|at| at == step.name());
    if failing {
        tracing::warn!(failpoint = step.name(), "failpoint: failing the step");
    }
    failing
}

#[cfg(feature = "failpoints")]
pub(crate) async fn hit(point: Checkpoint) {
    crash_if_at(name(point), format_args!("at {}", name(point)));
    if let Some(millis) = std::env::var("PAYMENTS_PAUSE_AT")
        .ok()
        .and_then(|spec| pause_millis(&spec, point))
    {
        tracing::warn!(failpoint = name(point), millis, "failpoint: pausing");
        tokio::time::sleep(std::time::Duration::from_millis(millis)).await;
    }
}

/// `after_charge:1500` -> 1500 when `point` is `after_charge`.
#[cfg(feature = "failpoints")]
fn pause_millis(spec: &str, point: Checkpoint) -> Option<u64> {
    let (at, millis) = spec.split_once(':')?;
    (at == name(point)).then(|| millis.parse().ok()).flatten()
}
