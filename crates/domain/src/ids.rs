//! Identifier newtypes, so a tenant is never passed where a charge id belongs.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};
use uuid::Uuid;

/// The tenant (merchant account) that owns every charge, key and ledger entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(String);

impl TenantId {
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A public id: a prefix naming the kind of object, then a UUID (`ch_…`, `re_…`, `po_…`).
macro_rules! prefixed_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Uuid);

        impl $name {
            const PREFIX: &'static str = $prefix;

            /// A new id, time-ordered (a UUID of version 7: the millisecond it is made, then
            /// random bits), so that the rows new ids name go to the end of each index rather
            /// than anywhere in it. It tells when it was made, as the object's `created` does.
            pub fn generate() -> Self {
                Self(Uuid::now_v7())
            }

            pub fn from_uuid(uuid: Uuid) -> Self {
                Self(uuid)
            }

            pub fn as_uuid(&self) -> Uuid {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}{}", Self::PREFIX, self.0.as_hyphenated())
            }
        }

        impl FromStr for $name {
            type Err = IdError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let uuid = s
                    .strip_prefix(Self::PREFIX)
                    .and_then(|rest| Uuid::try_parse(rest).ok())
                    .ok_or(IdError {
                        prefix: Self::PREFIX,
                    })?;
                Ok(Self(uuid))
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }
    };
}

prefixed_id!(
    /// A charge's public id: `ch_` followed by a UUID.
    ChargeId,
    "ch_"
);

prefixed_id!(
    /// A refund's public id: `re_` followed by a UUID.
    RefundId,
    "re_"
);

prefixed_id!(
    /// A payout's public id: `po_` followed by a UUID.
    PayoutId,
    "po_"
);

prefixed_id!(
    /// A reconciliation exception's public id: `exc_` followed by a UUID.
    ExceptionId,
    "exc_"
);

prefixed_id!(
    /// An event's public id: `evt_` followed by the UUID its stream entry carries as
    /// `event_id`, so that a consumer of both the stream and `GET /events` can tell repeats.
    EventId,
    "evt_"
);

/// The string is not the id's prefix followed by a UUID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an id here is `{prefix}` followed by a UUID")]
pub struct IdError {
    prefix: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// New rows go to the end of each index only if every id is made after the one before.
    #[test]
    fn a_new_id_sorts_after_every_id_made_before_it() {
        let ids: Vec<ChargeId> = (0..10_000).map(|_| ChargeId::generate()).collect();
        assert!(
            ids.windows(2).all(|pair| pair[0] < pair[1]),
            "ids made one after the other are in order"
        );
        assert_eq!(ids[0].as_uuid().get_version_num(), 7);
    }

    #[test]
    fn ids_round_trip_through_their_text_form() -> Result<(), IdError> {
        let id = ChargeId::generate();
        assert_eq!(id.to_string().parse::<ChargeId>()?, id);
        assert!(id.to_string().starts_with("ch_"));
        let id = RefundId::generate();
        assert_eq!(id.to_string().parse::<RefundId>()?, id);
        assert!(id.to_string().starts_with("re_"));
        let id = EventId::generate();
        assert_eq!(id.to_string().parse::<EventId>()?, id);
        assert!(id.to_string().starts_with("evt_"));
        Ok(())
    }

    #[test]
    fn charge_id_rejects_other_prefixes_and_garbage() {
        let uuid = Uuid::new_v4();
        assert!(format!("py_{uuid}").parse::<ChargeId>().is_err());
        assert!(uuid.to_string().parse::<ChargeId>().is_err());
        assert!("ch_".parse::<ChargeId>().is_err());
        assert!(format!("ch_{uuid}").parse::<RefundId>().is_err());
    }
}
