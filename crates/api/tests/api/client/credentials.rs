//! The `payments` command line's credentials: the API key is taken from a file or the
//! environment, and one given in its arguments, where every user of the machine can read it, is
//! warned about; a base URL's user-info is shown nowhere.

use std::process::Stdio;

use serde_json::Value;
use tokio::process::Command;

use super::run;
use crate::helpers::{ACME, Backend, spawn_app, workspace_binary};

on_every_backend!(the_api_key_is_kept_out_of_the_process_list_and_no_url_shows_its_user_info);

async fn the_api_key_is_kept_out_of_the_process_list_and_no_url_shows_its_user_info(
    backend: Backend,
) {
    let app = spawn_app(backend).await;
    let bare = || {
        let mut command = Command::new(workspace_binary("payments"));
        command
            .env_clear()
            .env("PAYMENTS_BASE_URL", &app.base_url)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        command
    };
    let warned = |stderr: &str| stderr.contains("warning") && stderr.contains("process list");

    // From a file: the key is nowhere in the command line.
    let dir = std::env::temp_dir().join(format!("payments-key-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    let key_file = dir.join("api-key");
    std::fs::write(&key_file, format!("{ACME}\n")).expect("key file");
    let from_file = [
        "balance",
        "--api-key-file",
        key_file.to_str().expect("UTF-8"),
    ];
    let (code, balance, stderr) = run(bare().args(from_file)).await;
    assert_eq!(
        (code, &balance["object"]),
        (0, &Value::from("balance")),
        "{stderr}"
    );
    assert!(!warned(&stderr), "{stderr}");
    // From the environment, as every other test gives it: no warning either.
    let (code, _, stderr) = run(bare().env("PAYMENTS_API_KEY", ACME).arg("balance")).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(!warned(&stderr), "{stderr}");
    // In argv, where every user of the machine sees it: it still works, with a warning.
    let (code, _, stderr) = run(bare().args(["balance", "--api-key", ACME])).await;
    assert_eq!(code, 0, "{stderr}");
    assert!(warned(&stderr), "{stderr}");
    std::fs::remove_dir_all(dir).expect("clean up");

    // A base URL's user-info is a credential: neither --help nor an error shows it.
    let with_user_info = "http://operator:hunter2@127.0.0.1:9";
    let (code, _, stderr) = run(bare()
        .env("PAYMENTS_BASE_URL", with_user_info)
        .env("PAYMENTS_API_KEY", ACME)
        .arg("balance"))
    .await;
    assert_eq!(code, 5, "{stderr}");
    assert!(stderr.contains("user-info"), "{stderr}");
    let help = bare()
        .env("PAYMENTS_BASE_URL", with_user_info)
        .arg("--help")
        .output()
        .await
        .expect("payments --help");
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    assert!(help.contains("PAYMENTS_BASE_URL"), "{help}");
    for shown in [&help, &stderr] {
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}
