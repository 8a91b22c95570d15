//! The `payments` command line's journal against the real service, through the faulty proxy:
//! an operation whose key the service has forgotten is never sent again, an entry is its
//! service's and its tenant's alone, a redirection is followed nowhere and kept nowhere, and
//! the file is its user's alone. "Nothing sent" is counted at the processor and at the proxy.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use payments_client::Error;
use payments_client::types::KeyOperation;
use serde_json::Value;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use super::{
    Fault, FaultProxy, client, journaled_key, key_of, payments, payments_within, read_message, run,
};
use crate::card_sim::CardSim;
use crate::helpers::{
    Backend, Footprint, GLOBEX, TWO_SECOND_RETENTION, TestApp, spawn_app_with, with_card_sim,
};

on_every_backend!(
    a_key_the_service_no_longer_holds_is_never_sent_again,
    a_key_past_its_retention_is_sent_again_while_the_service_holds_it,
    a_journal_entry_is_refused_to_another_tenant_and_another_service,
    a_redirection_is_an_error_and_nothing_is_journaled,
    the_journal_is_private_and_never_opened_through_a_link,
);

/// A directory of its own for a test's journals, removed when dropped.
struct JournalDir(PathBuf);

impl JournalDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("payments-journal-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("journal dir");
        Self(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for JournalDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `payments charge` of `amount` with the journal at `journal`, and `extra` arguments.
fn charge_args<'a>(amount: &'a str, journal: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let journal = journal.to_str().expect("a UTF-8 path");
    let mut args = vec![
        "charge",
        "--amount",
        amount,
        "--currency",
        "usd",
        "--source",
        "tok_visa",
        "--journal",
        journal,
    ];
    args.extend_from_slice(extra);
    args
}

/// Every operation the journal at `path` holds, as last recorded.
fn entries(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("the journal");
    let lines = text
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok());
    let mut last: Vec<Value> = Vec::new();
    for entry in lines.collect::<Vec<Value>>() {
        last.retain(|kept| kept["name"] != entry["name"]);
        last.push(entry);
    }
    last
}

/// Runs a charge whose every answer the proxy loses, until its deadline of two seconds: the
/// service charges, the journal keeps the key without an answer, and the command exits 3.
/// Returns the key and the command's stderr.
async fn charge_with_every_answer_lost(
    proxy: &FaultProxy,
    args: &[&str],
    env: &[(&str, &str)],
) -> (String, String) {
    proxy.script(&[Fault::LoseAnswer; 100]);
    let mut command = payments_within(&proxy.url, args, "2");
    command.envs(env.iter().copied());
    let (code, _, stderr) = run(&mut command).await;
    proxy.pass_everything();
    assert_eq!(code, 3, "no answer came: {stderr}");
    let journal = args[args
        .iter()
        .position(|arg| *arg == "--journal")
        .expect("a journal")
        + 1];
    let key = journaled_key(Path::new(journal)).await;
    assert!(
        entries(Path::new(journal))
            .iter()
            .all(|entry| entry["answer"].is_null()),
        "nothing answered"
    );
    (key, stderr)
}

async fn a_key_the_service_no_longer_holds_is_never_sent_again(backend: Backend) {
    // A service that keeps keys for two seconds, and a caller told so.
    let card_sim = CardSim::start().await;
    let mut env = TWO_SECOND_RETENTION.to_vec();
    env.push(("PAYMENTS__PROCESSOR__URL", card_sim.url.as_str()));
    let app = spawn_app_with(backend, &env).await;
    let proxy = FaultProxy::start(&app).await;
    let dir = JournalDir::new();
    let journal = dir.path("journal");
    let args = charge_args("2100", &journal, &[]);
    let retention = [("PAYMENTS_KEY_RETENTION_SECS", "2")];

    let (key, stderr) = charge_with_every_answer_lost(&proxy, &args, &retention).await;
    // Within its two seconds the first run already used up the key's safe time.
    assert!(
        stderr.contains("asks the service about the key first"),
        "{stderr}"
    );
    assert_eq!(card_sim.charges_created().await, 1);
    wait_until_gone(&app, &key).await;
    proxy.take_answers();

    let mut again = payments(&proxy.url, &args);
    again.envs(retention);
    let (code, stdout, stderr) = run(&mut again).await;
    assert_eq!(code, 6, "the key is gone: {stderr}");
    assert_eq!(stdout, Value::Null, "no answer printed");
    assert!(stderr.contains("nothing was sent"), "{stderr}");
    assert!(stderr.contains("GET /charges"), "{stderr}");
    let answers = proxy.take_answers();
    assert_eq!(
        answers.len(),
        1,
        "only the key was asked about: {answers:?}"
    );
    assert_eq!(answers[0]["code"], "not_found", "{answers:?}");
    assert_eq!(card_sim.charges_created().await, 1, "never charged again");
    assert_eq!(Footprint::of(&app.database.pool).await.charges, 1);
}

/// Waits until the service no longer holds `key`, its retention over.
async fn wait_until_gone(app: &TestApp, key: &str) {
    let reader = client(&app.base_url);
    for _ in 0..200 {
        match reader.key(key, KeyOperation::Charge).await {
            Ok(_) => {}
            Err(Error::Problem { problem }) if problem.code == "not_found" => return,
            Err(error) => panic!("reading the key: {error}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the key {key} outlived its retention");
}

async fn a_key_past_its_retention_is_sent_again_while_the_service_holds_it(backend: Backend) {
    // The service keeps keys for a day; this caller, told one second, asks about the key.
    let (card_sim, app) = with_card_sim(backend).await;
    let proxy = FaultProxy::start(&app).await;
    let dir = JournalDir::new();
    let journal = dir.path("journal");
    let args = charge_args("2200", &journal, &[]);

    let (key, stderr) = charge_with_every_answer_lost(&proxy, &args, &[]).await;
    assert!(stderr.contains(" before "), "until when: {stderr}");
    assert!(stderr.contains(&key), "{stderr}");
    let charged = proxy.take_answers();
    assert_eq!(card_sim.charges_created().await, 1);

    let told_one_second = [args.as_slice(), &["--key-retention-secs", "1"]].concat();
    let (code, answer, stderr) = run(&mut payments(&proxy.url, &told_one_second)).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("replayed by the service"), "{stderr}");
    assert_eq!(key_of(&stderr), key);
    assert_eq!(answer["id"], charged[0]["id"], "the first run's charge");
    let answers = proxy.take_answers();
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert_eq!(
        (&answers[0]["object"], &answers[0]["state"]),
        (&Value::from("idempotency_key"), &Value::from("completed")),
        "asked about the key first"
    );
    assert_eq!(card_sim.charges_created().await, 1);
}

async fn a_journal_entry_is_refused_to_another_tenant_and_another_service(backend: Backend) {
    let (card_sim, app) = with_card_sim(backend).await;
    let proxy = FaultProxy::start(&app).await;
    let dir = JournalDir::new();
    let journal = dir.path("journal");
    let args = charge_args("2300", &journal, &[]);
    let (code, _, stderr) = run(&mut payments(&proxy.url, &args)).await;
    assert_eq!(code, 0, "{stderr}");
    proxy.take_answers();

    // The same command with globex's key: acme's charge is not globex's answer.
    let mut globex = payments(&proxy.url, &args);
    globex.env("PAYMENTS_API_KEY", GLOBEX);
    let (code, stdout, stderr) = run(&mut globex).await;
    assert_eq!(code, 5, "{stderr}");
    assert_eq!(stdout, Value::Null);
    assert!(stderr.contains("another API key"), "{stderr}");
    assert!(
        !stderr.contains(GLOBEX),
        "the key is never printed: {stderr}"
    );

    // And against another service (here another address of the same one).
    let other = FaultProxy::start(&app).await;
    let (code, stdout, stderr) = run(&mut payments(&other.url, &args)).await;
    assert_eq!(code, 5, "{stderr}");
    assert_eq!(stdout, Value::Null);
    assert!(
        stderr.contains(&proxy.url),
        "names the journal's service: {stderr}"
    );

    assert!(proxy.take_answers().is_empty(), "nothing sent");
    assert!(other.take_answers().is_empty(), "nothing sent");
    assert_eq!(card_sim.charges_created().await, 1);
    let entries = entries(&journal);
    assert_eq!(entries.len(), 1);
    let recorded = entries[0].to_string();
    assert!(!recorded.contains(crate::helpers::ACME), "{recorded}");
}

/// Another origin, answering every request with a charge of one minor unit as the service
/// would store it; counts what it is sent.
struct Elsewhere {
    port: u16,
    requests: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Elsewhere {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Elsewhere {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&requests);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let mut stream = BufReader::new(stream);
                while read_message(&mut stream).await.is_some() {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let body = r#"{"id":"ch_elsewhere","object":"charge","amount":1,"currency":"usd","source":"tok_visa","description":null,"status":"succeeded","processor_charge_id":"x","amount_refunded":0,"created_at":"2026-12-01T12:00:00.000000Z"}"#;
                    let answer = format!(
                        "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\n\
                         idempotency-key-expires: Tue, 01 Dec 2099 12:00:00 GMT\r\n\
                         content-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.get_mut().write_all(answer.as_bytes()).await;
                }
            }
        });
        Self {
            port,
            requests,
            task,
        }
    }
}

async fn a_redirection_is_an_error_and_nothing_is_journaled(backend: Backend) {
    let (card_sim, app) = with_card_sim(backend).await;
    let proxy = FaultProxy::start(&app).await;
    let elsewhere = Elsewhere::start().await;
    let dir = JournalDir::new();
    let journal = dir.path("journal");
    let args = charge_args("2400", &journal, &[]);

    proxy.script(&[Fault::RedirectTo(elsewhere.port)]);
    let (code, stdout, stderr) = run(&mut payments(&proxy.url, &args)).await;
    assert_eq!(code, 5, "{stderr}");
    assert_eq!(stdout, Value::Null);
    assert!(stderr.contains("307"), "{stderr}");
    assert_eq!(
        elsewhere.requests.load(Ordering::SeqCst),
        0,
        "followed nowhere"
    );
    let key = journaled_key(&journal).await;
    assert!(
        entries(&journal)[0]["answer"].is_null(),
        "nothing journaled"
    );
    assert_eq!(card_sim.charges_created().await, 0);

    // Run again where nothing redirects, it makes the charge under its key, as sent.
    let (code, answer, stderr) = run(&mut payments(&proxy.url, &args)).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(key_of(&stderr), key);
    assert_eq!(answer["amount"], 2400);
    assert_eq!(entries(&journal)[0]["answer"]["body"]["amount"], 2400);
    assert_eq!(card_sim.charges_created().await, 1);
    assert!(proxy.script_done());
}

async fn the_journal_is_private_and_never_opened_through_a_link(backend: Backend) {
    let (card_sim, app) = with_card_sim(backend).await;
    let proxy = FaultProxy::start(&app).await;
    let dir = JournalDir::new();
    let journal = dir.path("journal");
    let (code, _, stderr) = run(&mut payments(
        &proxy.url,
        &charge_args("2500", &journal, &[]),
    ))
    .await;
    assert_eq!(code, 0, "{stderr}");
    let mode = std::fs::metadata(&journal)
        .expect("journal")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    proxy.take_answers();

    // A link in a journal's place, to a file another may read, is refused and left as it is.
    let target = dir.path("target");
    std::fs::write(&target, "").expect("target");
    let link = dir.path("link");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let (code, _, stderr) = run(&mut payments(&proxy.url, &charge_args("2600", &link, &[]))).await;
    assert_eq!(code, 5, "{stderr}");
    assert!(stderr.contains("symbolic link"), "{stderr}");
    assert_eq!(std::fs::read(&target).expect("target"), b"");
    assert!(proxy.take_answers().is_empty(), "nothing sent");
    assert_eq!(card_sim.charges_created().await, 1);
}
