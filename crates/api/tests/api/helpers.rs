//! `spawn_app(backend)`: one service process and one database per test, so tests run in
//! parallel; most tests run once on PostgreSQL and once on SQLite (see `on_every_backend!`).

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::{Client, RequestBuilder, Response};
use serde_json::{Value, json};
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Connection, PgConnection};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use crate::card_sim::CardSim;

pub(crate) const ACME: &str = "sk_test_acme";
pub(crate) const GLOBEX: &str = "sk_test_globex";

/// The replay cache's MAC secret every test service runs with (`redis.cache_secret`).
pub(crate) const CACHE_SECRET: &str = "test-cache-secret-that-is-longer-than-32-bytes";

/// The server every test database is created on. Tests fail (never skip) when it is down.
pub(crate) fn admin_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// The Redis the tests share (each test uses its own keys on it).
pub(crate) fn test_redis_url() -> String {
    std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// The last path segment of a database URL (unique per test database, on both backends).
fn database_name(database_url: &str) -> &str {
    database_url.rsplit('/').next().unwrap_or("payments")
}

/// The database a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Postgres,
    Sqlite,
}

/// The event stream of the services started on `database_url`.
pub(crate) fn stream_for(database_url: &str) -> String {
    format!("{}:events", redis_key_prefix(database_url))
}

/// The prefix of the Redis keys of the services started on `database_url`
/// (`redis.key_prefix`): the replay cache's entries and the event stream are under it.
pub(crate) fn redis_key_prefix(database_url: &str) -> String {
    format!("test:{}", database_name(database_url))
}

fn database_url(name: &str) -> String {
    let admin = admin_url();
    let base = admin
        .rsplit_once('/')
        .map_or(admin.as_str(), |(base, _)| base);
    format!("{base}/{name}")
}

/// A fresh database, removed when this is dropped: a PostgreSQL database on the test server,
/// or a SQLite file in its own temporary directory.
pub(crate) struct TestDatabase {
    pub url: String,
    /// The test's own connection, for counting rows and moving time columns.
    pub pool: AnyPool,
    pub backend: Backend,
    name: String,
}

impl TestDatabase {
    pub(crate) async fn create(backend: Backend) -> Self {
        sqlx::any::install_default_drivers();
        let name = format!("payments_test_{}", uuid::Uuid::new_v4().simple());
        let url = match backend {
            Backend::Postgres => {
                let mut admin = PgConnection::connect(&admin_url())
                    .await
                    .unwrap_or_else(|e| {
                        panic!(
                            "PostgreSQL is required for these tests and is not reachable at {}: {e}",
                            admin_url()
                        )
                    });
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&mut admin)
                    .await
                    .expect("create the test database");
                database_url(&name)
            }
            // The service creates the file (and its directory) itself, as it would in use.
            Backend::Sqlite => format!("sqlite://{}", sqlite_file(&name).display()),
        };
        let pool = AnyPoolOptions::new()
            .max_connections(4)
            .connect_lazy(&url)
            .expect("test database URL");
        Self {
            url,
            pool,
            backend,
            name,
        }
    }

    /// An SQL expression for the database's clock `secs` seconds ago.
    #[cfg_attr(
        not(feature = "bench"),
        allow(dead_code, reason = "only the bench floor tests move expiry")
    )]
    pub(crate) fn seconds_ago(&self, secs: u32) -> String {
        match self.backend {
            Backend::Postgres => format!("now() - interval '{secs} seconds'"),
            Backend::Sqlite => format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-{secs} seconds')"),
        }
    }

    /// An SQL expression for the database's clock.
    pub(crate) fn now(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => "now()",
            Backend::Sqlite => "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
        }
    }

    /// An SQL expression for a uuid parameter bound as hyphenated text.
    pub(crate) fn uuid_param(&self, param: &str) -> String {
        match self.backend {
            Backend::Postgres => format!("{param}::uuid"),
            Backend::Sqlite => format!("unhex(replace({param}, '-', ''))"),
        }
    }

    /// An SQL expression for a uuid column as lowercase hyphenated text.
    /// `column`, a date, as `YYYY-MM-DD` text on either backend.
    pub(crate) fn date_text(&self, column: &str) -> String {
        match self.backend {
            Backend::Postgres => format!("to_char({column}, 'YYYY-MM-DD')"),
            Backend::Sqlite => column.to_owned(),
        }
    }

    pub(crate) fn uuid_text(&self, column: &str) -> String {
        match self.backend {
            Backend::Postgres => format!("{column}::text"),
            Backend::Sqlite => format!(
                "lower(substr(hex({column}), 1, 8) || '-' || substr(hex({column}), 9, 4) || '-' || \
                 substr(hex({column}), 13, 4) || '-' || substr(hex({column}), 17, 4) || '-' || \
                 substr(hex({column}), 21))"
            ),
        }
    }
}

fn sqlite_file(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(name).join(format!("{name}.db"))
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        if self.backend == Backend::Sqlite {
            if let Some(dir) = sqlite_file(&name).parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
            return;
        }
        // Drop runs outside async context: a short-lived runtime on its own thread removes
        // the database, also when the test panicked.
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                if let Ok(mut admin) = PgConnection::connect(&admin_url()).await {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&mut admin)
                        .await;
                }
            });
        })
        .join();
    }
}

/// One running `payments-api` process, killed when dropped.
pub(crate) struct Service {
    pub base_url: String,
    /// Where its own metrics listener serves `/metrics` (`server.metrics_bind`).
    pub metrics_url: String,
    child: Child,
    /// Its log lines, kept by `start` (other starts leave it empty).
    log: Arc<Mutex<Vec<String>>>,
}

impl Service {
    /// Starts the service on a free port against `database_url`, with extra environment.
    pub(crate) async fn start(database_url: &str, env: &[(&str, &str)]) -> Self {
        Self::start_program(env!("CARGO_BIN_EXE_payments-api"), database_url, env).await
    }

    /// [`start`](Self::start) with another build of the service: the program at `program`.
    pub(crate) async fn start_program(
        program: impl AsRef<std::ffi::OsStr>,
        database_url: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let mut command = Command::new(program);
        command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("DATABASE_URL", database_url)
            .env("PAYMENTS__SERVER__BIND", "127.0.0.1:0")
            .env("PAYMENTS__SERVER__METRICS_BIND", "127.0.0.1:0")
            .env("PAYMENTS__LOG__FORMAT", "text")
            .env("RUST_LOG", "info,sqlx=warn")
            // Each test database gets its own stream and cache keys on the shared Redis.
            .env("PAYMENTS__REDIS__URL", test_redis_url())
            .env("PAYMENTS__REDIS__STREAM", stream_for(database_url))
            .env(
                "PAYMENTS__REDIS__KEY_PREFIX",
                redis_key_prefix(database_url),
            )
            .env("PAYMENTS__REDIS__CACHE_SECRET", CACHE_SECRET)
            // No test runs into the daily reconciliation at 01:00 by chance; the one that
            // tests it sets its own time.
            .env("PAYMENTS__WORKERS__RECONCILE_AT", "off")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("start payments-api");
        let ((address, line), mut lines) = listening_line(&mut child, "payments-api").await;
        let service = Self::listening(child, &address, &line);
        let log = Arc::clone(&service.log);
        log.lock().expect("log").push(line);
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                log.lock().expect("log").push(line);
            }
        });
        service
    }

    /// Every line the service has printed on stdout (its log) so far.
    pub(crate) fn log_lines(&self) -> Vec<String> {
        self.log.lock().expect("log").clone()
    }

    /// The service's resident set size in KiB, from `/proc`.
    pub(crate) fn resident_kib(&self) -> u64 {
        let pid = self.child.id().expect("the service is running");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no VmRSS in {status}"))
    }

    /// The service whose listening log line is `line`.
    fn listening(child: Child, address: &str, line: &str) -> Self {
        let metrics = field_of(line, "metrics=").unwrap_or_default();
        Self {
            base_url: format!("http://{address}"),
            metrics_url: format!("http://{metrics}/metrics"),
            child,
            log: Arc::default(),
        }
    }

    /// Starts the service as a newcomer would: in `dir`, with no configuration at all except
    /// a free port (so that tests can run side by side). Returns it and its start-up log line.
    pub(crate) async fn start_embedded(dir: &std::path::Path) -> (Self, String) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_payments-api"))
            .current_dir(dir)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("PAYMENTS__SERVER__BIND", "127.0.0.1:0")
            .env("PAYMENTS__SERVER__METRICS_BIND", "127.0.0.1:0")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start payments-api");
        let (address, line) = read_listening_line(&mut child, "payments-api").await;
        (Self::listening(child, &address, &line), line)
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// Sends a `POST /charges` as tenant acme.
    pub(crate) async fn post_charge(&self, key: &str, body: &Value) -> Response {
        self.charge(&http_client(), key, body)
            .send()
            .await
            .expect("POST /charges")
    }

    /// `POST /charges` of `body` under `key` as acme, to be sent by `client`.
    pub(crate) fn charge(&self, client: &Client, key: &str, body: &Value) -> RequestBuilder {
        client
            .post(self.url("/charges"))
            .bearer_auth(ACME)
            .header("Idempotency-Key", key)
            .json(body)
    }

    /// Asks the process to shut down, as an orchestrator does (SIGTERM).
    pub(crate) fn terminate(&self) {
        let pid = self.child.id().expect("the service is running");
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "SIGTERM sent");
    }

    /// Freezes the process (SIGSTOP) where it stands, as a paused machine, a live migration or
    /// `docker pause` would: its connections stay open, and nothing it began ends.
    pub(crate) fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen process go on (SIGCONT).
    pub(crate) fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("the service is running");
        let sent = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill {signal} sent");
    }

    /// Kills the process at once (SIGKILL), as a crashing machine would.
    pub(crate) async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Waits (bounded) for the process to exit and says whether it exited successfully.
    pub(crate) async fn wait_exit(&mut self) -> bool {
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the service should have exited")
            .expect("wait for the service")
            .success()
    }
}

/// A running service and a connection to its database.
pub(crate) struct TestApp {
    pub base_url: String,
    /// The service's own `/metrics` listener.
    pub metrics_url: String,
    pub client: Client,
    // Declared before the database so that the process is killed before the database drops.
    service: Service,
    pub database: TestDatabase,
}

/// Starts the service with default settings on a fresh database of `backend`.
/// Keys that replay for two seconds: the TTL must outlast the lock, and the processor timeout
/// fit inside the lock.
pub(crate) const TWO_SECOND_RETENTION: [(&str, &str); 4] = [
    ("PAYMENTS__IDEMPOTENCY__TTL_SECS", "2"),
    ("PAYMENTS__IDEMPOTENCY__LOCK_TIMEOUT_SECS", "1"),
    ("PAYMENTS__PROCESSOR__TIMEOUT_MS", "500"),
    ("PAYMENTS__PROCESSOR__SETTLE_AFTER_MS", "600"),
];

/// For the tests of what stands behind an instance's recent answers (the replay cache and the
/// records): the instance holds none, so that every replay reaches them.
pub(crate) const NO_RECENT_ANSWERS: (&str, &str) =
    ("PAYMENTS__IDEMPOTENCY__RECENT_ANSWERS_BYTES", "0");

pub(crate) async fn spawn_app(backend: Backend) -> TestApp {
    spawn_app_with(backend, &[]).await
}

/// Starts the service with extra environment variables.
pub(crate) async fn spawn_app_with(backend: Backend, env: &[(&str, &str)]) -> TestApp {
    let database = TestDatabase::create(backend).await;
    let service = Service::start(&database.url, env).await;
    TestApp {
        base_url: service.base_url.clone(),
        metrics_url: service.metrics_url.clone(),
        client: http_client(),
        service,
        database,
    }
}

/// The text of a metrics listener's `/metrics` (`Service::metrics_url`), which must answer 200.
pub(crate) async fn metrics_text(metrics_url: &str) -> String {
    let response = http_client()
        .get(metrics_url)
        .send()
        .await
        .expect("GET /metrics");
    assert_eq!(response.status().as_u16(), 200);
    response.text().await.expect("metrics text")
}

/// Waits until the service reports `n` requests holding in-flight slots
/// (`http_requests_in_flight`, read on the metrics listener, which admission does not count):
/// on a busy machine the service may take seconds to read the heads of stalled requests, or
/// to end the attempts of clients that left.
pub(crate) async fn wait_for_in_flight(app: &TestApp, n: usize) {
    let wanted = format!("http_requests_in_flight {n}\n");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = metrics_text(&app.metrics_url).await;
        if metrics.contains(&wanted) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the service never held {n} requests in flight: {}",
            metrics
                .lines()
                .find(|line| line.starts_with("http_requests_in_flight"))
                .unwrap_or("no http_requests_in_flight gauge")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) fn http_client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

/// Reads a child's log until it says where it listens (`listening ... address=IP:PORT`), then
/// keeps draining it so the pipe never fills and blocks the child.
pub(crate) async fn read_listening_address(child: &mut Child, what: &str) -> String {
    read_listening_line(child, what).await.0
}

/// Like [`read_listening_address`], and also returns the whole log line.
pub(crate) async fn read_listening_line(child: &mut Child, what: &str) -> (String, String) {
    let (address, mut lines) = listening_line(child, what).await;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    address
}

/// Reads `child`'s stdout until its listening line: the address and the line, and the lines
/// still to come.
async fn listening_line(
    child: &mut Child,
    what: &str,
) -> ((String, String), Lines<BufReader<ChildStdout>>) {
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let address = tokio::time::timeout(Duration::from_secs(60), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("listening")
                && let Some(address) = field_of(&line, "address=")
            {
                return Some((address, line.clone()));
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .unwrap_or_else(|| panic!("{what} did not report a listening address (see its stderr above)"));
    (address, lines)
}

/// The value after `name` (e.g. `address=`) in a text log line.
fn field_of(line: &str, name: &str) -> Option<String> {
    let rest = line.split(name).nth(1)?;
    let value = rest.split_whitespace().next()?;
    Some(value.trim_matches('"').to_owned())
}

impl TestApp {
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// The test's own connection to the service's database.
    pub(crate) fn db(&self) -> &AnyPool {
        &self.database.pool
    }

    /// A connection of its own to the service's PostgreSQL database, holding `table` locked
    /// against every read and write in a transaction it leaves open: until it sends
    /// `ROLLBACK`, every statement of the service on `table` waits.
    pub(crate) async fn lock_table(&self, table: &str) -> PgConnection {
        let mut blocker = PgConnection::connect(&self.database.url)
            .await
            .expect("connect to the service's database");
        let lock = format!("BEGIN; LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE");
        sqlx::Executor::execute(&mut blocker, lock.as_str())
            .await
            .expect("lock the table");
        blocker
    }

    /// A `POST /charges` with an API key, an idempotency key and a JSON body.
    pub(crate) fn charge(
        &self,
        api_key: &str,
        idempotency_key: &str,
        body: &Value,
    ) -> RequestBuilder {
        self.client
            .post(self.url("/charges"))
            .bearer_auth(api_key)
            .header("Idempotency-Key", idempotency_key)
            .json(body)
    }

    /// Sends a charge and returns the response.
    pub(crate) async fn post_charge(
        &self,
        api_key: &str,
        idempotency_key: &str,
        body: &Value,
    ) -> Response {
        self.charge(api_key, idempotency_key, body)
            .send()
            .await
            .expect("POST /charges")
    }

    /// The service's resident set size in KiB.
    pub(crate) fn resident_kib(&self) -> u64 {
        self.service.resident_kib()
    }

    /// Every line the service has logged so far.
    pub(crate) fn log_lines(&self) -> Vec<String> {
        self.service.log_lines()
    }

    /// Asserts that `key` was not consumed: a valid charge under it is made (201).
    pub(crate) async fn assert_key_is_free(&self, key: &str) {
        let status = self.post_charge(ACME, key, &visa(100)).await.status();
        assert_eq!(status.as_u16(), 201, "the key {key} was consumed");
    }

    /// A `POST /charges/{charge}/refunds` with an API key, an idempotency key and a body.
    pub(crate) fn refund(
        &self,
        api_key: &str,
        charge: &str,
        idempotency_key: &str,
        body: &Value,
    ) -> RequestBuilder {
        self.client
            .post(self.url(&format!("/charges/{charge}/refunds")))
            .bearer_auth(api_key)
            .header("Idempotency-Key", idempotency_key)
            .json(body)
    }

    /// Sends a refund and returns the response.
    pub(crate) async fn post_refund(
        &self,
        api_key: &str,
        charge: &str,
        idempotency_key: &str,
        body: &Value,
    ) -> Response {
        self.refund(api_key, charge, idempotency_key, body)
            .send()
            .await
            .expect("POST /charges/{id}/refunds")
    }

    /// Sends a `POST /payouts` with an API key, an idempotency key and a body.
    pub(crate) async fn post_payout(
        &self,
        api_key: &str,
        idempotency_key: &str,
        body: &Value,
    ) -> Response {
        self.client
            .post(self.url("/payouts"))
            .bearer_auth(api_key)
            .header("Idempotency-Key", idempotency_key)
            .json(body)
            .send()
            .await
            .expect("POST /payouts")
    }

    /// Makes a charge of `amount` with `token` and returns its id.
    pub(crate) async fn charged(&self, amount: i64, token: &str) -> String {
        let body = json!({ "amount": amount, "currency": "usd", "source": token });
        let response = self.post_charge(ACME, &new_key(), &body).await;
        assert_eq!(response.status().as_u16(), 201);
        let charge: Value = response.json().await.expect("charge JSON");
        charge["id"].as_str().expect("charge id").to_owned()
    }

    /// A GET that must answer 200 with JSON.
    pub(crate) async fn get_json(&self, api_key: &str, path: &str) -> Value {
        let response = self.get(api_key, path).await;
        assert_eq!(response.status().as_u16(), 200, "GET {path}");
        response.json().await.expect("JSON")
    }

    pub(crate) async fn get(&self, api_key: &str, path: &str) -> Response {
        self.client
            .get(self.url(path))
            .bearer_auth(api_key)
            .send()
            .await
            .expect("GET")
    }

    /// Rows in every table a charge writes.
    pub(crate) async fn footprint(&self) -> Footprint {
        Footprint::of(self.db()).await
    }

    /// The stored state of a key: (state, recovery_point, attempts).
    pub(crate) async fn record_state(
        &self,
        tenant: &str,
        key: &str,
    ) -> Option<(String, String, i32)> {
        sqlx::query_as(
            "SELECT state, recovery_point, attempts FROM idempotency_records
             WHERE tenant_id = $1 AND idempotency_key = $2",
        )
        .bind(tenant)
        .bind(key)
        .fetch_optional(self.db())
        .await
        .expect("read record")
    }
}

/// Row counts of the tables a charge writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Footprint {
    pub records: i64,
    pub charges: i64,
    pub ledger_transactions: i64,
    pub ledger_entries: i64,
    pub outbox_events: i64,
}

impl Footprint {
    pub(crate) const EMPTY: Self = Self {
        records: 0,
        charges: 0,
        ledger_transactions: 0,
        ledger_entries: 0,
        outbox_events: 0,
    };

    /// Counts the rows in every table a charge writes.
    pub(crate) async fn of(db: &AnyPool) -> Self {
        Self {
            records: count_rows(db, "idempotency_records").await,
            charges: count_rows(db, "charges").await,
            ledger_transactions: count_rows(db, "ledger_transactions").await,
            ledger_entries: count_rows(db, "ledger_entries").await,
            outbox_events: count_rows(db, "outbox_events").await,
        }
    }

    /// What `n` successful charges leave behind.
    pub(crate) fn charged(n: i64) -> Self {
        Self {
            records: n,
            charges: n,
            ledger_transactions: n,
            ledger_entries: 2 * n,
            outbox_events: n,
        }
    }
}

/// The state of the key's record.
pub(crate) async fn record_state(db: &TestDatabase, key: &str) -> String {
    sqlx::query_scalar("SELECT state FROM idempotency_records WHERE idempotency_key = $1")
        .bind(key)
        .fetch_one(&db.pool)
        .await
        .expect("record")
}

/// Rows in a table.
pub(crate) async fn count_rows(db: &AnyPool, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(db)
        .await
        .expect("count rows")
}

/// A valid charge body.
pub(crate) fn visa(amount: i64) -> Value {
    json!({ "amount": amount, "currency": "usd", "source": "tok_visa" })
}

/// A valid payout body, to the test bank account that always pays.
pub(crate) fn payout(amount: i64) -> Value {
    json!({ "amount": amount, "currency": "usd", "destination": "ba_checking" })
}

/// A fresh idempotency key.
pub(crate) fn new_key() -> String {
    format!("key-{}", uuid::Uuid::new_v4())
}

/// The response's status, named headers and body bytes, for exact comparisons.
pub(crate) async fn snapshot(
    response: Response,
    headers: &[&str],
) -> (u16, Vec<Option<String>>, Vec<u8>) {
    let status = response.status().as_u16();
    let values = headers
        .iter()
        .map(|h| {
            response
                .headers()
                .get(*h)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        })
        .collect();
    let body = response.bytes().await.expect("response body").to_vec();
    (status, values, body)
}

/// Parses a problem+json response and checks its media type.
pub(crate) async fn problem(response: Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    assert_eq!(
        content_type.as_deref(),
        Some("application/problem+json"),
        "status {status}"
    );
    let body: Value = response.json().await.expect("problem body is JSON");
    assert_eq!(
        body["status"],
        json!(status),
        "problem status matches the HTTP status"
    );
    (status, body)
}

/// The workspace's binary `name` (`card-sim`, `payments`), built beside `payments-api` by
/// `cargo test --workspace`.
pub(crate) fn workspace_binary(name: &str) -> std::path::PathBuf {
    let path = std::path::PathBuf::from(env!("CARGO_BIN_EXE_payments-api")).with_file_name(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace (cargo test --workspace)",
        path.display()
    );
    path
}

/// A card-sim process, and the service charging, refunding and paying out through it.
pub(crate) async fn with_card_sim(backend: Backend) -> (CardSim, TestApp) {
    let card_sim = CardSim::start().await;
    let processor = [("PAYMENTS__PROCESSOR__URL", card_sim.url.as_str())];
    let app = spawn_app_with(backend, &processor).await;
    (card_sim, app)
}

/// Sends rounds of eight concurrent requests, each `send` with a new key, until the service's
/// metrics show that two or more finishes of `operation` were written in one batch (at most
/// twenty rounds), every request answered 201. Returns how many were sent.
pub(crate) async fn concurrent_until_finished_in_a_batch<F, Sent>(
    app: &TestApp,
    operation: &str,
    send: F,
) -> i64
where
    F: Fn(String) -> Sent,
    Sent: Future<Output = Response>,
{
    const ROUNDS: usize = 20;
    const CONCURRENT: usize = 8;
    let labels = [("operation", operation)];
    let mut sent = 0;
    for _ in 0..ROUNDS {
        let answers = futures::future::join_all((0..CONCURRENT).map(|_| send(new_key()))).await;
        for answer in answers {
            assert_eq!(answer.status().as_u16(), 201, "{operation}");
        }
        sent += CONCURRENT as i64;
        let metrics = metrics_text(&app.metrics_url).await;
        let finishes =
            crate::events::sample(&metrics, "idempotency_finish_batch_size_sum", &labels);
        let batches =
            crate::events::sample(&metrics, "idempotency_finish_batch_size_count", &labels);
        if finishes > batches {
            return sent;
        }
    }
    panic!(
        "{ROUNDS} rounds of {CONCURRENT} concurrent requests never finished {operation} in one batch"
    );
}

/// The sum of the ledger's entries in each currency: zero in every one; and the balances the
/// database keeps as entries are written are the entries' sums, tenant by tenant.
pub(crate) async fn assert_ledger_balances(app: &TestApp) {
    assert_ledger_balances_in(app.db()).await;
}

/// [`assert_ledger_balances`], on the database `db`.
pub(crate) async fn assert_ledger_balances_in(db: &AnyPool) {
    let sums: Vec<(String, i64)> = sqlx::query_as(
        "SELECT currency, CAST(sum(amount) AS BIGINT) FROM ledger_entries GROUP BY currency",
    )
    .fetch_all(db)
    .await
    .expect("ledger sums");
    assert!(!sums.is_empty());
    for (currency, sum) in sums {
        assert_eq!(sum, 0, "the ledger balances in {currency}");
    }
    assert_eq!(
        balances_of(db, "ledger_balances").await,
        balances_of(db, "ledger_entries").await,
        "the balances the database keeps (ledger_balances) are the sums of the entries"
    );
}

/// Every tenant's non-zero balance per account and currency, summed from `table`'s rows.
async fn balances_of(db: &AnyPool, table: &str) -> Vec<(String, String, String, i64)> {
    let sums: Vec<(String, String, String, i64)> = sqlx::query_as(&format!(
        "SELECT tenant_id, account, currency, CAST(sum(amount) AS BIGINT) FROM {table}
         GROUP BY tenant_id, account, currency ORDER BY tenant_id, account, currency"
    ))
    .fetch_all(db)
    .await
    .unwrap_or_else(|e| panic!("sums of {table}: {e}"));
    sums.into_iter().filter(|(.., sum)| *sum != 0).collect()
}

/// The headers a replay repeats from the first answer, and the one that marks it a replay.
pub(crate) const REPLAY_HEADERS: [&str; 4] = [
    "content-type",
    "location",
    "idempotency-key-expires",
    "idempotent-replayed",
];

/// `replay` is a replay of a 201 whose headers (`REPLAY_HEADERS`) and body were `headers` and
/// `bytes`: the same status, the same bytes and headers, and marked a replay.
pub(crate) async fn assert_replays_first_answer(
    replay: Response,
    headers: &[Option<String>],
    bytes: &[u8],
) {
    let (replay_status, replay_headers, replay_bytes) = snapshot(replay, &REPLAY_HEADERS).await;
    assert_eq!(replay_status, 201);
    assert_eq!(
        replay_bytes, bytes,
        "the replay is byte for byte the first answer"
    );
    assert_eq!(replay_headers[..3], headers[..3]);
    assert_eq!(replay_headers[3].as_deref(), Some("true"));
}
