//! The caller's half of the protocol: the `payments-client` crate and the `payments` command
//! line, against the real service and card-sim, through a proxy that loses answers, delays them
//! past the client's timeout and resets connections. However the network fails, each logical
//! operation makes exactly one processor call, and every answer the service gave, delivered or
//! lost, names the same resource.

use std::collections::VecDeque;
use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use payments_client::types::{ChargeRequest, KeyOperation, KeyState, PayoutRequest, RefundRequest};
use payments_client::{Client, Error, Operation, Origin, RetryPolicy};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;

use crate::helpers::{ACME, Backend, Footprint, TestApp, with_card_sim, workspace_binary};

// The command line's credentials: the API key and a base URL's user-info.
mod credentials;
// Holds: `payments charge --no-capture`, `payments capture` and `payments cancel`.
mod holds;
// The journal's own guarantees: whose it is, how long its keys are sent, what it keeps.
mod journal;

on_every_backend!(
    every_operation_happens_once_through_a_faulty_network,
    the_command_line_charges_once_through_a_faulty_network,
    a_command_killed_mid_charge_resumes_it_from_its_journal,
    final_errors_are_not_retried_and_a_changed_request_says_so,
);

/// What the proxy does with one request.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Forwards the request and its answer.
    Pass,
    /// Forwards the request, waits for the whole answer, and closes the caller's connection
    /// without sending it: the service did the work and the caller never hears of it.
    LoseAnswer,
    /// Forwards the request and sends the answer only after this delay, past the caller's
    /// timeout, then closes the connection.
    DelayAnswer(Duration),
    /// Resets the caller's connection (RST) without forwarding the request.
    Reset,
    /// Answers `307 Temporary Redirect` to `http://127.0.0.1:{port}` (another origin) with
    /// the request's path, without forwarding the request.
    RedirectTo(u16),
}

/// A TCP proxy in front of the service that applies a script of faults, one per request in
/// the order they arrive (then passes everything), and keeps every answer the service gave.
struct FaultProxy {
    url: String,
    faults: Arc<Mutex<VecDeque<Fault>>>,
    answers: Arc<Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultProxy {
    async fn start(app: &TestApp) -> Self {
        let upstream = app
            .base_url
            .strip_prefix("http://")
            .expect("an http base URL")
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let faults = Arc::new(Mutex::new(VecDeque::new()));
        let answers = Arc::new(Mutex::new(Vec::new()));
        let (script, kept) = (Arc::clone(&faults), Arc::clone(&answers));
        let task = tokio::spawn(async move {
            while let Ok((caller, _)) = listener.accept().await {
                let connection = Connection {
                    upstream: upstream.clone(),
                    faults: Arc::clone(&script),
                    answers: Arc::clone(&kept),
                };
                tokio::spawn(connection.serve(caller));
            }
        });
        Self {
            url,
            faults,
            answers,
            task,
        }
    }

    /// The faults of the next requests, in order.
    fn script(&self, faults: &[Fault]) {
        self.faults.lock().expect("faults").extend(faults);
    }

    /// Every answer's body the service gave since the last call, delivered or not.
    fn take_answers(&self) -> Vec<Value> {
        std::mem::take(&mut *self.answers.lock().expect("answers"))
    }

    /// Drops the faults not applied yet: from now on every request passes.
    fn pass_everything(&self) {
        self.faults.lock().expect("faults").clear();
    }

    /// Whether every scripted fault has been applied.
    fn script_done(&self) -> bool {
        self.faults.lock().expect("faults").is_empty()
    }
}

struct Connection {
    upstream: String,
    faults: Arc<Mutex<VecDeque<Fault>>>,
    answers: Arc<Mutex<Vec<Value>>>,
}

impl Connection {
    async fn serve(self, caller: TcpStream) {
        let mut caller = BufReader::new(caller);
        let mut upstream: Option<BufReader<TcpStream>> = None;
        while let Some((request, _)) = read_message(&mut caller).await {
            let fault = self.faults.lock().expect("faults").pop_front();
            let fault = fault.unwrap_or(Fault::Pass);
            if let Fault::Reset = fault {
                let socket = socket2::SockRef::from(caller.get_ref());
                socket.set_linger(Some(Duration::ZERO)).expect("SO_LINGER");
                return;
            }
            if let Fault::RedirectTo(port) = fault {
                let head = String::from_utf8_lossy(&request).into_owned();
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                let answer = format!(
                    "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://127.0.0.1:{port}{path}\r\n\
                     content-length: 0\r\n\r\n"
                );
                let _ = caller.get_mut().write_all(answer.as_bytes()).await;
                continue;
            }
            let service = match &mut upstream {
                Some(service) => service,
                None => {
                    let stream = TcpStream::connect(&self.upstream).await.expect("service");
                    upstream.insert(BufReader::new(stream))
                }
            };
            service
                .get_mut()
                .write_all(&request)
                .await
                .expect("forward");
            let (answer, body) = read_message(service).await.expect("the service answers");
            let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
            self.answers.lock().expect("answers").push(body);
            match fault {
                Fault::Pass => {
                    if caller.get_mut().write_all(&answer).await.is_err() {
                        return;
                    }
                }
                Fault::LoseAnswer => return,
                Fault::DelayAnswer(delay) => {
                    tokio::time::sleep(delay).await;
                    let _ = caller.get_mut().write_all(&answer).await;
                    return;
                }
                Fault::Reset | Fault::RedirectTo(_) => unreachable!("handled before forwarding"),
            }
        }
    }
}

/// One HTTP/1.1 message (head and `Content-Length` body) and its body; `None` at the end of
/// the connection.
async fn read_message(stream: &mut BufReader<TcpStream>) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut message = Vec::new();
    let mut length = 0;
    loop {
        let start = message.len();
        if stream.read_until(b'\n', &mut message).await.ok()? == 0 {
            return None;
        }
        let line = String::from_utf8_lossy(&message[start..]).to_ascii_lowercase();
        assert!(
            !line.starts_with("transfer-encoding"),
            "the proxy reads Content-Length bodies only"
        );
        if let Some(value) = line.strip_prefix("content-length:") {
            length = value.trim().parse().expect("Content-Length");
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await.ok()?;
    message.extend_from_slice(&body);
    Some((message, body))
}

/// A client that gives up on an attempt after three seconds (far more than an answer takes,
/// even on a loaded machine, so that only a delayed answer times out) and retries quickly.
fn client(url: &str) -> Client {
    let policy = RetryPolicy {
        attempt_timeout: Duration::from_secs(3),
        deadline: Duration::from_secs(60),
        base_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
        prefer_wait_secs: None,
    };
    Client::new(url, ACME).expect("client").with_policy(policy)
}

/// The ids of the answers the service gave: one per answer.
fn ids(answers: &[Value]) -> Vec<&str> {
    answers
        .iter()
        .map(|answer| answer["id"].as_str().unwrap_or("(no id)"))
        .collect()
}

/// Past the client's timeout of an attempt.
const DELAY: Duration = Duration::from_millis(3_500);

const LOST_THREE_TIMES_DELAYED_AND_RESET: [Fault; 6] = [
    Fault::LoseAnswer,
    Fault::LoseAnswer,
    Fault::LoseAnswer,
    Fault::DelayAnswer(DELAY),
    Fault::Reset,
    Fault::Pass,
];

async fn every_operation_happens_once_through_a_faulty_network(backend: Backend) {
    let (card_sim, app) = with_card_sim(backend).await;
    let proxy = FaultProxy::start(&app).await;
    let client = client(&proxy.url);

    proxy.script(&LOST_THREE_TIMES_DELAYED_AND_RESET);
    let request = ChargeRequest {
        amount: 5_000,
        currency: "usd".to_owned(),
        source: "tok_visa".to_owned(),
        description: None,
        capture: None,
    };
    let charge = client
        .create_charge(&request, &Operation::new())
        .await
        .expect("the charge is made");
    assert_eq!(charge.attempts, 6);
    assert_eq!(charge.origin, Origin::Replayed, "the first attempt made it");
    let expires = charge.key_expires.expect("Idempotency-Key-Expires");
    assert!(
        expires > SystemTime::now() + Duration::from_secs(3_600),
        "a day's retention"
    );
    let answers = proxy.take_answers();
    assert_eq!(ids(&answers), [charge.value.id.as_str(); 5], "{answers:?}");
    assert_eq!(card_sim.charges_created().await, 1);

    proxy.script(&[Fault::LoseAnswer, Fault::LoseAnswer, Fault::Reset]);
    let refund = client
        .create_refund(
            &charge.value.id,
            &RefundRequest {
                amount: Some(1_000),
                reason: None,
            },
            &Operation::new(),
        )
        .await
        .expect("the refund is made");
    assert_eq!((refund.attempts, refund.origin), (4, Origin::Replayed));
    assert_eq!(ids(&proxy.take_answers()), [refund.value.id.as_str(); 3]);
    assert_eq!(card_sim.refunds_created().await, 1);

    proxy.script(&[Fault::DelayAnswer(DELAY), Fault::LoseAnswer]);
    let payout = PayoutRequest {
        amount: 1_000,
        currency: "usd".to_owned(),
        destination: "ba_checking".to_owned(),
        description: None,
    };
    let payout = client
        .create_payout(&payout, &Operation::new())
        .await
        .expect("the payout is made");
    assert_eq!((payout.attempts, payout.origin), (3, Origin::Replayed));
    assert_eq!(ids(&proxy.take_answers()), [payout.value.id.as_str(); 3]);
    assert_eq!(card_sim.payouts_created().await, 1);

    // One charge, one refund, one payout, each with one ledger transaction and one event.
    let footprint = Footprint::of(&app.database.pool).await;
    assert_eq!(footprint.charges, 1);
    assert_eq!(footprint.ledger_transactions, 3);
    assert_eq!(footprint.outbox_events, 3);
    assert!(proxy.script_done());
}

/// `payments` against `url` with `args`, as tenant acme.
fn payments(url: &str, args: &[&str]) -> Command {
    payments_within(url, args, "60")
}

/// `payments` against `url` with `args`, as tenant acme, giving up after `deadline_secs`.
fn payments_within(url: &str, args: &[&str], deadline_secs: &str) -> Command {
    let mut command = Command::new(workspace_binary("payments"));
    command
        .env_clear()
        .env("PAYMENTS_BASE_URL", url)
        .env("PAYMENTS_API_KEY", ACME)
        .args(args)
        .args([
            "--attempt-timeout-secs",
            "3",
            "--deadline-secs",
            deadline_secs,
        ])
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

async fn run(command: &mut Command) -> (i32, Value, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = command.output().await.expect("run payments");
    let stdout = serde_json::from_slice(&stdout).unwrap_or(Value::Null);
    let stderr = String::from_utf8_lossy(&stderr).into_owned();
    (status.code().expect("exited"), stdout, stderr)
}

async fn the_command_line_charges_once_through_a_faulty_network(backend: Backend) {
    let (card_sim, app) = with_card_sim(backend).await;
    let proxy = FaultProxy::start(&app).await;
    proxy.script(&LOST_THREE_TIMES_DELAYED_AND_RESET);
    let charge = [
        "charge",
        "--amount",
        "1999",
        "--currency",
        "usd",
        "--source",
        "tok_visa",
    ];
    let (code, answer, stderr) = run(&mut payments(&proxy.url, &charge)).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(answer["amount"], 1999, "{answer}");
    assert!(stderr.contains("replayed by the service"), "{stderr}");
    let id = answer["id"].as_str().expect("a charge id");
    assert_eq!(ids(&proxy.take_answers()), [id; 5]);
    assert_eq!(card_sim.charges_created().await, 1);
    assert_eq!(Footprint::of(&app.database.pool).await.charges, 1);

    // The other commands, through answers lost once each.
    let key = key_of(&stderr);
    let (_, record, stderr) = run(&mut payments(&proxy.url, &["key", &key])).await;
    assert_eq!(record["state"], "completed", "{stderr}");
    proxy.script(&[Fault::LoseAnswer, Fault::LoseAnswer]);
    let refund = ["refund", "--charge", id, "--amount", "500"];
    let (code, refund, stderr) = run(&mut payments(&proxy.url, &refund)).await;
    assert_eq!(
        (code, &refund["amount"]),
        (0, &Value::from(500)),
        "{stderr}"
    );
    let payout = [
        "payout",
        "--amount",
        "400",
        "--currency",
        "usd",
        "--destination",
        "ba_checking",
    ];
    let (code, payout, stderr) = run(&mut payments(&proxy.url, &payout)).await;
    assert_eq!(
        (code, &payout["status"]),
        (0, &Value::from("paid")),
        "{stderr}"
    );
    let (code, balance, stderr) = run(&mut payments(&proxy.url, &["balance"])).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        balance["available"][0]["amount"],
        1999 - 500 - 400,
        "{balance}"
    );
    assert_eq!(card_sim.refunds_created().await, 1);
    assert_eq!(card_sim.payouts_created().await, 1);
    assert!(proxy.script_done());
}

/// The key the command line says it sent, from its stderr.
fn key_of(stderr: &str) -> String {
    let line = stderr
        .lines()
        .find_map(|line| line.strip_prefix("payments: idempotency key "));
    let key = line.and_then(|line| line.split_whitespace().next());
    key.unwrap_or_else(|| panic!("no key in {stderr}"))
        .to_owned()
}

/// Waits until the journal at `path` holds an operation, and returns its key.
async fn journaled_key(path: &Path) -> String {
    for _ in 0..500 {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let entry = text.lines().find_map(|line| {
            let entry: Value = serde_json::from_str(line).ok()?;
            entry["key"].as_str().map(str::to_owned)
        });
        if let Some(key) = entry {
            return key;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the journal {} holds no operation", path.display());
}

async fn a_command_killed_mid_charge_resumes_it_from_its_journal(backend: Backend) {
    let (card_sim, app) = with_card_sim(backend).await;
    let dir = std::env::temp_dir().join(format!("payments-journal-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("journal dir");
    let journal = dir.join("journal");
    let journal_arg = journal.to_str().expect("a UTF-8 path");
    let charge = [
        "charge",
        "--amount",
        "2500",
        "--currency",
        "usd",
        "--source",
        "tok_slow",
        "--journal",
        journal_arg,
    ];

    // The first run is killed while its charge is at the processor (tok_slow takes 2 s).
    let mut first = payments(&app.base_url, &charge)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start payments");
    let key = journaled_key(&journal).await;
    let reader = client(&app.base_url);
    let mut pending = false;
    for _ in 0..500 {
        match reader.key(&key, KeyOperation::Charge).await {
            Ok(record) => {
                pending = record.state == KeyState::Pending;
                break;
            }
            Err(Error::Problem { problem }) if problem.code == "not_found" => {}
            Err(error) => panic!("reading the key: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        pending,
        "the first run's charge is in flight when it is killed"
    );
    first.start_kill().expect("SIGKILL");
    first.wait().await.expect("the first run ends");

    // Started again with the same journal and arguments: the same key, the same charge.
    let (code, answer, stderr) = run(&mut payments(&app.base_url, &charge)).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&key),
        "resumed under the journaled key: {stderr}"
    );
    let id = answer["id"].as_str().expect("a charge id").to_owned();
    assert_eq!(card_sim.charges_created().await, 1);

    // Once it has its answer, a run prints it from the journal without sending anything.
    // Its service gone (an entry is answered only for the service it was sent to).
    let base_url = app.base_url.clone();
    drop(app);
    let (code, again, stderr) = run(&mut payments(&base_url, &charge)).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("from the journal"), "{stderr}");
    assert_eq!(again["id"], id.as_str());
    assert_eq!(again, answer);
    assert_eq!(card_sim.charges_created().await, 1);
    std::fs::remove_dir_all(dir).expect("clean up");
}

async fn final_errors_are_not_retried_and_a_changed_request_says_so(backend: Backend) {
    let (card_sim, app) = with_card_sim(backend).await;
    let proxy = FaultProxy::start(&app).await;
    let declined = [
        "charge",
        "--amount",
        "700",
        "--currency",
        "usd",
        "--source",
        "tok_chargeDeclined",
    ];
    let (code, _, stderr) = run(&mut payments(&proxy.url, &declined)).await;
    assert_eq!(code, 1, "a decline is final: {stderr}");
    let problem: Value = serde_json::from_str(&stderr).expect("the problem on stderr");
    assert_eq!(problem["code"], "card_declined");
    assert_eq!(proxy.take_answers().len(), 1, "sent once");

    let charge = |amount: &'static str| {
        let args = [
            "charge",
            "--amount",
            amount,
            "--currency",
            "usd",
            "--source",
            "tok_visa",
            "--key",
            "order-7",
        ];
        payments(&proxy.url, &args)
    };
    let (code, first, stderr) = run(&mut charge("800")).await;
    assert_eq!(code, 0, "{stderr}");
    let (code, _, stderr) = run(&mut charge("900")).await;
    assert_eq!(code, 4, "another request under the key: {stderr}");
    let problem: Value = serde_json::from_str(&stderr).expect("the problem on stderr");
    assert_eq!(problem["code"], "idempotency_key_reused");
    assert_eq!(proxy.take_answers().len(), 2, "each sent once");

    // The library says the same, as its own error.
    let changed = ChargeRequest {
        amount: 901,
        currency: "usd".to_owned(),
        source: "tok_visa".to_owned(),
        description: None,
        capture: None,
    };
    let error = client(&proxy.url)
        .create_charge(&changed, &Operation::with_key("order-7"))
        .await
        .expect_err("a changed request");
    assert!(
        matches!(&error, Error::RequestChanged { key, .. } if key == "order-7"),
        "{error:?}"
    );
    assert_eq!(
        card_sim.charges_created().await,
        1,
        "order-7: a decline creates none"
    );
    assert_eq!(first["amount"], 800);

    assert_eq!(
        proxy.take_answers().len(),
        1,
        "the changed request, sent once"
    );

    // Without an API key nothing is sent: a usage error that names the setting.
    let mut keyless = Command::new(workspace_binary("payments"));
    keyless
        .env_clear()
        .args(["--base-url", &proxy.url, "balance"]);
    let (code, _, stderr) = run(&mut keyless).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("PAYMENTS_API_KEY"), "{stderr}");
    assert!(proxy.take_answers().is_empty());
}
