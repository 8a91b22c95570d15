//! `WorkerRepository`, written once for both backends over any [`SqlStore`]: the outbox
//! relay, which takes its rows each backend's own way (`SqlStore::relay`, in its `relay.rs`).
//! The completer's takeover and the reaper are the record store's.

use async_trait::async_trait;

use crate::repository::WorkerRepository;
use crate::sql_store::SqlStore;
use crate::stream::{EventSink, RelayError};

#[async_trait]
impl<S: SqlStore> WorkerRepository for S {
    async fn relay_outbox(&self, batch: i64, sink: &dyn EventSink) -> Result<usize, RelayError> {
        self.relay(batch, sink).await
    }
}
