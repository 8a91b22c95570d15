//! Crash and pause injection for the crash tests, compiled in only with the `failpoints`
//! feature. Without it, [`hit`] is an empty inline function and the variables do nothing.
//!
//! `PAYMENTS_CRASH_AT=<point>` aborts the process at that point (`std::process::abort`: no
//! unwinding, no destructors, no flushing, like `kill -9`). `PAYMENTS_PAUSE_AT=<point>:<ms>`
//! sleeps there instead, to stage races between attempts. `PAYMENTS_FAIL_AT=finish` makes the
//! finishing transaction fail as if the database had gone away, to reach the path that leaves
//! the `charged` recovery point behind.

/// The points of `POST /charges` where a crash or pause can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[expect(
    clippy::enum_variant_names,
    reason = "the names mirror the PAYMENTS_CRASH_AT values"
)]
pub enum Failpoint {
    /// The record is claimed and the operation prepared (a refund's amount reserved); the
    /// processor has not been called.
    AfterClaim,
    /// The processor made the effect (charged the card, refunded); the finishing transaction
    /// has not run.
    AfterCharge,
    /// The finishing transaction failed and the attempt recorded the `charged` recovery point
    /// instead; the client has not been answered.
    AfterRecordCharged,
    /// The finishing transaction committed; the client has not been answered.
    AfterCommit,
}

impl Failpoint {
    #[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
    fn name(self) -> &'static str {
        match self {
            Self::AfterClaim => "after_claim",
            Self::AfterCharge => "after_charge",
            Self::AfterRecordCharged => "after_charged",
            Self::AfterCommit => "after_commit",
        }
    }
}

/// The steps that can be made to fail (`PAYMENTS_FAIL_AT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
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
pub async fn hit(_point: Failpoint) {}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn fails(_step: Failure) -> bool {
    false
}

/// Whether `PAYMENTS_FAIL_AT` names `step`.
#[cfg(feature = "failpoints")]
pub fn fails(step: Failure) -> bool {
    let failing = std::env::var("PAYMENTS_FAIL_AT").is_ok_and(|at| at == step.name());
    if failing {
        tracing::warn!(failpoint = step.name(), "failpoint: failing the step");
    }
    failing
}

#[cfg(feature = "failpoints")]
pub async fn hit(point: Failpoint) {
    if std::env::var("PAYMENTS_CRASH_AT").is_ok_and(|at| at == point.name()) {
        eprintln!("failpoint: aborting at {}", point.name());
        std::process::abort();
    }
    if let Some(millis) = std::env::var("PAYMENTS_PAUSE_AT")
        .ok()
        .and_then(|spec| pause_millis(&spec, point))
    {
        tracing::warn!(failpoint = point.name(), millis, "failpoint: pausing");
        tokio::time::sleep(std::time::Duration::from_millis(millis)).await;
    }
}

/// `after_charge:1500` -> 1500 when `point` is `after_charge`.
#[cfg(feature = "failpoints")]
fn pause_millis(spec: &str, point: Failpoint) -> Option<u64> {
    let (name, millis) = spec.split_once(':')?;
    (name == point.name())
        .then(|| millis.parse().ok())
        .flatten()
}
