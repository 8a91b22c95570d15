//! The `payment.completed` event written to the outbox with every successful charge.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::{Charge, ChargeId, Currency, TenantId};

/// The event type name on the wire.
pub const PAYMENT_COMPLETED: &str = "payment.completed";

/// A charge succeeded. Consumers deduplicate on `event_id`: delivery is at least once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PaymentCompleted {
    pub event_id: Uuid,
    pub schema_version: u32,
    pub charge_id: ChargeId,
    #[serde(serialize_with = "serialize_tenant")]
    pub tenant: TenantId,
    pub amount: i64,
    pub currency: Currency,
    pub occurred_at: DateTime<Utc>,
}

impl PaymentCompleted {
    /// The payload's schema version; bumped on any incompatible change.
    pub const SCHEMA_VERSION: u32 = 1;

    pub fn for_charge(charge: &Charge) -> Self {
        Self {
            event_id: Uuid::new_v4(),
            schema_version: Self::SCHEMA_VERSION,
            charge_id: charge.id,
            tenant: charge.tenant.clone(),
            amount: charge.money.amount.minor_units(),
            currency: charge.money.currency,
            occurred_at: charge.created_at,
        }
    }
}

fn serialize_tenant<S: serde::Serializer>(tenant: &TenantId, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(tenant.as_str())
}
