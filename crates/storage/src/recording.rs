//! The one `RecordRepository` implementation both backends use, [`impl_record_repository!`]:
//! the lock-free read, every fenced write of an owning attempt, and the steps of a claim under
//! the lock, with the statements of `claiming.rs` and `fenced.rs`.
//!
//! What really differs stays with each backend, as four methods of its store:
//! - `claim_under_lock(NewClaim)`: how a claim takes its lock (PostgreSQL: the insert on its
//!   own, then a short transaction reading the record `FOR UPDATE`; SQLite: all of it in one
//!   `BEGIN IMMEDIATE` transaction), built of the steps here (`insert_pending`,
//!   `read_record`, `act_on_locked`);
//! - `write_statement(statement)` and `write_completion(statement)`: where one write
//!   statement runs (PostgreSQL: on the pool, autocommit; SQLite: in a write transaction), giving the
//!   rows it changed or the expiry it returned;
//! - `write_charge(ChargeFinish)`: a charge's finish, for `ChargeRepository::finish_charge`
//!   (PostgreSQL: one statement gated on the completion; SQLite: the completion, then the
//!   inserts, in one transaction). The record's own methods here know no operation's tables.

use payments_domain::Charge;
use payments_idempotency::StoredResponse;

use crate::model::Owner;

/// A charge's finish: the charge and the response to complete the fenced record with.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChargeFinish<'a> {
    pub owner: Owner<'a>,
    pub charge: &'a Charge,
    pub response: &'a StoredResponse,
}

/// Implements `RecordRepository` for `$store`, whose `pool` and `policy` are those of database
/// `$db`, and which has the four backend methods named in this module's header.
macro_rules! impl_record_repository {
    ($store:ty, $db:ty) => {
        const _: () = {
            use chrono::{DateTime, Utc};
            use payments_idempotency::{
                Fingerprint, IdempotencyKey, IdempotencyRecord, Scope, StoredResponse,
            };

            use sqlx::QueryBuilder;
            use $crate::StoreError;
            use $crate::claiming::NewClaim;
            use $crate::model::{
                Claim, Claimed, Completion, Finish, Generation, Owner, TakenOver, Verdict,
            };
            use $crate::rows::RecordWithClock;
            use $crate::{claiming, fenced};

            type Connection = <$db as sqlx::Database>::Connection;

            impl $store {
                /// Runs a completing statement (`RETURNING expires_at`, fenced) on the caller's
                /// transaction: the write that ends a record, with what ends with it.
                pub(crate) async fn complete_on(
                    conn: &mut Connection,
                    sql: &mut QueryBuilder<'_, $db>,
                ) -> Result<Completion, StoreError> {
                    let expires_at: Option<DateTime<Utc>> =
                        sql.build_query_scalar().fetch_optional(conn).await?;
                    Ok(Completion::from_expiry(expires_at))
                }

                /// Inserts a fresh pending record on `conn`, unless the key exists: `None`
                /// then.
                async fn insert_pending(
                    &self,
                    conn: &mut Connection,
                    claim: &NewClaim<'_>,
                ) -> Result<Option<Claimed>, StoreError> {
                    let new = Generation::new();
                    let mut sql = claiming::insert_pending::<$db>(*claim, &new, self.policy);
                    let inserted: Option<i32> =
                        sql.build_query_scalar().fetch_optional(conn).await?;
                    Ok(inserted.map(|attempts| new.claimed(attempts)))
                }

                /// Reads a record and the database clock on `conn`, under a row lock when
                /// `lock` (see [`claiming::read_record`]).
                async fn read_record(
                    conn: &mut Connection,
                    scope: &Scope,
                    key: &IdempotencyKey,
                    lock: bool,
                ) -> Result<Option<RecordWithClock>, StoreError> {
                    let mut sql = claiming::read_record::<$db>(scope, key, lock);
                    Ok(sql.build_query_as().fetch_optional(conn).await?)
                }

                /// Judges the record read under the lock and acts on it on `conn`: the answer
                /// it gives, its takeover ([`claiming::take_over`]), or a new generation in its
                /// row ([`claiming::replace`]). `None` if it is judged absent.
                async fn act_on_locked(
                    &self,
                    conn: &mut Connection,
                    found: RecordWithClock,
                    claim: &NewClaim<'_>,
                ) -> Result<Option<Claim>, StoreError> {
                    let record = found.row.into_record()?;
                    let (scope, key) = (claim.scope, claim.key);
                    let outcome = match Verdict::of(&record, claim.fingerprint, found.db_now) {
                        Verdict::Answer(answer) => answer,
                        Verdict::Resume(from) => {
                            let mut sql =
                                claiming::take_over::<$db>(scope, key, self.policy.lock_timeout);
                            let taken: TakenOver = sql.build_query_as().fetch_one(conn).await?;
                            Claim::Owned(taken.claimed(from, record.effect_id))
                        }
                        Verdict::Replace => {
                            let new = Generation::new();
                            let mut sql = claiming::replace::<$db>(*claim, &new, self.policy);
                            let attempts: i32 = sql.build_query_scalar().fetch_one(conn).await?;
                            Claim::Owned(new.replacing(attempts))
                        }
                        Verdict::Absent => return Ok(None),
                    };
                    Ok(Some(outcome))
                }
            }

            #[async_trait::async_trait]
            impl $crate::repository::RecordRepository for $store {
                async fn claim_exclusive(
                    &self,
                    scope: &Scope,
                    key: &IdempotencyKey,
                    fingerprint: &Fingerprint,
                    request_body: &[u8],
                ) -> Result<Claim, StoreError> {
                    self.claim_under_lock(NewClaim {
                        scope,
                        key,
                        fingerprint,
                        request_body,
                    })
                    .await
                }

                async fn find_record(
                    &self,
                    scope: &Scope,
                    key: &IdempotencyKey,
                ) -> Result<Option<(IdempotencyRecord, DateTime<Utc>)>, StoreError> {
                    let mut conn = self.pool.acquire().await?;
                    Self::read_record(&mut conn, scope, key, false)
                        .await?
                        .map(RecordWithClock::into_record)
                        .transpose()
                }

                async fn record_effect(
                    &self,
                    owner: Owner<'_>,
                    effect_id: &str,
                ) -> Result<Finish, StoreError> {
                    let sql = fenced::record_effect(owner, effect_id);
                    Ok(Finish::from_rows(self.write_statement(sql).await?))
                }

                async fn fail(&self, owner: Owner<'_>) -> Result<Finish, StoreError> {
                    let sql = fenced::fail(owner, self.policy.ttl);
                    Ok(Finish::from_rows(self.write_statement(sql).await?))
                }

                async fn release(&self, owner: Owner<'_>) -> Result<Finish, StoreError> {
                    let sql = fenced::release(owner);
                    Ok(Finish::from_rows(self.write_statement(sql).await?))
                }

                async fn complete_without_effect(
                    &self,
                    owner: Owner<'_>,
                    response: &StoredResponse,
                ) -> Result<Completion, StoreError> {
                    let sql = fenced::complete_without_effect(owner, response, self.policy.ttl)?;
                    self.write_completion(sql).await
                }
            }
        };
    };
}

pub(crate) use impl_record_repository;
