//! The public demo keys serve on loopback only, unless a deployment says otherwise out loud.

use std::process::Stdio;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::helpers::{ACME, GLOBEX};

/// A temporary directory, removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(prefix: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("create a temporary directory");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The service in an empty directory (the embedded SQLite default), with `env`.
fn service_command(dir: &TempDir, env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_payments-api"));
    command
        .current_dir(&dir.0)
        .env_clear()
        .env("PAYMENTS__SERVER__BIND", "127.0.0.1:0")
        .env("PAYMENTS__SERVER__METRICS_BIND", "127.0.0.1:0")
        .env("PAYMENTS__LOG__FORMAT", "text")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// A started service and every line it has printed on stdout and stderr.
struct Started {
    _child: Child,
    lines: Vec<String>,
    /// The API port, on loopback.
    base_url: String,
    _dir: TempDir,
}

/// Sends each line `pipe` prints, marked with its name, until it closes.
fn forward_lines(
    name: &'static str,
    pipe: impl AsyncRead + Unpin + Send + 'static,
    sender: mpsc::UnboundedSender<String>,
) {
    tokio::spawn(async move {
        let mut lines = BufReader::new(pipe).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = sender.send(format!("{name}: {line}"));
        }
    });
}

/// Starts the service and reads its output until it listens and `also` matched a line too;
/// fails with everything it printed if it exits or takes longer than a minute.
async fn start_and_read(env: &[(&str, &str)], also: impl Fn(&str) -> bool) -> Started {
    let dir = TempDir::new("payments-security");
    let mut child = service_command(&dir, env)
        .spawn()
        .expect("start payments-api");
    let (sender, mut receiver) = mpsc::unbounded_channel();
    forward_lines(
        "stdout",
        child.stdout.take().expect("piped"),
        sender.clone(),
    );
    forward_lines(
        "stderr",
        child.stderr.take().expect("piped"),
        sender.clone(),
    );
    drop(sender);
    let mut lines = Vec::new();
    let mut address = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    while address.is_none() || !lines.iter().any(|l: &String| also(l)) {
        match tokio::time::timeout_at(deadline, receiver.recv()).await {
            Ok(Some(line)) => {
                if line.contains("listening")
                    && let Some(rest) = line.split("address=").nth(1)
                {
                    address = rest
                        .split_whitespace()
                        .next()
                        .map(|a| a.trim_matches('"').to_owned());
                }
                lines.push(line);
            }
            // The output ended (the process exited) or the minute is up.
            Ok(None) | Err(_) => panic!(
                "payments-api with {env:?} did not start as expected; it printed:\n{}",
                lines.join("\n")
            ),
        }
    }
    let address: std::net::SocketAddr = address
        .unwrap_or_default()
        .parse()
        .expect("a socket address in the listening line");
    Started {
        _child: child,
        lines,
        base_url: format!("http://127.0.0.1:{}", address.port()),
        _dir: dir,
    }
}

/// The status of a `GET /charges` with `api_key` on a started service.
async fn list_status(base_url: &str, api_key: &str) -> u16 {
    crate::helpers::http_client()
        .get(format!("{base_url}/charges"))
        .bearer_auth(api_key)
        .send()
        .await
        .expect("GET /charges")
        .status()
        .as_u16()
}

/// The demo keys are published in the repository: on an address other hosts can reach, they
/// would let anyone charge as acme or globex. With the demo keys configured and a non-loopback
/// bind address, start-up is refused with one line naming the setting that allows it.
#[tokio::test]
async fn demo_keys_on_a_public_address_stop_start_up_naming_auth_allow_demo_keys() {
    let dir = TempDir::new("payments-demo-keys");
    let child = service_command(&dir, &[("PAYMENTS__SERVER__BIND", "0.0.0.0:0")])
        .spawn()
        .expect("start payments-api");
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("payments-api kept running with the demo keys on 0.0.0.0")
        .expect("wait for payments-api");
    assert!(!output.status.success(), "start-up must be refused");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line, no backtrace: {stderr}");
    assert!(
        lines[0].contains("auth.allow_demo_keys"),
        "the message names auth.allow_demo_keys: {stderr}"
    );
}

/// A deliberate choice stays possible (a demo on a shared network), but not a silent one:
/// with `auth.allow_demo_keys` the service starts on a public address and warns in its log
/// that the demo keys are in use.
#[tokio::test]
async fn demo_keys_on_a_public_address_start_when_allowed_and_are_warned_about() {
    let is_warning = |line: &str| line.contains("WARN") && line.to_lowercase().contains("demo");
    let started = start_and_read(
        &[
            ("PAYMENTS__SERVER__BIND", "0.0.0.0:0"),
            ("PAYMENTS__AUTH__ALLOW_DEMO_KEYS", "true"),
        ],
        is_warning,
    )
    .await;
    // The warning names every demo key that serves, the operator's that reads and resolves
    // every tenant's exceptions among them.
    let warning = started.lines.iter().find(|l| is_warning(l));
    for key in ["sk_test_acme", "sk_test_globex", "sk_test_ops"] {
        assert!(
            warning.is_some_and(|w| w.contains(key)),
            "the warning names {key}: {:?}",
            started.lines
        );
    }
    assert_eq!(list_status(&started.base_url, ACME).await, 200);
}

/// The check is about the demo keys, not about public addresses: a deployment that replaces
/// the key list in its config file starts on 0.0.0.0, its own key works and the demo keys
/// are gone (a config file's key list replaces the default one, it is not merged into it).
#[tokio::test]
async fn own_keys_on_a_public_address_start_and_the_demo_keys_are_gone() {
    let own_key = "sk_live_security_test_key";
    let config_dir = TempDir::new("payments-own-keys");
    let config = config_dir.0.join("payments.toml");
    std::fs::write(
        &config,
        format!(
            "[[auth.api_keys]]\nkey_sha256 = \"{}\"\ntenant = \"initech\"\n",
            hex::encode(Sha256::digest(own_key.as_bytes()))
        ),
    )
    .expect("write the config file");
    let started = start_and_read(
        &[
            ("PAYMENTS__SERVER__BIND", "0.0.0.0:0"),
            ("PAYMENTS_CONFIG", config.to_str().expect("a UTF-8 path")),
        ],
        |_| true,
    )
    .await;
    assert_eq!(list_status(&started.base_url, own_key).await, 200);
    assert_eq!(list_status(&started.base_url, ACME).await, 401);
    assert_eq!(list_status(&started.base_url, GLOBEX).await, 401);
    assert!(
        !started
            .lines
            .iter()
            .any(|l| l.contains("WARN") && l.to_lowercase().contains("demo")),
        "no demo key warning without demo keys: {:?}",
        started.lines
    );
}

// ---------------------------------------------------------------------------------------------
