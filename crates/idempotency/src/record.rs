//! The idempotency record: one per `(tenant, operation, key)`, and what it stores.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{Fingerprint, IdempotencyKey};

/// Where a key lives: a key is only ever compared with keys of the same tenant and operation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    pub tenant: String,
    /// The operation's family, without its schema version (`charges.create`,
    /// [`engine::Operation::FAMILY`](crate::engine::Operation::FAMILY)): every version of an
    /// operation shares its keys, so whether the effect already happened never depends on the
    /// build that answers.
    pub operation: String,
}

/// The version of an operation's schema (the shape of its answers), counting from 1. It is
/// kept with every stored response and decides how a replay is rendered, never whether the
/// effect already happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SchemaVersion(u32);

impl SchemaVersion {
    /// Version `version`; 0 is no version (a compile-time error in a `const`).
    pub const fn new(version: u32) -> Self {
        assert!(version >= 1, "schema versions count from 1");
        Self(version)
    }

    /// Version `version` as read back from a store: `None` for 0.
    pub fn from_stored(version: u32) -> Option<Self> {
        (version >= 1).then_some(Self(version))
    }

    pub fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for SchemaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The record's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordState {
    /// An attempt owns the record until `locked_until`, or it was abandoned.
    Pending,
    /// Finished with a response that is replayed until the record expires.
    Completed,
    /// Nothing was made, for good: the effect port tombstoned the record's effect key, so no
    /// call under it can ever make the effect. The next retry starts a new generation with a
    /// new effect key.
    Failed,
}

/// How far a pending operation got, so that a takeover resumes instead of starting again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecoveryPoint {
    /// Claimed; the effect port may or may not have been called.
    Started,
    /// The effect port confirmed the effect (stored as `charged`, the name it had when charges
    /// were the only operation); the local writes are still to do.
    EffectMade,
    /// The operation's rows and the response are committed.
    Finished,
}

/// A stored name that is not one of the known states or recovery points.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown stored value {0:?}")]
pub struct UnknownValue(pub String);

macro_rules! stored_names {
    ($ty:ty { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// The name stored in the database.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $name),+ }
            }
        }

        impl FromStr for $ty {
            type Err = UnknownValue;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($name => Ok(Self::$variant),)+
                    other => Err(UnknownValue(other.to_owned())),
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

stored_names!(RecordState { Pending => "pending", Completed => "completed", Failed => "failed" });
stored_names!(RecoveryPoint { Started => "started", EffectMade => "charged", Finished => "finished" });

/// The number of the attempt that claimed a record, counting from 1. It is also the fencing
/// token: an attempt may only write to the record while the record still holds its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Attempt(pub i32);

/// The response headers kept with a stored response (lower case). Everything else (`Date`,
/// `Set-Cookie`, request ids) belongs to one exchange and must not be replayed.
pub const REPLAYED_HEADERS: [&str; 2] = ["content-type", "location"];

/// A response as it is stored and replayed: plain data, no framework types.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// The schema version of the operation that wrote it: the shape of its body.
    pub schema_version: SchemaVersion,
    pub status: u16,
    /// Allow-listed headers only, names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl StoredResponse {
    /// Whether `status` is a final answer that may be stored and replayed: a success or a
    /// client error. Never an interim (1xx), a redirect, or a server error, which a retry
    /// should execute again rather than receive again.
    pub fn is_final_status(status: u16) -> bool {
        matches!(status, 200..=299 | 400..=499)
    }

    /// A response of schema version `schema_version`, keeping only the [`REPLAYED_HEADERS`] of
    /// `headers`.
    pub fn new<'a>(
        schema_version: SchemaVersion,
        status: u16,
        headers: impl IntoIterator<Item = (&'a str, &'a str)>,
        body: Vec<u8>,
    ) -> Self {
        let headers = headers
            .into_iter()
            .map(|(name, value)| (name.to_ascii_lowercase(), value.to_owned()))
            .filter(|(name, _)| REPLAYED_HEADERS.contains(&name.as_str()))
            .collect();
        Self {
            schema_version,
            status,
            headers,
            body,
        }
    }

    /// An RFC 9457 problem document of schema version `schema_version`: `status` with its
    /// reason phrase `title`, a stable snake_case `code` a client can branch on, and a
    /// `detail` a person can read. The answers the engine stores of its own making are these.
    pub fn problem(
        schema_version: SchemaVersion,
        (status, title): (u16, &str),
        code: &str,
        detail: &str,
    ) -> Self {
        let problem = serde_json::json!({
            "type": "about:blank", "title": title, "status": status,
            "detail": detail, "code": code,
        });
        let headers = [("content-type", PROBLEM_JSON)];
        Self::new(
            schema_version,
            status,
            headers,
            problem.to_string().into_bytes(),
        )
    }
}

/// The media type of an RFC 9457 problem document.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The stored record, as the decision function sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyRecord {
    pub scope: Scope,
    pub key: IdempotencyKey,
    pub fingerprint: Fingerprint,
    pub state: RecordState,
    /// The record's generation: the id of the resource its current request creates, new
    /// whenever the key starts a new request (a fresh claim, or a replaced expired or failed
    /// record). Every write is fenced by it, and a cached replay is bound to it.
    pub generation: Uuid,
    pub recovery_point: RecoveryPoint,
    /// Set while pending: the owning attempt's lock ends then.
    pub locked_until: Option<DateTime<Utc>>,
    pub attempts: Attempt,
    /// The key the effect is made under with every attempt of the generation, so that the
    /// effect's own port (the effect port) deduplicates them too.
    pub effect_key: String,
    /// The effect port's id of the effect (a charge, a refund) once the recovery point is
    /// `charged` or later.
    pub effect_id: Option<String>,
    /// Present exactly when the state is `completed`.
    pub response: Option<StoredResponse>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

impl IdempotencyRecord {
    /// Whether the record outlived its retention at `now`, so that its key is fresh again.
    ///
    /// Only a finished record expires. A pending one never does: the effect port may have made
    /// its effect, and only a resume (or the completer) may settle it. Nor does a failed record
    /// that holds an effect id: a known effect must reach the ledger first.
    pub fn is_expired(&self, now: DateTime<Utc>) -> bool {
        let finished = matches!(self.state, RecordState::Completed | RecordState::Failed);
        finished && !self.holds_unrecorded_effect() && self.expires_at <= now
    }

    /// A finished record holding an effect id that never reached the operation's rows: one
    /// completed with them refused for good ([`End::Unrecorded`]: its answer replayed, the
    /// record kept for an operator), or a failed one, written by no current version (the
    /// store refuses to fail such a record) and finished from its effect if ever found.
    ///
    /// [`End::Unrecorded`]: crate::engine::End::Unrecorded
    pub fn holds_unrecorded_effect(&self) -> bool {
        let unrecorded = match self.state {
            RecordState::Failed => true,
            RecordState::Completed => self.recovery_point == RecoveryPoint::EffectMade,
            RecordState::Pending => false,
        };
        unrecorded && self.effect_id.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_names_round_trip() {
        for state in [
            RecordState::Pending,
            RecordState::Completed,
            RecordState::Failed,
        ] {
            assert_eq!(state.as_str().parse(), Ok(state));
        }
        for point in [
            RecoveryPoint::Started,
            RecoveryPoint::EffectMade,
            RecoveryPoint::Finished,
        ] {
            assert_eq!(point.as_str().parse(), Ok(point));
        }
        assert!("done".parse::<RecordState>().is_err());
    }

    #[test]
    fn only_allow_listed_headers_are_stored() {
        let stored = StoredResponse::new(
            SchemaVersion::new(1),
            201,
            [
                ("Content-Type", "application/json"),
                ("Location", "/charges/ch_1"),
                ("Date", "Sun, 29 Nov 2026 10:00:00 GMT"),
                ("Set-Cookie", "session=1"),
                ("X-Request-Id", "abc"),
            ],
            b"{}".to_vec(),
        );
        assert_eq!(
            stored.headers,
            vec![
                ("content-type".to_owned(), "application/json".to_owned()),
                ("location".to_owned(), "/charges/ch_1".to_owned()),
            ]
        );
    }
}
