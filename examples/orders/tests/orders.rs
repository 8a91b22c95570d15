//! The order example as a client sees it, over real HTTP, with the mail simulator as a process
//! of its own, on PostgreSQL and on SQLite: whatever the client's retries and the service's
//! crashes, one order placed under a key is one mail, one order row and one answer; and so it
//! is for a client that never comes back, through the kit's attempts, completer and upkeep.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::any::AnyPoolOptions;
use sqlx::{Connection, PgConnection};

/// A process of the test's, killed (SIGKILL) when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("a port: {e}"));
    listener
        .local_addr()
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"))
}

async fn answering(base: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let address = base.trim_start_matches("http://").to_owned();
    while tokio::net::TcpStream::connect(&address).await.is_err() {
        assert!(Instant::now() < deadline, "{base} never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The settings a test gives the order service, beyond its addresses.
#[derive(Debug, Clone, Copy)]
struct Settings {
    /// `ORDERS_SETTLE_AFTER_MS`: how long after an order's lock ended the completer may settle
    /// it. Longer than the mail client's timeout (6 s: the simulator's slow answer takes 5.3 s).
    settle_after_ms: u64,
    /// `ORDERS_RETENTION_MS`: how long a finished order's record is kept.
    retention_ms: u64,
}

impl Settings {
    /// The completer settles an order the moment the mail client's timeout allows; records
    /// are kept for a day.
    const PROMPT_COMPLETER: Self = Self {
        settle_after_ms: 6_500,
        retention_ms: 86_400_000,
    };
    /// The completer would wait a minute: only the attempt itself can record an order sooner.
    const LATE_COMPLETER: Self = Self {
        settle_after_ms: 60_000,
        ..Self::PROMPT_COMPLETER
    };
    /// Records kept for two seconds.
    const SHORT_RETENTION: Self = Self {
        retention_ms: 2_000,
        ..Self::PROMPT_COMPLETER
    };
}

/// The database, the mail simulator and the order service of one test.
struct Stack {
    settings: Settings,
    database_url: String,
    cleanup: Option<String>,
    mail: String,
    _mail_sim: Process,
    orders: String,
    service: Option<Process>,
    client: reqwest::Client,
}

fn admin_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

impl Stack {
    async fn on(backend: &str) -> Self {
        Self::with(backend, Settings::PROMPT_COMPLETER).await
    }

    async fn with(backend: &str, settings: Settings) -> Self {
        let name = format!("orders_test_{}", uuid::Uuid::new_v4().simple());
        let (database_url, cleanup) = if backend == "postgres" {
            let admin = admin_url();
            let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
            (format!("{base}/{name}"), Some(name))
        } else {
            let file = std::env::temp_dir().join(&name).join("orders.db");
            (format!("sqlite://{}", file.display()), None)
        };
        let mail_port = free_port();
        let mail_sim = Command::new(env!("CARGO_BIN_EXE_mail-sim"))
            .env("MAIL_SIM_LISTEN", format!("127.0.0.1:{mail_port}"))
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start mail-sim: {e}"));
        let mut stack = Self {
            settings,
            database_url,
            cleanup,
            mail: format!("http://127.0.0.1:{mail_port}"),
            _mail_sim: Process(mail_sim),
            orders: format!("http://127.0.0.1:{}", free_port()),
            service: None,
            client: reqwest::Client::new(),
        };
        answering(&stack.mail).await;
        stack.start().await;
        stack
    }

    /// Starts the order service, with a lock of one second, so that a retry after a crash
    /// takes the dead attempt's record over promptly, and the completer and the reaper
    /// looking every 200 ms.
    async fn start(&mut self) {
        let Settings {
            settle_after_ms,
            retention_ms,
        } = self.settings;
        let child = Command::new(env!("CARGO_BIN_EXE_orders"))
            .env("ORDERS_DATABASE_URL", &self.database_url)
            .env("ORDERS_MAIL_URL", &self.mail)
            .env("ORDERS_LISTEN", self.orders.trim_start_matches("http://"))
            .env("ORDERS_LOCK_TIMEOUT_MS", "1000")
            .env("ORDERS_MAIL_TIMEOUT_MS", "6000")
            .env("ORDERS_SETTLE_AFTER_MS", settle_after_ms.to_string())
            .env("ORDERS_RETENTION_MS", retention_ms.to_string())
            .env("ORDERS_COMPLETER_INTERVAL_MS", "200")
            .env("ORDERS_REAPER_INTERVAL_MS", "200")
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start orders: {e}"));
        self.service = Some(Process(child));
        answering(&self.orders).await;
    }

    /// SIGKILL: no shutdown, nothing flushed.
    fn kill(&mut self) {
        drop(self.service.take());
    }

    /// SIGTERM, then the service's own exit (within 30 s): whether it exited successfully.
    async fn terminate(&mut self) -> bool {
        let Some(Process(service)) = self.service.as_mut() else {
            panic!("no service to stop")
        };
        let pid = service.id().to_string();
        let signalled = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(signalled.is_ok_and(|s| s.success()), "kill -TERM {pid}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match service.try_wait() {
                Ok(Some(status)) => return status.success(),
                Ok(None) => assert!(
                    Instant::now() < deadline,
                    "still running 30 s after SIGTERM"
                ),
                Err(e) => panic!("{e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends a slow order (its mail is sent at once, its answer comes 5 s later) from a client
    /// that gives up after a second and never retries; returns once the mail went out.
    async fn send_and_go_away(&self, key: &str, order: &Value) {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let request = client
            .post(format!("{}/orders", self.orders))
            .header("idempotency-key", key)
            .json(order);
        let sent = request.send().await;
        assert!(
            sent.as_ref().is_err_and(reqwest::Error::is_timeout),
            "answered within the client's second: {sent:?}"
        );
        self.mails_out(1).await;
    }

    /// Waits (10 s at most) until `count` mails were sent.
    async fn mails_out(&self, count: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.mails_sent().await < count {
            assert!(Instant::now() < deadline, "the mail was never sent");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits (`within` at most) until `sql`, a count, gives `expected`; returns what it last
    /// gave.
    async fn count_reaches(&self, sql: &str, expected: i64, within: Duration) -> i64 {
        let deadline = Instant::now() + within;
        loop {
            let count = self.count(sql).await;
            if count == expected || Instant::now() >= deadline {
                return count;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn place(&self, key: &str, order: &Value) -> reqwest::Result<reqwest::Response> {
        self.client
            .post(format!("{}/orders", self.orders))
            .header("idempotency-key", key)
            .header("prefer", "wait=10")
            .json(order)
            .send()
            .await
    }

    /// The answer a retry gets once the key's first attempt has ended: 201 and its body.
    async fn placed(&self, key: &str, order: &Value) -> (Value, bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let answer = self
                .place(key, order)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            if answer.status() == 201 {
                let replayed = answer.headers().contains_key("idempotent-replayed");
                let body = answer.json().await.unwrap_or_else(|e| panic!("{e}"));
                return (body, replayed);
            }
            assert!(
                Instant::now() < deadline,
                "never placed: {}",
                answer.status()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn mails_sent(&self) -> u64 {
        let stats: Value = self
            .client
            .get(format!("{}/stats", self.mail))
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .unwrap_or_else(|e| panic!("{e}"))
            .json()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        stats["sent"].as_u64().unwrap_or_else(|| panic!("{stats}"))
    }

    async fn order_rows(&self) -> i64 {
        self.count("SELECT count(*) FROM orders").await
    }

    /// Runs `sql` on the service's database, as an operator would.
    async fn execute(&self, sql: &str) {
        sqlx::any::install_default_drivers();
        let pool = AnyPoolOptions::new()
            .max_connections(1)
            .connect(&self.database_url)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let done = sqlx::query(sql).execute(&pool).await;
        done.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    async fn count(&self, sql: &str) -> i64 {
        sqlx::any::install_default_drivers();
        let pool = AnyPoolOptions::new()
            .max_connections(1)
            .connect(&self.database_url)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (rows,): (i64,) = sqlx::query_as(sql)
            .fetch_one(&pool)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        rows
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.kill();
        match self.cleanup.take() {
            Some(name) => {
                let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                let _ = std::thread::spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build();
                    let Ok(runtime) = runtime else { return };
                    runtime.block_on(async {
                        if let Ok(mut admin) = PgConnection::connect(&admin_url()).await {
                            let _ = sqlx::query(&sql).execute(&mut admin).await;
                        }
                    });
                })
                .join();
            }
            None => {
                let file = self.database_url.trim_start_matches("sqlite://");
                if let Some(dir) = PathBuf::from(file).parent() {
                    let _ = std::fs::remove_dir_all(dir);
                }
            }
        }
    }
}

fn order(item: &str) -> Value {
    json!({ "email": "ada@example.com", "item": item, "quantity": 2 })
}

async fn concurrent_duplicates_place_one_order(backend: &str) {
    let stack = Stack::on(backend).await;
    let widget = order("widget");
    let duplicates = (0..8).map(|_| stack.placed("order-1", &widget));
    let answers = futures::future::join_all(duplicates).await;
    let first = &answers[0].0;
    assert!(answers.iter().all(|(body, _)| body == first), "{answers:?}");
    assert_eq!(
        answers.iter().filter(|(_, replayed)| !replayed).count(),
        1,
        "{answers:?}"
    );
    assert_eq!(stack.mails_sent().await, 1);
    assert_eq!(stack.order_rows().await, 1);
    // Another order under the same key is refused, and sends nothing.
    let other = stack
        .place("order-1", &order("gadget"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(other.status(), 422);
    assert_eq!(stack.mails_sent().await, 1);
}

async fn a_crash_after_the_mail_and_a_retry_place_one_order(backend: &str) {
    let mut stack = Stack::on(backend).await;
    let slow = order("slow widget");
    let first = tokio::spawn({
        let (client, url) = (stack.client.clone(), format!("{}/orders", stack.orders));
        let slow = slow.clone();
        async move {
            client
                .post(url)
                .header("idempotency-key", "order-2")
                .json(&slow)
                .send()
                .await
        }
    });
    // The mail went out; its answer is still on its way when the service dies.
    stack.mails_out(1).await;
    stack.kill();
    assert!(
        first.await.unwrap_or_else(|e| panic!("{e}")).is_err(),
        "answered before the kill"
    );
    assert_eq!(stack.order_rows().await, 0);
    stack.start().await;
    let (placed, _) = stack.placed("order-2", &slow).await;
    let (again, replayed) = stack.placed("order-2", &slow).await;
    assert_eq!(placed, again);
    assert!(replayed);
    assert_eq!(placed["message_id"], "msg_1", "{placed}");
    assert_eq!(stack.mails_sent().await, 1);
    assert_eq!(stack.order_rows().await, 1);
}

const COMPLETED_RECORDS: &str =
    "SELECT count(*) FROM idempotency_records WHERE state = 'completed'";

/// The client gives up a second in, the mail is sent, and no retry ever comes: the attempt,
/// which outlived its client, records the order when the mail's answer arrives, long before
/// the completer may (a minute after the lock).
async fn an_order_whose_client_went_away_is_recorded_by_its_attempt(backend: &str) {
    let stack = Stack::with(backend, Settings::LATE_COMPLETER).await;
    stack.send_and_go_away("order-3", &order("slow lamp")).await;
    let rows = stack
        .count_reaches("SELECT count(*) FROM orders", 1, Duration::from_secs(15))
        .await;
    assert_eq!(rows, 1, "the order was never recorded");
    assert_eq!(stack.count(COMPLETED_RECORDS).await, 1);
    assert_eq!(stack.mails_sent().await, 1);
}

/// The service dies after the mail went out, and comes back; no retry ever comes: the
/// completer settles the order with the mail service's answer for its effect key.
async fn an_order_whose_service_died_is_recorded_by_the_completer(backend: &str) {
    let mut stack = Stack::with(backend, Settings::PROMPT_COMPLETER).await;
    let client = stack.client.clone();
    let request = client
        .post(format!("{}/orders", stack.orders))
        .header("idempotency-key", "order-4")
        .json(&order("slow lamp"));
    let first = tokio::spawn(request.send());
    stack.mails_out(1).await;
    stack.kill();
    let answered = first.await.unwrap_or_else(|e| panic!("{e}"));
    assert!(answered.is_err(), "answered before the kill");
    assert_eq!(stack.order_rows().await, 0);
    stack.start().await;
    // The lock (1 s), the settle grace (6.5 s) and a few of the completer's rounds.
    let rows = stack
        .count_reaches("SELECT count(*) FROM orders", 1, Duration::from_secs(20))
        .await;
    assert_eq!(rows, 1, "the completer never recorded the order");
    assert_eq!(stack.count(COMPLETED_RECORDS).await, 1);
    assert_eq!(stack.mails_sent().await, 1);
    // The client that comes back after all is answered with the order the completer wrote.
    let (placed, replayed) = stack.placed("order-4", &order("slow lamp")).await;
    assert!(replayed);
    assert_eq!(placed["message_id"], "msg_1", "{placed}");
}

/// Records past their retention (2 s here) are deleted by the upkeep's reaper; the orders
/// they made stay.
async fn records_past_their_retention_are_reaped(backend: &str) {
    let stack = Stack::with(backend, Settings::SHORT_RETENTION).await;
    for key in ["order-5", "order-6"] {
        stack.placed(key, &order("widget")).await;
    }
    assert_eq!(stack.count(COMPLETED_RECORDS).await, 2);
    let left = stack
        .count_reaches(
            "SELECT count(*) FROM idempotency_records",
            0,
            Duration::from_secs(15),
        )
        .await;
    assert_eq!(left, 0, "expired records were never reaped");
    assert_eq!(stack.order_rows().await, 2);
}

/// SIGTERM while an attempt whose client went away waits for its mail's answer: the service
/// waits for the attempt, which records the order, and only then exits.
async fn sigterm_waits_for_the_attempts_in_flight(backend: &str) {
    let mut stack = Stack::with(backend, Settings::LATE_COMPLETER).await;
    stack.send_and_go_away("order-7", &order("slow lamp")).await;
    assert_eq!(
        stack.order_rows().await,
        0,
        "recorded before the mail answered"
    );
    assert!(
        stack.terminate().await,
        "the service failed to stop cleanly"
    );
    assert_eq!(
        stack.order_rows().await,
        1,
        "exited before its attempt ended"
    );
    assert_eq!(stack.count(COMPLETED_RECORDS).await, 1);
    assert_eq!(stack.mails_sent().await, 1);
}

/// A NUL, which PostgreSQL's text cannot hold, is refused before the key is claimed: no mail,
/// no record, and the key is still free for the order sent right.
async fn an_order_with_a_nul_is_refused_before_the_claim(backend: &str) {
    let stack = Stack::on(backend).await;
    let answer = stack
        .client
        .post(format!("{}/orders", stack.orders))
        .header("idempotency-key", "order-8")
        .header("content-type", "application/json")
        .body(r#"{"email":"ada\u0000@example.com","item":"widget","quantity":1}"#)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(answer.status(), 400);
    let problem: Value = answer.json().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(problem["code"], "invalid_request", "{problem}");
    assert_eq!(stack.mails_sent().await, 0);
    assert_eq!(
        stack
            .count("SELECT count(*) FROM idempotency_records")
            .await,
        0
    );
    stack.placed("order-8", &order("widget")).await;
    assert_eq!(stack.mails_sent().await, 1);
}

/// A store that refuses, for good, the row of an order of an `unrecordable` item: a trigger,
/// as a constraint added by a later migration would.
const REFUSE_UNRECORDABLE: [(&str, &[&str]); 2] = [
    (
        "postgres",
        &[
            "CREATE FUNCTION refuse_order() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'this order is refused' USING ERRCODE = 'check_violation'; END $$",
            "CREATE TRIGGER refuse_unrecordable BEFORE INSERT ON orders FOR EACH ROW
             WHEN (NEW.item = 'unrecordable') EXECUTE FUNCTION refuse_order()",
        ],
    ),
    (
        "sqlite",
        &["CREATE TRIGGER refuse_unrecordable BEFORE INSERT ON orders
           WHEN NEW.item = 'unrecordable' BEGIN SELECT RAISE(ABORT, 'this order is refused'); END"],
    ),
];

/// The records completed with their order's row refused for good: kept, with the mail's id.
const UNRECORDED_RECORDS: &str = "SELECT count(*) FROM idempotency_records
     WHERE state = 'completed' AND recovery_point = 'charged' AND effect_id IS NOT NULL";

/// The mail went out, then the database refused the order's row for good: the record ends with
/// a stable 500 (`effect_unrecorded`) and the mail's id, kept past its retention for an
/// operator while the reaper deletes the records around it, and every retry gets the same
/// answer: one mail, no second send, no row.
async fn an_order_refused_for_good_after_its_mail_is_kept_for_an_operator(backend: &str) {
    let stack = Stack::with(backend, Settings::SHORT_RETENTION).await;
    let refusing = REFUSE_UNRECORDABLE.iter().find(|(b, _)| *b == backend);
    let (_, statements) = refusing.unwrap_or_else(|| panic!("no refusal on {backend}"));
    for sql in *statements {
        stack.execute(sql).await;
    }

    let unrecordable = order("unrecordable");
    let answer = stack.place("order-9", &unrecordable).await;
    let answer = answer.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(answer.status(), 500);
    let first: Value = answer.json().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(first["code"], "effect_unrecorded", "{first}");
    assert_eq!((stack.mails_sent().await, stack.order_rows().await), (1, 0));
    assert_eq!(stack.count(UNRECORDED_RECORDS).await, 1);

    // Past its retention: an order placed beside it is reaped, the unrecorded one is kept.
    stack.placed("order-10", &order("widget")).await;
    let all = "SELECT count(*) FROM idempotency_records";
    let left = stack.count_reaches(all, 1, Duration::from_secs(15)).await;
    assert_eq!(
        left, 1,
        "the reaper deleted the unrecorded record or nothing at all"
    );
    assert_eq!(stack.count(UNRECORDED_RECORDS).await, 1);

    for _ in 0..3 {
        let retry = stack.place("order-9", &unrecordable).await;
        let retry = retry.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(retry.status(), 500);
        assert!(retry.headers().contains_key("idempotent-replayed"));
        let again: Value = retry.json().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(again, first);
    }
    assert_eq!((stack.mails_sent().await, stack.order_rows().await), (2, 1));
}

macro_rules! on_both_backends {
    ($($test:ident),*) => {
        mod postgres { $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() { super::$test("postgres").await }
        )* }
        mod sqlite { $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() { super::$test("sqlite").await }
        )* }
    };
}

on_both_backends!(
    concurrent_duplicates_place_one_order,
    a_crash_after_the_mail_and_a_retry_place_one_order,
    an_order_whose_client_went_away_is_recorded_by_its_attempt,
    an_order_whose_service_died_is_recorded_by_the_completer,
    records_past_their_retention_are_reaped,
    sigterm_waits_for_the_attempts_in_flight,
    an_order_with_a_nul_is_refused_before_the_claim,
    an_order_refused_for_good_after_its_mail_is_kept_for_an_operator
);
