//! Group commit of claims on PostgreSQL: the claims of a process's concurrent requests go to
//! the database as one statement, `CLAIM_MANY`, and one commit. The statement inserts each
//! claim's pending record, and reads the record of each key that exists instead, without a
//! lock: a retry is answered from that read, with no statement of its own.
//!
//! A claim joins the queue; if no statement of the queue is being written, it starts a task
//! that writes the queue, up to [`MAX_CLAIMS`] claims a statement, until the queue is empty.
//! The claims that arrive while a statement is on its way are the next statement's. Nobody
//! waits for others to arrive: a lone claim is written at once. The task keeps its connection
//! from one statement to the next, and gives it back once the queue is empty.
//!
//! Each claim hears its own verdict: its key inserted (it owns the record), or not, with the
//! record the statement found (the store answers from it, or judges the key again under the
//! lock) or without one (another claim of the statement inserted the key first, or another
//! transaction while the statement ran: judged under the lock). A statement the database
//! refused, or that met a row another transaction held past the `lock_timeout`, is written
//! again claim by claim, so that one bad or held row fails or delays only its own request.
//! A key that exists is only read, never waited for: a record held by a transaction (an
//! instance frozen mid-finish) holds up no statement.
//! The task writes whether or not the requests still wait: a request that went away leaves its
//! record pending, as a dropped lone insert would.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use payments_idempotency::IdempotencyPolicy;
use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgPool, Row};
use tokio::sync::oneshot;
use uuid::Uuid;

use super::pool::{Held, answered};
use super::statements::CLAIM_MANY;
use crate::NewClaim;
use crate::commits::{CommitLog, CommitObserver, GroupCommit, GroupCommits};
use crate::error::Error;
use crate::row::{RecordWithClock, request_version};

/// The most claims one statement writes.
const MAX_CLAIMS: usize = 64;

/// The claims of this process waiting to be written, and the statements written so far.
#[derive(Debug, Clone)]
pub(crate) struct ClaimQueue {
    pool: PgPool,
    policy: IdempotencyPolicy,
    queue: Arc<Mutex<Queue>>,
    log: Arc<CommitLog>,
}

#[derive(Debug, Default)]
struct Queue {
    claims: Vec<Queued>,
    /// Whether a task is writing the queue: the claims queued now are its next statement's.
    writing: bool,
}

/// A claim's row, owned, and how its request hears the verdict.
#[derive(Debug)]
struct Queued {
    tenant: String,
    operation: String,
    key: String,
    fingerprint: Vec<u8>,
    request_version: i64,
    generation: Uuid,
    effect_key: String,
    request_body: Vec<u8>,
    verdict: oneshot::Sender<Verdict>,
}

/// What a claim's request hears from its statement.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// The key was inserted with this attempt number: the claim owns the record.
    Inserted(i32),
    /// The key exists: its record as the statement found it, or none if the key was not there
    /// when the statement began (another claim of the statement inserted it first, or another
    /// transaction while the statement ran).
    Exists(Option<Box<RecordWithClock>>),
    /// The database refused the statement for a row of some claim: write this claim alone.
    Alone,
    /// The database could not be reached or did not answer (or, for a statement of one
    /// claim, refused it): the claim fails with this error.
    Failed(Error),
}

impl ClaimQueue {
    pub(crate) fn new(pool: PgPool, policy: IdempotencyPolicy) -> Self {
        Self {
            pool,
            policy,
            queue: Arc::default(),
            log: Arc::default(),
        }
    }

    /// Shows every later statement to `observer`, just before it is sent and once it is
    /// committed; the first observer set stays.
    pub(crate) fn observe(&self, observer: Arc<dyn CommitObserver>) {
        self.log.observe(observer);
    }

    pub(crate) fn group_commits(&self) -> GroupCommits {
        self.log.group_commits()
    }

    /// Queues the insert of `claim`'s record in generation `generation` (with its effect key)
    /// and waits for its statement's verdict.
    pub(crate) async fn insert(
        &self,
        claim: &NewClaim<'_>,
        generation: Uuid,
        effect_key: &str,
    ) -> Verdict {
        let (verdict, heard) = oneshot::channel();
        let queued = Queued {
            tenant: claim.scope.tenant.as_str().to_owned(),
            operation: claim.scope.operation.as_str().to_owned(),
            key: claim.key.as_str().to_owned(),
            fingerprint: claim.fingerprint.as_bytes().to_vec(),
            request_version: request_version(claim.fingerprint),
            generation,
            effect_key: effect_key.to_owned(),
            request_body: claim.request_body.to_vec(),
            verdict,
        };
        let start = {
            let mut queue = lock(&self.queue);
            queue.claims.push(queued);
            self.log.waiting.fetch_add(1, Ordering::Relaxed);
            !std::mem::replace(&mut queue.writing, true)
        };
        if start {
            let writer = Writer {
                queue: self.clone(),
                emptied: false,
            };
            tokio::spawn(writer.write_all());
        }
        // The writer gone without a word (its task panicked, or the runtime is shutting
        // down): the claim is written alone.
        heard.await.unwrap_or(Verdict::Alone)
    }

    fn take(&self) -> Vec<Queued> {
        let mut queue = lock(&self.queue);
        let take = queue.claims.len().min(MAX_CLAIMS);
        let claims: Vec<Queued> = queue.claims.drain(..take).collect();
        if claims.is_empty() {
            queue.writing = false;
        }
        self.log.waiting.fetch_sub(claims.len(), Ordering::Relaxed);
        claims
    }

    /// Writes one statement of `claims` on `held`, the connection of the statement before it
    /// if it may go on ([`Held::may_go_on`]), or else on one taken from the pool, and tells
    /// each claim its verdict. Returns the connection if the statement was answered: the next
    /// statement's, if claims are waiting.
    ///
    /// The claims go in key order (and in the order they queued within a key): the order in
    /// which every instance's statements take their keys' locks. Two statements that hold some
    /// of the same keys then wait for each other in one direction only, never in a cycle,
    /// which PostgreSQL would end after its `deadlock_timeout` by failing one of them.
    async fn write(&self, mut claims: Vec<Queued>, held: Option<Held>) -> Option<Held> {
        claims.sort_by(|a, b| {
            (&a.tenant, &a.operation, &a.key).cmp(&(&b.tenant, &b.operation, &b.key))
        });
        let commit = GroupCommit {
            writes: claims.len(),
            records: 0,
        };
        self.log.committing(commit);
        let held = match held.filter(Held::may_go_on) {
            Some(held) => Ok(held),
            None => Held::take(&self.pool).await,
        };
        let mut held = match held {
            Ok(held) => held,
            Err(error) => {
                self.log.failed();
                tell_failure(claims, Error::from(error));
                return None;
            }
        };
        let claimed: Result<Vec<ClaimRow>, sqlx::Error> = answered(
            sqlx::query_as(CLAIM_MANY)
                .bind(self.policy.lock_timeout.as_secs_f64())
                .bind(self.policy.ttl.as_secs_f64())
                .bind(column(&claims, |c| c.tenant.as_str()))
                .bind(column(&claims, |c| c.operation.as_str()))
                .bind(column(&claims, |c| c.key.as_str()))
                .bind(column(&claims, |c| c.fingerprint.as_slice()))
                .bind(column(&claims, |c| &c.request_version))
                .bind(column(&claims, |c| &c.generation))
                .bind(column(&claims, |c| c.effect_key.as_str()))
                .bind(column(&claims, |c| c.request_body.as_slice()))
                .fetch_all(held.connection()),
        )
        .await;
        match claimed {
            Ok(rows) => {
                self.log.committed(commit);
                let mut rows: HashMap<i64, ClaimRow> =
                    rows.into_iter().map(|row| (row.position, row)).collect();
                for (position, claim) in (1..).zip(claims) {
                    // Every claim has its row; were one missing, the claim under the lock
                    // would decide.
                    let verdict = match rows.remove(&position) {
                        Some(ClaimRow {
                            inserted: Some(attempts),
                            ..
                        }) => Verdict::Inserted(attempts),
                        Some(ClaimRow { found, .. }) => Verdict::Exists(found.map(Box::new)),
                        None => Verdict::Exists(None),
                    };
                    let _ = claim.verdict.send(verdict);
                }
                Some(held)
            }
            Err(error) => {
                // The connection goes back to the pool, which closes it if the error
                // distrusts it, or if it no longer answers its ping.
                drop(held);
                self.log.failed();
                tell_failure(claims, Error::from(error));
                None
            }
        }
    }
}

/// A claim's row of `CLAIM_MANY`: its position in the statement's arrays (from 1), its attempt
/// number if its key was inserted, and the record that was there before, if any.
#[derive(Debug)]
struct ClaimRow {
    position: i64,
    inserted: Option<i32>,
    found: Option<RecordWithClock>,
}

impl FromRow<'_, PgRow> for ClaimRow {
    fn from_row(row: &PgRow) -> Result<Self, sqlx::Error> {
        // The record's columns are all null where the key was not there: its key tells.
        let found = match row.try_get::<Option<String>, _>("idempotency_key")? {
            Some(_) => Some(RecordWithClock::from_row(row)?),
            None => None,
        };
        Ok(Self {
            position: row.try_get("position")?,
            inserted: row.try_get("inserted_attempts")?,
            found,
        })
    }
}

/// One column of the claims, the array bound for it.
fn column<'a, T: ?Sized>(claims: &'a [Queued], value: fn(&'a Queued) -> &'a T) -> Vec<&'a T> {
    claims.iter().map(value).collect()
}

/// A failed statement's claims: the one claim of a lone statement gets its error; the claims
/// of a shared one are written alone if the database refused a row or a row was held past the
/// `lock_timeout` (alone, only the claim of that row waits for it again, and is answered as in
/// flight), and fail as unavailable if it could not be reached (written alone, each would wait
/// for the same silence again).
fn tell_failure(mut claims: Vec<Queued>, error: Error) {
    if claims.len() == 1 {
        let claim = claims.remove(0);
        let _ = claim.verdict.send(Verdict::Failed(error));
        return;
    }
    let unavailable = matches!(error, Error::Unavailable(_));
    let cause = std::error::Error::source(&error).map_or(String::new(), |e| format!(": {e}"));
    let message = format!("a statement of {} claims: {error}{cause}", claims.len());
    for claim in claims {
        let verdict = if unavailable {
            Verdict::Failed(Error::Unavailable(sqlx::Error::Io(std::io::Error::other(
                message.clone(),
            ))))
        } else {
            Verdict::Alone
        };
        let _ = claim.verdict.send(verdict);
    }
}

/// The task that writes the queue until it is empty. Dropped early (a panic, the runtime
/// shutting down), it hands the queue on: the claims still queued are told to write alone, and
/// the next claim starts a writer again.
struct Writer {
    queue: ClaimQueue,
    /// Whether it found the queue empty and said so: the next claim starts another writer.
    emptied: bool,
}

impl Writer {
    /// Writes statement after statement on one connection, which goes back to the pool once
    /// the queue is empty (or when it may not go on).
    async fn write_all(mut self) {
        let mut held = None;
        loop {
            let claims = self.queue.take();
            if claims.is_empty() {
                self.emptied = true;
                return;
            }
            held = self.queue.write(claims, held).await;
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if self.emptied {
            return;
        }
        let mut queue = lock(&self.queue.queue);
        queue.writing = false;
        // Their senders dropped, the claims still queued write alone.
        let dropped = std::mem::take(&mut queue.claims).len();
        self.queue.log.waiting.fetch_sub(dropped, Ordering::Relaxed);
    }
}

/// The queue's lock; a panic while it was held left nothing half-done in it.
fn lock(queue: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    queue
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
