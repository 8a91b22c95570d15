//! The operations the protocol runs, one module each: what each one supplies (its request,
//! its effect at the processor, the writes of its finish), and nothing of the protocol.

pub mod charge;

use payments_storage::Abandoned;

use crate::AppState;
use crate::protocol::{self, Operation, Owner, ProtocolError};
use charge::CreateCharge;

/// Settles an abandoned record with the operation it was claimed for. A record of an operation
/// this build does not know is left alone (released), never failed: it may hold an effect.
pub async fn settle(state: &AppState, record: &Abandoned) -> Result<(), ProtocolError> {
    let engine = state.engine();
    let operation = record.scope.operation.as_str();
    if operation == CreateCharge::NAME {
        return protocol::settle::settle(engine, state.charges.as_ref(), record).await;
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
