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

/// A charge's public id: `ch_` followed by a UUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChargeId(Uuid);

impl ChargeId {
    const PREFIX: &'static str = "ch_";

    /// A new random id.
    pub fn generate() -> Self {
        Self(Uuid::new_v4())
    }

    pub fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl fmt::Display for ChargeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", Self::PREFIX, self.0.as_hyphenated())
    }
}

impl FromStr for ChargeId {
    type Err = ChargeIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let uuid = s
            .strip_prefix(Self::PREFIX)
            .and_then(|rest| Uuid::try_parse(rest).ok())
            .ok_or(ChargeIdError)?;
        Ok(Self(uuid))
    }
}

impl Serialize for ChargeId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// The string is not `ch_<uuid>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a charge id is `ch_` followed by a UUID")]
pub struct ChargeIdError;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charge_id_round_trips_through_its_text_form() -> Result<(), ChargeIdError> {
        let id = ChargeId::generate();
        assert_eq!(id.to_string().parse::<ChargeId>()?, id);
        assert!(id.to_string().starts_with("ch_"));
        Ok(())
    }

    #[test]
    fn charge_id_rejects_other_prefixes_and_garbage() {
        let uuid = Uuid::new_v4();
        assert!(format!("py_{uuid}").parse::<ChargeId>().is_err());
        assert!(uuid.to_string().parse::<ChargeId>().is_err());
        assert!("ch_".parse::<ChargeId>().is_err());
    }
}
