//! Turning a stored response back into HTTP, with the engine's axum adapter
//! (`payments_idempotency_axum::respond`): the first answer and every replay are built from the
//! same bytes, with the replay marker, the schema version and the key's expiry added per
//! exchange.

use axum::response::Response;
use payments_idempotency::engine::Answer;

/// The statuses this service stores as final answers: 200 (an exception resolved), 201
/// (created), 400 (a refusal that depends on state, such as `refund_amount_too_large`), 402 (a
/// decline, or `charge_voided`), 404 (an exception that vanished under a resolution) and 409
/// (`exception_being_resolved`). A stored response with any other is not one this service
/// wrote, and is never sent.
const STORED_STATUSES: [u16; 6] = [200, 201, 400, 402, 404, 409];

/// Sends a stored answer: only a status of [`STORED_STATUSES`] and only the replayed headers.
pub(crate) fn respond(answer: Answer) -> Response {
    payments_idempotency_axum::respond(answer, &STORED_STATUSES)
}
