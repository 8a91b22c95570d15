//! The record store's pool on PostgreSQL, and what a failover asks of it: a bound on every
//! round trip, and the connections opened before a node was demoted or went silent closed as
//! they come back to the pool.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool, Postgres};

use crate::PoolSettings;
use crate::error::no_answer;

/// When the process last had reason to distrust every open connection, in milliseconds on
/// [`CLOCK`]; 0 for never. Two reasons: a statement found its database read-only (SQLSTATE
/// 25006: the node it reached was demoted to a standby), or a statement got no answer within
/// [`answer_bound`] (the node is frozen, or gone without a word). Every connection opened
/// before then may lead to that node, so each is closed as it comes back to the pool, and the
/// pool opens new ones (which a pooler in front sends to the new primary). Process-wide: one
/// such node is reason enough for every pool of the process to reconnect.
static DISTRUSTED_AT: AtomicU64 = AtomicU64::new(0);

/// The clock of [`DISTRUSTED_AT`], started with the first pool.
static CLOCK: LazyLock<Instant> = LazyLock::new(Instant::now);

/// The longest a statement, `BEGIN` or `COMMIT` waits for PostgreSQL's answer, in
/// milliseconds (0: no pool yet). The server cancels a slow statement itself at its
/// `statement_timeout`; this bound is for a server that answers nothing at all (a stopped
/// process, a paused machine, a network that drops every packet), where that timeout never
/// runs and TCP keepalives are answered by a kernel that is still alive. The largest of the
/// process's pools, so that no pool's statements are cut short of their own timeout.
static ANSWER_BOUND_MS: AtomicU64 = AtomicU64::new(0);

/// How much longer than `statement_timeout` a statement is waited for before it is given up:
/// a server that runs cancels it first, and its answer says why.
pub(super) const ANSWER_MARGIN: Duration = Duration::from_secs(1);

fn millis_on_clock() -> u64 {
    u64::try_from(CLOCK.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The connections opened until now leave the pool as they come back to it.
pub fn distrust_open_connections() {
    DISTRUSTED_AT.store(millis_on_clock().max(1), Ordering::Relaxed);
}

/// How long a task keeps a connection from one statement to the next ([`Held`]) before it
/// gives it back to the pool, whose checks on release (the pool's `max_lifetime`,
/// [`opened_before_distrust`]) then reach it.
const HOLD_AT_MOST: Duration = Duration::from_secs(1);

/// A connection taken from the pool for several statements in a row (the claims' writer, while
/// claims keep coming): each statement after the first saves the pool's checkout and the ping
/// sqlx makes on every connection that comes back to it. Given back as soon as the process
/// distrusts its open connections, so that no statement goes on a connection the pool would
/// have closed, and at the latest after [`HOLD_AT_MOST`].
#[derive(Debug)]
pub(super) struct Held {
    connection: PoolConnection<Postgres>,
    /// When it was taken, in milliseconds on [`CLOCK`].
    since: u64,
}

impl Held {
    pub(super) async fn take(pool: &PgPool) -> Result<Self, sqlx::Error> {
        let connection = pool.acquire().await?;
        Ok(Self {
            connection,
            since: millis_on_clock(),
        })
    }

    /// Whether the next statement may go on this connection: it was not held too long, and
    /// the process has found no reason to distrust its connections since it was taken (in the
    /// same millisecond counts as since).
    pub(super) fn may_go_on(&self) -> bool {
        let held_for = Duration::from_millis(millis_on_clock().saturating_sub(self.since));
        held_for < HOLD_AT_MOST && !distrusted_since(self.since)
    }

    pub(super) fn connection(&mut self) -> &mut PgConnection {
        &mut self.connection
    }
}

/// Whether the process found reason to distrust its connections at `millis` on [`CLOCK`] or
/// later.
fn distrusted_since(millis: u64) -> bool {
    let seen = DISTRUSTED_AT.load(Ordering::Relaxed);
    seen != 0 && millis <= seen
}

/// Whether a connection of this `age` was opened before the last reason to distrust it (or in
/// the same millisecond).
fn opened_before_distrust(age: Duration) -> bool {
    let age = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
    distrusted_since(millis_on_clock().saturating_sub(age))
}

/// See [`ANSWER_BOUND_MS`].
pub fn answer_bound() -> Option<Duration> {
    match ANSWER_BOUND_MS.load(Ordering::Relaxed) {
        0 => None,
        millis => Some(Duration::from_millis(millis)),
    }
}

/// Waits for `work`, a statement's or a `COMMIT`'s round trip, at most [`answer_bound`].
/// Dropped there, the connection is left mid-conversation: the error distrusts it, so it
/// leaves the pool as it comes back.
pub async fn answered<T>(
    work: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    match answer_bound() {
        None => work.await,
        Some(bound) => tokio::time::timeout(bound, work)
            .await
            .unwrap_or_else(|_| Err(no_answer(bound))),
    }
}

/// How the server notices a connection whose peer is gone (a machine that lost power, a
/// network that drops every packet): TCP keepalives after 10 s of silence, every 5 s, given up
/// after 3 unanswered (about 25 s in all, where the system's default is over two hours), and
/// data it sent that stays unacknowledged for 30 s. The session then ends, and its transaction
/// with it. A frozen process whose kernel still answers is ended by the idle-in-transaction
/// timeout instead.
const SERVER_SIDE_TCP: [(&str, u64); 4] = [
    ("tcp_keepalives_idle", 10),
    ("tcp_keepalives_interval", 5),
    ("tcp_keepalives_count", 3),
    ("tcp_user_timeout", 30_000),
];

/// A pool that connects lazily: a service starts even while the database is down, answers
/// 503 until it is back, and recovers without a restart. Its statements are cancelled by the
/// server at `statement_timeout`, and given up by [`answered`] a little later; a statement
/// waiting for a row another transaction holds is cancelled at `lock_timeout`; and the server
/// ends a session left idle in a transaction, or whose peer is gone, on its own
/// ([`PoolSettings::idle_in_transaction_timeout`], [`SERVER_SIDE_TCP`]).
pub fn connect_lazy(options: PgConnectOptions, settings: &PoolSettings) -> PgPool {
    LazyLock::force(&CLOCK);
    let millis = |duration: Duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    let options = options
        .options([
            ("statement_timeout", millis(settings.statement_timeout)),
            ("lock_timeout", millis(settings.lock_timeout)),
            (
                "idle_in_transaction_session_timeout",
                millis(settings.idle_in_transaction_timeout),
            ),
        ])
        .options(SERVER_SIDE_TCP);
    let bound = settings.statement_timeout + ANSWER_MARGIN;
    ANSWER_BOUND_MS.fetch_max(
        u64::try_from(bound.as_millis()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
    // No ping before each acquire: it would add a round trip to every statement on the hot
    // path. A connection that died is found by its next statement, which fails as unavailable
    // (503, nothing executed) and is dropped from the pool; one that reached a demoted
    // primary, or that went unanswered, is closed as it comes back (`opened_before_distrust`).
    PgPoolOptions::new()
        .max_connections(settings.max_connections)
        .acquire_timeout(settings.acquire_timeout)
        .test_before_acquire(false)
        .after_release(|_, connection| {
            let keep = !opened_before_distrust(connection.age);
            Box::pin(async move { Ok(keep) })
        })
        .connect_lazy_with(options)
}
