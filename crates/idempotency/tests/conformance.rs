//! The record-store port's conformance suite against the in-memory store (`engine::memory`),
//! the same checks the SQL stores pass on PostgreSQL and SQLite: once as it begins every
//! transaction, the record locked and its fence checked first, and once fencing the
//! transactions that end records at their end, as the PostgreSQL store does.

use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use payments_idempotency::IdempotencyPolicy;
use payments_idempotency::engine::conformance::Subject;
use payments_idempotency::engine::memory::MemoryRecords;

const POLICY: IdempotencyPolicy = IdempotencyPolicy {
    ttl: Duration::from_secs(24 * 60 * 60),
    lock_timeout: Duration::from_secs(30),
};

/// An empty in-memory store, its clock at now.
struct InMemory(MemoryRecords);

#[async_trait]
impl Subject for InMemory {
    type Store = MemoryRecords;

    fn store(&self) -> &MemoryRecords {
        &self.0
    }

    fn policy(&self) -> IdempotencyPolicy {
        POLICY
    }

    async fn advance(&self, by: Duration) {
        self.0.advance(by);
    }
}

async fn in_memory() -> InMemory {
    InMemory(MemoryRecords::new(POLICY, Utc::now()))
}

mod locking_first {
    payments_idempotency::record_store_conformance!(super::in_memory());
    payments_idempotency::record_batches_conformance!(super::in_memory());
}

mod fencing_at_the_end {
    payments_idempotency::record_store_conformance!(async {
        super::InMemory(
            super::MemoryRecords::new(super::POLICY, super::Utc::now()).fencing_at_the_end(),
        )
    });
    payments_idempotency::record_batches_conformance!(async {
        super::InMemory(
            super::MemoryRecords::new(super::POLICY, super::Utc::now()).fencing_at_the_end(),
        )
    });
}
