//! The expiry of holds: a hold still uncaptured past its `capture_before` is canceled (reason
//! `expired`) by the same `charges.cancel` operation a client's cancel runs, under the key
//! `hold-expiry-<charge id>` in the hold's tenant, so that every instance's round, and every
//! retry of one, is the one record and the processor voids the hold at most once. A capture
//! that claimed the hold first is left to end it; a late capture meets the expired hold, or the
//! expiry's claim, and is refused: exactly one of the two ends a hold.

use payments_domain::{CancelRequest, CancellationReason, ChargeId};
use payments_idempotency::IdempotencyKey;
use payments_idempotency::engine::KeyedRequest;
use payments_storage::captures;

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
        let Ok(key) = IdempotencyKey::parse(&key_of(charge)) else {
            continue;
        };
        let request = CancelRequest {
            charge,
            reason: Some(CancellationReason::Expired),
        };
        let request = KeyedRequest::of::<crate::operations::cancel::CancelCharge>(
            tenant.as_str().to_owned(),
            key,
            request,
            None,
        );
        match state.engine.run(&state.operations.cancels, request).await {
            Ok(answer) => tracing::info!(
                charge = %charge,
                status = answer.response.status,
                "hold expiry: a hold past its capture_before was canceled"
            ),
            Err(error) => tracing::warn!(
                charge = %charge,
                error = %error,
                "hold expiry: the cancel did not end; a later round retries it"
            ),
        }
    }
}
