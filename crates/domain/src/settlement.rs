//! What ties the processor's books to the service's: the metadata the service sends with every
//! call, which the processor keeps with what it makes, and the settlement report, the
//! processor's own list of what it made on a day, each line carrying that metadata back.
//!
//! Reconciliation compares the two sides; this module only says what the processor reports.
//! The report is client-influenced text (the metadata is whatever a caller sent), so a reader
//! of it must treat every field as data, never as a reference it can trust.

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use uuid::Uuid;

use crate::{ChargeId, Money, PayoutId, ProcessorChargeStatus, ProcessorError, RefundId, TenantId};

/// Sent with a charge, a refund or a payout, and kept by the processor with what it makes: the
/// tenant, and the service's own id of what the call makes (`ch_…`, `re_…`, `po_…`), known
/// before the processor is called. A line of the settlement report can then be matched to the
/// service's record even when the service never learnt the processor's answer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProcessorMetadata {
    pub tenant: TenantId,
    /// Text rather than a typed id: the processor gives back whatever its caller sent, and a
    /// charge someone else made may name anything, or something that is not an id at all.
    pub resource_id: String,
}

impl ProcessorMetadata {
    /// The metadata of the charge `id` of `tenant`.
    pub fn charge(tenant: TenantId, id: ChargeId) -> Self {
        Self::new(tenant, id.to_string())
    }

    /// The metadata of the refund `id` of `tenant`.
    pub fn refund(tenant: TenantId, id: RefundId) -> Self {
        Self::new(tenant, id.to_string())
    }

    /// The metadata of the payout `id` of `tenant`.
    pub fn payout(tenant: TenantId, id: PayoutId) -> Self {
        Self::new(tenant, id.to_string())
    }

    /// Metadata as the processor reports it, whatever it names.
    pub fn new(tenant: TenantId, resource_id: impl Into<String>) -> Self {
        Self {
            tenant,
            resource_id: resource_id.into(),
        }
    }
}

/// What a line of the settlement report is. An authorisation is a `Charge` line (of what it
/// holds); what ends it is a line of its own: a `Capture` of what it took, or a `Void` of what it
/// released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SettlementKind {
    Charge,
    Refund,
    Payout,
    Capture,
    Void,
}

impl SettlementKind {
    pub const ALL: [Self; 5] = [
        Self::Charge,
        Self::Refund,
        Self::Payout,
        Self::Capture,
        Self::Void,
    ];

    /// The name in the report's `type` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Charge => "charge",
            Self::Refund => "refund",
            Self::Payout => "payout",
            Self::Capture => "capture",
            Self::Void => "void",
        }
    }

    /// Parses a `type` name; `None` for a kind this service does not know.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == name)
    }

    /// The service's id (`ch_…`, `re_…`, `po_…`) of the resource of this kind whose UUID is
    /// `uuid`: a capture or a void is of its charge, the hold it ended.
    pub fn resource_id(self, uuid: Uuid) -> String {
        match self {
            Self::Charge | Self::Capture | Self::Void => ChargeId::from_uuid(uuid).to_string(),
            Self::Refund => RefundId::from_uuid(uuid).to_string(),
            Self::Payout => PayoutId::from_uuid(uuid).to_string(),
        }
    }
}

/// One line of the settlement report: something the processor made, as it reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettlementLine {
    pub kind: SettlementKind,
    /// The processor's id of what it made.
    pub processor_id: String,
    /// The idempotency key it was made under.
    pub processor_key: String,
    pub money: Money,
    pub status: ProcessorChargeStatus,
    /// When it came into existence at the processor; the report's day is this date in UTC.
    pub created_at: DateTime<Utc>,
    /// As its caller sent it; `None` when the caller sent none.
    pub metadata: Option<ProcessorMetadata>,
}

/// The port that reads the processor's settlement report: apart from
/// [`CardProcessor`](crate::CardProcessor), because only reconciliation needs it.
#[async_trait]
pub trait SettlementReport: Send + Sync + std::fmt::Debug + 'static {
    /// Every charge (authorisations among them), refund, payout, capture and void the processor
    /// made on `date` (UTC), in the order it made them. A processor forgets what it made once its key window has passed, so a day
    /// is read soon after it ends (the previous day), well within any window. A report that
    /// cannot be read in full is [`ProcessorError::Unavailable`]: a partial report would show
    /// differences that do not exist.
    async fn settlement_report(
        &self,
        date: NaiveDate,
    ) -> Result<Vec<SettlementLine>, ProcessorError>;
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;

    #[test]
    fn kind_names_round_trip_and_unknown_names_are_none() {
        for (kind, name) in [
            (SettlementKind::Charge, "charge"),
            (SettlementKind::Refund, "refund"),
            (SettlementKind::Payout, "payout"),
            (SettlementKind::Capture, "capture"),
            (SettlementKind::Void, "void"),
        ] {
            assert_eq!(kind.as_str(), name);
            assert_eq!(SettlementKind::parse(name), Some(kind));
        }
        assert_eq!(SettlementKind::parse("Charge"), None);
        assert_eq!(SettlementKind::parse("transfer"), None);
    }

    #[test]
    fn metadata_names_the_resource_by_its_public_id() {
        let uuid = Uuid::new_v4();
        let tenant = TenantId::new("acme");
        let charge = ProcessorMetadata::charge(tenant.clone(), ChargeId::from_uuid(uuid));
        let refund = ProcessorMetadata::refund(tenant.clone(), RefundId::from_uuid(uuid));
        let payout = ProcessorMetadata::payout(tenant.clone(), PayoutId::from_uuid(uuid));
        assert_eq!(charge.resource_id, format!("ch_{uuid}"));
        assert_eq!(refund.resource_id, format!("re_{uuid}"));
        assert_eq!(payout.resource_id, format!("po_{uuid}"));
        assert_eq!(charge.tenant, tenant);
    }
}
