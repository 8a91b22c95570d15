//! The order example as a client sees it, over real HTTP, with the mail simulator as a process
//! of its own, on PostgreSQL and on SQLite: whatever the client's retries and the service's
//! crashes, one order placed under a key is one mail, one order row and one answer.

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

/// The database, the mail simulator and the order service of one test.
struct Stack {
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
    /// takes the dead attempt's record over promptly.
    async fn start(&mut self) {
        let child = Command::new(env!("CARGO_BIN_EXE_orders"))
            .env("ORDERS_DATABASE_URL", &self.database_url)
            .env("ORDERS_MAIL_URL", &self.mail)
            .env("ORDERS_LISTEN", self.orders.trim_start_matches("http://"))
            .env("ORDERS_LOCK_TIMEOUT_SECS", "1")
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
        sqlx::any::install_default_drivers();
        let pool = AnyPoolOptions::new()
            .max_connections(1)
            .connect(&self.database_url)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (rows,): (i64,) = sqlx::query_as("SELECT count(*) FROM orders")
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
    let deadline = Instant::now() + Duration::from_secs(10);
    while stack.mails_sent().await == 0 {
        assert!(Instant::now() < deadline, "the mail was never sent");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
    a_crash_after_the_mail_and_a_retry_place_one_order
);
