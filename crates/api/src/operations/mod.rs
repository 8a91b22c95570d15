//! The operations the protocol runs, one module each: what each one supplies (its request,
//! its effect at the processor, the writes of its finish), and nothing of the protocol.

pub mod charge;
pub mod refund;

use payments_idempotency::StoredResponse;
use payments_storage::Abandoned;
use serde::Serialize;

use crate::AppState;
use crate::protocol::{self, Operation, Owner, ProtocolError};
use charge::CreateCharge;
use refund::CreateRefund;

/// Settles an abandoned record with the operation it was claimed for. A record of an operation
/// this build does not know is left alone (released), never failed: it may hold an effect.
pub async fn settle(state: &AppState, record: &Abandoned) -> Result<(), ProtocolError> {
    let engine = state.engine();
    let operation = record.scope.operation.as_str();
    if operation == CreateCharge::NAME {
        return protocol::settle::settle(engine, state.charges.as_ref(), record).await;
    }
    if operation == CreateRefund::NAME {
        return protocol::settle::settle(engine, state.refunds.as_ref(), record).await;
    }
    tracing::error!(idempotency.key = %record.key, idempotency.operation = operation,
        "completer: a record of an unknown operation; left pending");
    let owner = Owner {
        scope: &record.scope,
        key: &record.key,
        fence: record.fence(),
    };
    protocol::release(engine, owner).await
}

/// A 201 with `view` as its body and `location` as its `Location`, serialised once: the bytes
/// sent now are the bytes stored for replays.
pub(crate) fn created<V: Serialize>(
    view: &V,
    location: &str,
) -> Result<StoredResponse, ProtocolError> {
    let body = serde_json::to_vec(view).map_err(|e| ProtocolError::Internal(e.into()))?;
    Ok(StoredResponse::new(
        201,
        [("content-type", "application/json"), ("location", location)],
        body,
    ))
}
