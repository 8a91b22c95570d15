//! What the record store's tests share: `SqlRecords` on a fresh database of either backend,
//! or that backend's own store, with the records table of `schema/`, and a way to move its
//! clock.

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use payments_idempotency::IdempotencyPolicy;
use payments_idempotency::engine::RecordStore;
use payments_idempotency::engine::conformance::Subject;
use payments_idempotency_sql::{
    Backend, Database, PgRecords, PoolSettings, SqlRecords, SqliteRecords,
};
use sqlx::{Connection, PgConnection};

/// `SqlRecords` on a fresh database, removed when it is dropped.
pub(crate) struct Fresh {
    pub(crate) records: SqlRecords,
    cleanup: Cleanup,
}

enum Cleanup {
    DropDatabase(String),
    RemoveDirectory(PathBuf),
}

fn admin_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

pub(crate) async fn on(backend: Backend) -> Fresh {
    let name = format!("records_test_{}", uuid::Uuid::new_v4().simple());
    let (url, cleanup) = match backend {
        Backend::Postgres => {
            let admin = admin_url();
            let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
            (format!("{base}/{name}"), Cleanup::DropDatabase(name))
        }
        Backend::Sqlite => {
            let dir = std::env::temp_dir().join(name);
            let url = format!("sqlite://{}", dir.join("records.db").display());
            (url, Cleanup::RemoveDirectory(dir))
        }
    };
    let settings = PoolSettings {
        max_connections: 8,
        acquire_timeout: Duration::from_secs(10),
        statement_timeout: Duration::from_secs(30),
        lock_timeout: Duration::from_secs(30),
        idle_in_transaction_timeout: Duration::from_secs(60),
    };
    let records = Database::parse(&url)
        .unwrap_or_else(|e| panic!("{e}"))
        .open(&settings, IdempotencyPolicy::default())
        .await
        .unwrap_or_else(|e| panic!("open {backend:?}: {e}"));
    records
        .create_schema()
        .await
        .unwrap_or_else(|e| panic!("create the schema: {e}"));
    Fresh { records, cleanup }
}

impl Drop for Fresh {
    fn drop(&mut self) {
        match &self.cleanup {
            Cleanup::RemoveDirectory(dir) => {
                let _ = std::fs::remove_dir_all(dir);
            }
            Cleanup::DropDatabase(name) => {
                let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                let _ = std::thread::spawn(move || {
                    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    else {
                        return;
                    };
                    runtime.block_on(async {
                        if let Ok(mut admin) = PgConnection::connect(&admin_url()).await {
                            let _ = sqlx::query(&sql).execute(&mut admin).await;
                        }
                    });
                })
                .join();
            }
        }
    }
}

#[async_trait]
impl Subject for Fresh {
    type Store = SqlRecords;

    fn store(&self) -> &SqlRecords {
        &self.records
    }

    fn policy(&self) -> IdempotencyPolicy {
        self.records.policy()
    }

    /// Every time a record holds moves `by` into the past: the store judges them by the
    /// database's own clock, which the test cannot move.
    async fn advance(&self, by: Duration) {
        let secs = by.as_secs_f64();
        let columns = ["created_at", "updated_at", "locked_until", "expires_at"];
        let set = |earlier: &dyn Fn(&str) -> String| -> String {
            let set: Vec<String> = columns.into_iter().map(earlier).collect();
            format!("UPDATE idempotency_records SET {}", set.join(", "))
        };
        match &self.records {
            SqlRecords::Postgres(records) => {
                let sql = set(&|c| format!("{c} = {c} - make_interval(secs => {secs})"));
                sqlx::query(&sql).execute(records.pool()).await.map(drop)
            }
            SqlRecords::Sqlite(records) => {
                let sql = set(&|c| {
                    format!("{c} = strftime('%Y-%m-%dT%H:%M:%fZ', {c}, '-{secs} seconds')")
                });
                sqlx::query(&sql).execute(records.pool()).await.map(drop)
            }
        }
        .unwrap_or_else(|e| panic!("move the records' times: {e}"));
    }
}

/// A backend's own store on a fresh database ([`PgRecords`], [`SqliteRecords`]), as a
/// service on that backend alone holds it.
pub(crate) struct Own<S: 'static> {
    fresh: Fresh,
    store: fn(&SqlRecords) -> Option<&S>,
}

#[allow(dead_code)]
pub(crate) async fn postgres_store() -> Own<PgRecords> {
    fn store(records: &SqlRecords) -> Option<&PgRecords> {
        match records {
            SqlRecords::Postgres(records) => Some(records),
            SqlRecords::Sqlite(_) => None,
        }
    }
    let fresh = on(Backend::Postgres).await;
    Own { fresh, store }
}

#[allow(dead_code)]
pub(crate) async fn sqlite_store() -> Own<SqliteRecords> {
    fn store(records: &SqlRecords) -> Option<&SqliteRecords> {
        match records {
            SqlRecords::Sqlite(records) => Some(records),
            SqlRecords::Postgres(_) => None,
        }
    }
    let fresh = on(Backend::Sqlite).await;
    Own { fresh, store }
}

#[async_trait]
impl<S: RecordStore> Subject for Own<S> {
    type Store = S;

    fn store(&self) -> &S {
        let store = (self.store)(&self.fresh.records);
        store.unwrap_or_else(|| panic!("a store of another backend"))
    }

    fn policy(&self) -> IdempotencyPolicy {
        self.fresh.policy()
    }

    async fn advance(&self, by: Duration) {
        self.fresh.advance(by).await;
    }
}
