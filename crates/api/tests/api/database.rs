//! The database as a highly available deployment presents it to the service: how durable an
//! acknowledged commit is, a primary demoted under the service's feet (every write answered
//! "read-only"), and a node that stops answering. Each is unavailability: 503 with
//! `Retry-After`, nothing stored, the key left free, and the service back on its own once the
//! database is.

use futures::future::join_all;
use serde_json::Value;
use sqlx::{Connection, Executor, PgConnection};

use crate::helpers::{
    ACME, Backend, Footprint, TestApp, admin_url, metrics_text, new_key, problem, spawn_app,
    spawn_app_with, visa,
};

/// Whether an acknowledged commit waits for a standby is said at `/readyz` and as a metric.
/// The test databases have no standby: commits are local.
async fn readiness_says_whether_a_commit_waits_for_a_standby(backend: Backend) {
    let app = spawn_app(backend).await;
    let ready: Value = app.get_json(ACME, "/readyz").await;
    assert_eq!(ready["status"], "ready");
    assert_eq!(ready["durability"], "local", "{ready}");
    let metrics = metrics_text(&app.metrics_url).await;
    assert!(
        metrics
            .lines()
            .any(|line| line == "database_commit_waits_for_standby 0"),
        "{metrics}"
    );
}

/// The database of `app`, by name, from the server's admin database: a read-only database
/// refuses `ALTER DATABASE` on its own connections.
async fn database_name(app: &TestApp) -> String {
    sqlx::query_scalar("SELECT current_database()::text")
        .fetch_one(app.db())
        .await
        .expect("current_database()")
}

async fn on_admin(sql: &str) {
    let mut admin = PgConnection::connect(&admin_url())
        .await
        .expect("connect to the admin database");
    admin.execute(sql).await.expect(sql);
    admin.close().await.expect("close the admin connection");
}

/// A demoted primary stays reachable and answers every write with "cannot execute .. in a
/// read-only transaction" (SQLSTATE 25006). That is unavailability, not a bug: 503 with
/// `Retry-After`, nothing stored. And the connections the service opened to it leave the pool
/// as they come back, so that once writes are accepted again (here: the database made
/// writable; in a deployment: the pooler sends new connections to the new primary), the
/// service charges again within a few attempts instead of keeping read-only connections for
/// their whole idle lifetime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_primary_is_unavailable_and_its_connections_leave_the_pool() {
    let app = spawn_app(Backend::Postgres).await;
    assert_eq!(
        app.post_charge(ACME, &new_key(), &visa(100)).await.status(),
        201
    );
    let name = database_name(&app).await;
    on_admin(&format!(
        "ALTER DATABASE \"{name}\" SET default_transaction_read_only = on"
    ))
    .await;
    // The service's open connections were made writable; cut them so that every connection
    // it makes from now on is to the "demoted" database.
    on_admin(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = '{name}' AND pid <> pg_backend_pid()"
    ))
    .await;

    // Rounds of concurrent requests: the first find the connections that were cut, and the
    // pool refills with connections to the read-only database, up to its size.
    let key = new_key();
    let body = visa(100);
    for _ in 0..5 {
        let answers = join_all((0..10).map(|_| app.post_charge(ACME, &key, &body))).await;
        for response in answers {
            assert!(response.headers().contains_key("retry-after"));
            let (status, problem) = problem(response).await;
            assert_eq!(
                (status, problem["code"].as_str()),
                (503, Some("store_unavailable"))
            );
        }
    }
    assert_eq!(
        app.footprint().await,
        Footprint::charged(1),
        "nothing stored"
    );

    on_admin(&format!(
        "ALTER DATABASE \"{name}\" RESET default_transaction_read_only"
    ))
    .await;
    // Every read-only connection still pooled causes at most one more 503 before it is closed,
    // and the pool holds at most `database.max_connections` (10) of them.
    let mut attempts = 0;
    let status = loop {
        attempts += 1;
        let status = app.post_charge(ACME, &key, &body).await.status();
        if status != 503 || attempts == 12 {
            break status;
        }
    };
    assert_eq!(status, 201, "still refused after {attempts} attempts");
    assert_eq!(app.footprint().await, Footprint::charged(2));
}

/// A statement that does not finish within `database.statement_timeout_ms` (a lock held
/// forever, a node too loaded to answer) is cancelled by the database itself: the
/// request gets 503 `store_unavailable` with `Retry-After` within the bound, nothing is
/// stored, and the same key is charged once the database answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_over_the_timeout_is_unavailable_and_the_key_stays_free() {
    let app = spawn_app_with(
        Backend::Postgres,
        &[("PAYMENTS__DATABASE__STATEMENT_TIMEOUT_MS", "300")],
    )
    .await;
    let mut blocker = app.lock_table("idempotency_records").await;

    let key = new_key();
    let response = app.post_charge(ACME, &key, &visa(100)).await;
    assert!(response.headers().contains_key("retry-after"));
    let (status, problem) = problem(response).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (503, Some("store_unavailable"))
    );

    blocker.execute("ROLLBACK").await.expect("unlock");
    assert_eq!(app.footprint().await, Footprint::EMPTY);
    assert_eq!(app.post_charge(ACME, &key, &visa(100)).await.status(), 201);
    assert_eq!(app.footprint().await, Footprint::charged(1));
}

on_every_backend!(readiness_says_whether_a_commit_waits_for_a_standby);
