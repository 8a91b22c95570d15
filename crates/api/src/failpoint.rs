//! Crash and pause injection for the crash tests, compiled in only with the `failpoints`
//! feature. Without it, [`hit`] is an empty inline function and the variables do nothing.
//!
//! `PAYMENTS_CRASH_AT=<point>` aborts the process at that point (`std::process::abort`: no
//! unwinding, no destructors, no flushing, like `kill -9`). `PAYMENTS_PAUSE_AT=<point>:<ms>`
//! sleeps there instead, to stage races between attempts.

/// The points of `POST /charges` where a crash or pause can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[expect(
    clippy::enum_variant_names,
    reason = "the names mirror the PAYMENTS_CRASH_AT values"
)]
pub enum Failpoint {
    /// The record is claimed; the processor has not been called.
    AfterClaim,
    /// The processor charged the card; the `charged` recovery point is not recorded yet.
    AfterCharge,
    /// The `charged` recovery point is recorded; the finishing transaction has not run.
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

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub async fn hit(_point: Failpoint) {}

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
