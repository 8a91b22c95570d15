//! The one decision every request carrying a key goes through.

use chrono::{DateTime, Utc};

use crate::{
    Comparison, Fingerprint, IdempotencyRecord, RecordState, RecoveryPoint, StoredResponse,
};

/// What a request must do, given the record stored under its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No record: claim the key and execute from the start.
    Execute,
    /// A previous attempt finished: send its response again.
    Replay(StoredResponse),
    /// Another attempt holds the lock: answer 409 and tell the client when to retry.
    InFlight { retry_after_secs: u64 },
    /// The key was used for a different request: answer 422, never execute.
    Mismatch,
    /// The key was used for a request of another request version of the operation, which
    /// this request cannot be compared with: answer 409, never execute.
    Incomparable,
    /// The previous attempt was abandoned (stale lock, or released after an unknown outcome):
    /// take the record over and continue from where it got to. The effect port key is kept, so
    /// an effect the earlier attempt made is found, not repeated.
    Resume { from: RecoveryPoint },
    /// The record failed: the effect port confirmed that nothing was made under its key and
    /// tombstoned that key. The same request starts a new generation of the record, with a
    /// new effect key.
    RetryFailed,
    /// The record outlived its retention: the key is fresh again, whatever the payload.
    ReplaceExpired,
}

/// Decides what to do with a request whose fingerprint is `fingerprint`, at time `now`.
///
/// Order matters. An expired record ([`IdempotencyRecord::is_expired`]: finished, and past its
/// retention) is gone as far as the client is concerned, so expiry is checked first. A
/// fingerprint mismatch is checked before anything is replayed or
/// resumed, so one request can never receive another's response or reuse its effect key.
pub fn decide(
    existing: Option<&IdempotencyRecord>,
    fingerprint: &Fingerprint,
    now: DateTime<Utc>,
) -> Decision {
    let Some(record) = existing else {
        return Decision::Execute;
    };
    if record.is_expired(now) {
        return Decision::ReplaceExpired;
    }
    match fingerprint.compare(&record.fingerprint) {
        Comparison::Same => {}
        Comparison::Different => return Decision::Mismatch,
        Comparison::Incomparable => return Decision::Incomparable,
    }
    match record.state {
        RecordState::Completed => match &record.response {
            Some(response) => Decision::Replay(response.clone()),
            // A completed record always has its response (a database CHECK enforces it);
            // resuming is the safe reading of one that does not: it replays nothing wrong.
            None => Decision::Resume {
                from: RecoveryPoint::EffectMade,
            },
        },
        // A failed record never holds an effect id today (the store refuses to fail one that
        // does); one written by an older version is finished from its effect, not retried.
        RecordState::Failed if record.holds_unrecorded_effect() => Decision::Resume {
            from: RecoveryPoint::EffectMade,
        },
        RecordState::Failed => Decision::RetryFailed,
        RecordState::Pending => match record.locked_until {
            Some(until) if until > now => Decision::InFlight {
                retry_after_secs: retry_after(until, now),
            },
            _ => Decision::Resume {
                from: record.recovery_point,
            },
        },
    }
}

/// Whole seconds until `until`, rounded up and at least 1, for a `Retry-After` header.
fn retry_after(until: DateTime<Utc>, now: DateTime<Utc>) -> u64 {
    let millis = (until - now).num_milliseconds().max(0);
    let secs = u64::try_from(millis).unwrap_or(0).div_ceil(1000);
    secs.max(1)
}

#[cfg(test)]
mod tests {
    use chrono::{Duration, TimeZone};
    use serde_json::json;

    use super::*;
    use crate::{Attempt, IdempotencyKey, Scope};

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0)
            .single()
            .unwrap_or_default()
    }

    fn fingerprint(amount: i64) -> Fingerprint {
        Fingerprint::of_json_request("POST", "/charges", &json!({ "amount": amount }))
    }

    fn response() -> StoredResponse {
        StoredResponse::new(
            crate::SchemaVersion::new(1),
            201,
            [("content-type", "application/json")],
            b"{\"id\":1}".to_vec(),
        )
    }

    fn record(
        state: RecordState,
        point: RecoveryPoint,
        locked_until: Option<DateTime<Utc>>,
    ) -> IdempotencyRecord {
        IdempotencyRecord {
            scope: Scope {
                tenant: "acme".into(),
                operation: "charges.create".into(),
            },
            key: IdempotencyKey::parse("k1").unwrap_or_else(|e| panic!("{e}")),
            fingerprint: fingerprint(100),
            state,
            generation: uuid::Uuid::nil(),
            recovery_point: point,
            locked_until,
            attempts: Attempt(1),
            effect_key: "pk".into(),
            effect_id: None,
            response: (state == RecordState::Completed).then(response),
            created_at: t0(),
            expires_at: t0() + Duration::hours(24),
        }
    }

    #[test]
    fn only_a_finished_record_past_its_retention_is_expired() {
        let after = t0() + Duration::hours(25);
        let before = t0() + Duration::hours(23);
        let completed = record(RecordState::Completed, RecoveryPoint::Finished, None);
        let failed = record(RecordState::Failed, RecoveryPoint::Started, None);
        let pending = record(RecordState::Pending, RecoveryPoint::Started, None);
        let mut failed_with_effect = failed.clone();
        failed_with_effect.effect_id = Some("ch_1".into());
        assert!(completed.is_expired(after) && failed.is_expired(after));
        assert!(!completed.is_expired(before) && !failed.is_expired(before));
        assert!(!pending.is_expired(after), "a pending record never expires");
        assert!(
            !failed_with_effect.is_expired(after),
            "a known effect must reach its rows first"
        );
    }

    #[test]
    fn no_record_executes() {
        assert_eq!(decide(None, &fingerprint(100), t0()), Decision::Execute);
    }

    #[test]
    fn a_completed_record_replays_its_response() {
        let rec = record(RecordState::Completed, RecoveryPoint::Finished, None);
        assert_eq!(
            decide(Some(&rec), &fingerprint(100), t0()),
            Decision::Replay(response())
        );
    }

    #[test]
    fn another_payload_under_the_same_key_is_a_mismatch_in_every_live_state() {
        for state in [
            RecordState::Pending,
            RecordState::Completed,
            RecordState::Failed,
        ] {
            let rec = record(
                state,
                RecoveryPoint::Started,
                Some(t0() + Duration::seconds(30)),
            );
            assert_eq!(
                decide(Some(&rec), &fingerprint(999), t0()),
                Decision::Mismatch,
                "{state}"
            );
        }
    }

    /// A request of another request version is never compared with the record's, whatever
    /// its state: neither replayed, resumed nor called a mismatch.
    #[test]
    fn a_request_of_another_request_version_is_incomparable_in_every_live_state() {
        let body = json!({ "amount": 100 });
        let next_version = Fingerprint::of_request(2, "POST", "/charges", &body, &body);
        for state in [
            RecordState::Pending,
            RecordState::Completed,
            RecordState::Failed,
        ] {
            let mut rec = record(state, RecoveryPoint::Started, Some(t0()));
            rec.fingerprint =
                Fingerprint::of_request(1, "POST", "/charges", &body, &body).to_stored();
            assert_eq!(
                decide(Some(&rec), &next_version, t0()),
                Decision::Incomparable,
                "{state}"
            );
        }
    }

    #[test]
    fn a_locked_pending_record_is_in_flight_with_retry_after_rounded_up() {
        let rec = record(
            RecordState::Pending,
            RecoveryPoint::Started,
            Some(t0() + Duration::milliseconds(2_100)),
        );
        assert_eq!(
            decide(Some(&rec), &fingerprint(100), t0()),
            Decision::InFlight {
                retry_after_secs: 3
            }
        );
    }

    #[test]
    fn retry_after_is_at_least_one_second() {
        let rec = record(
            RecordState::Pending,
            RecoveryPoint::Started,
            Some(t0() + Duration::milliseconds(1)),
        );
        assert_eq!(
            decide(Some(&rec), &fingerprint(100), t0()),
            Decision::InFlight {
                retry_after_secs: 1
            }
        );
    }

    #[test]
    fn a_stale_pending_record_is_resumed_from_its_recovery_point() {
        for point in [RecoveryPoint::Started, RecoveryPoint::EffectMade] {
            let rec = record(
                RecordState::Pending,
                point,
                Some(t0() - Duration::seconds(1)),
            );
            assert_eq!(
                decide(Some(&rec), &fingerprint(100), t0()),
                Decision::Resume { from: point }
            );
        }
    }

    #[test]
    fn the_lock_ends_exactly_at_locked_until() {
        let rec = record(RecordState::Pending, RecoveryPoint::Started, Some(t0()));
        assert_eq!(
            decide(Some(&rec), &fingerprint(100), t0()),
            Decision::Resume {
                from: RecoveryPoint::Started
            }
        );
    }

    #[test]
    fn a_failed_record_is_retried_as_a_new_generation() {
        let rec = record(RecordState::Failed, RecoveryPoint::Started, None);
        assert_eq!(
            decide(Some(&rec), &fingerprint(100), t0()),
            Decision::RetryFailed
        );
    }

    #[test]
    fn a_failed_record_holding_an_effect_id_is_finished_and_never_expires() {
        let mut rec = record(RecordState::Failed, RecoveryPoint::EffectMade, None);
        rec.effect_id = Some("sim_1".into());
        let later = t0() + Duration::hours(25);
        for now in [t0(), later] {
            assert_eq!(
                decide(Some(&rec), &fingerprint(100), now),
                Decision::Resume {
                    from: RecoveryPoint::EffectMade
                }
            );
        }
    }

    #[test]
    fn an_expired_finished_record_is_replaced_whatever_the_payload() {
        let later = t0() + Duration::hours(24);
        for state in [RecordState::Completed, RecordState::Failed] {
            let rec = record(state, RecoveryPoint::Finished, None);
            assert_eq!(
                decide(Some(&rec), &fingerprint(100), later),
                Decision::ReplaceExpired
            );
            assert_eq!(
                decide(Some(&rec), &fingerprint(999), later),
                Decision::ReplaceExpired
            );
        }
    }

    #[test]
    fn an_expired_pending_record_is_never_replaced_because_the_effect_may_have_been_made() {
        let later = t0() + Duration::hours(25);
        let rec = record(
            RecordState::Pending,
            RecoveryPoint::EffectMade,
            Some(t0() + Duration::seconds(30)),
        );
        assert_eq!(
            decide(Some(&rec), &fingerprint(100), later),
            Decision::Resume {
                from: RecoveryPoint::EffectMade
            }
        );
        assert_eq!(
            decide(Some(&rec), &fingerprint(999), later),
            Decision::Mismatch
        );
    }
}
