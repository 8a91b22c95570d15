//! The embedded mode a newcomer meets first: `cargo run` with nothing configured stores its
//! data in `./data/payments.db`, charges through the in-process simulator and needs no Redis.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::helpers::{ACME, Service, http_client, new_key, snapshot, visa, workspace_binary};

/// An empty working directory, removed afterwards.
struct EmptyDir(PathBuf);

impl EmptyDir {
    fn new() -> Self {
        let dir =
            std::env::temp_dir().join(format!("payments-fresh-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("create the working directory");
        Self(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for EmptyDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn post_charge(service: &Service, key: &str) -> (u16, Vec<Option<String>>, Vec<u8>) {
    snapshot(
        service.post_charge(key, &visa(2500)).await,
        &["content-type", "idempotent-replayed"],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nothing_configured_the_service_charges_and_replays_on_sqlite() {
    let dir = EmptyDir::new();
    let (service, started) = Service::start_embedded(dir.path()).await;
    for says in [
        "database=sqlite at data/payments.db",
        "processor=in-process simulator",
        "redis=disabled",
    ] {
        assert!(
            started.contains(says),
            "the start-up line says {says:?}: {started}"
        );
    }
    assert!(
        dir.path().join("data/payments.db").is_file(),
        "the database file is created under the working directory"
    );

    let key = new_key();
    let (status, headers, body) = post_charge(&service, &key).await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    assert_eq!(headers[1], None, "a first execution is not a replay");
    let replay = post_charge(&service, &key).await;
    assert_eq!(
        replay,
        (
            201,
            vec![headers[0].clone(), Some("true".into())],
            body.clone()
        ),
        "the replay is the same response, marked as replayed"
    );

    // The data outlives the process: a restart in the same directory replays the same bytes.
    drop(service);
    let (restarted, _) = Service::start_embedded(dir.path()).await;
    let after_restart = post_charge(&restarted, &key).await;
    assert_eq!(after_restart.0, 201);
    assert_eq!(after_restart.2, body, "the same charge, not a new one");
    let list: Value = http_client()
        .get(restarted.url("/charges"))
        .bearer_auth(ACME)
        .send()
        .await
        .expect("GET /charges")
        .json()
        .await
        .expect("a charge list");
    assert_eq!(
        list["data"].as_array().map(Vec::len),
        Some(1),
        "exactly one charge was made: {list}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_script_walks_the_embedded_service_through_the_state_machine() {
    let dir = EmptyDir::new();
    let (service, _) = Service::start_embedded(dir.path()).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/demo.sh");
    let output = tokio::process::Command::new("bash")
        .arg(&script)
        .arg(&service.base_url)
        .env("PAYMENTS_CLI", workspace_binary("payments"))
        .output()
        .await
        .expect("run scripts/demo.sh");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "demo.sh failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("all 13 steps passed"),
        "demo.sh reports every step:\n{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_memory_database_serves_and_replays() {
    let service = Service::start("sqlite::memory:", &[("PAYMENTS__REDIS__URL", "")]).await;
    let key = new_key();
    let (status, _, body) = post_charge(&service, &key).await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    // The pool keeps its connection open: every request sees the same in-memory database.
    for _ in 0..3 {
        let replay = post_charge(&service, &key).await;
        assert_eq!((replay.0, replay.1[1].as_deref()), (201, Some("true")));
        assert_eq!(replay.2, body);
    }
}
