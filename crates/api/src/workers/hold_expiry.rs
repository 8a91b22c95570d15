//! The expiry of holds: a hold still uncaptured past its `capture_before` is canceled (reason
//! `expired`) by the same `charges.cancel` operation a client's cancel runs, under the key
//! `hold-expiry-<charge id>` in the hold's tenant, so that every instance's round, and every
//! retry of one, is the one record and the processor voids the hold at most once. A capture
//! that claimed the hold first is left to end it; a late capture meets the expired hold, or the
//! expiry's claim, and is refused: exactly one of the two ends a hold.

use payments_domain::{CancelRequest, CancellationReason, ChargeId, TenantId};
use payments_idempotency::IdempotencyKey;
use payments_idempotency::engine::{Answer, KeyedRequest};
use payments_storage::captures;

use crate::operations::cancel::CancelCharge;
use crate::operations::charge::now_to_the_microsecond;
use crate::{AppState, error_chain};

/// How many holds a round cancels at most.
const ROUND: i64 = 100;

/// The key the expiry of `charge` runs under.
pub(crate) fn key_of(charge: ChargeId) -> String {
    format!("hold-expiry-{charge}")
}

/// Cancels up to [`ROUND`] holds past their `capture_before`, one after the other.
pub(crate) async fn run_round(state: &AppState) {
    let expired = async {
        let mut transaction = state.store.records().begin_write().await?;
        let expired =
            captures::expired_holds(&mut transaction, now_to_the_microsecond(), ROUND).await?;
        transaction.commit().await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(expired)
    };
    let expired = match expired.await {
        Ok(expired) => expired,
        Err(error) => {
            tracing::warn!(error = %error_chain(error.as_ref()), "hold expiry: reading the expired holds failed");
            return;
        }
    };
    for (tenant, charge) in expired {
        let mut answer = cancel(state, &tenant, charge, key_of(charge)).await;
        // The key's record keeps a refusal (a capture claimed the hold between this round's
        // read and its cancel): that capture has since ended without taking the hold, or the
        // hold would not be read again. Or the key could not be run at all (a client took the
        // same key for another request of its own). Either way the expiry tries once more
        // under a key of this round's own: claims serialise, so at most one cancel voids.
        let refused = |done: &Answer| done.response.status >= 400;
        if answer.as_ref().is_none_or(refused) {
            let retry = format!("{}-{}", key_of(charge), chrono::Utc::now().timestamp());
            answer = cancel(state, &tenant, charge, retry).await;
        }
        if let Some(answer) = answer {
            tracing::info!(
                charge = %charge,
                status = answer.response.status,
                "hold expiry: a hold past its capture_before was canceled, or is ended already"
            );
        }
    }
}

/// Runs the expiry's cancel of `charge` under `key`; `None` when it did not end (logged; a
/// later round retries it).
async fn cancel(
    state: &AppState,
    tenant: &TenantId,
    charge: ChargeId,
    key: String,
) -> Option<Answer> {
    let key = IdempotencyKey::parse(&key).ok()?;
    let request = CancelRequest {
        charge,
        reason: Some(CancellationReason::Expired),
    };
    let request = KeyedRequest::of::<CancelCharge>(tenant.as_str().to_owned(), key, request, None);
    match state.engine.run(&state.operations.cancels, request).await {
        Ok(answer) => Some(answer),
        Err(error) => {
            tracing::warn!(
                charge = %charge,
                error = %error,
                "hold expiry: the cancel did not end; a later round retries it"
            );
            None
        }
    }
}
