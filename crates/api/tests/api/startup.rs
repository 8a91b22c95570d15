//! A wrong setting stops start-up with one line that names it, and a non-zero exit.

use std::process::Output;
use std::time::Duration;

use tokio::process::Command;

/// Runs the service and waits for it to exit; one that starts serving instead is killed (by
/// `kill_on_drop`) and fails the test.
async fn start_with(env: &[(&str, &str)]) -> Output {
    // An empty working directory: the default (embedded) database is created relative to it.
    let dir = std::env::temp_dir().join(format!(
        "payments-startup-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).expect("working directory");
    let child = Command::new(env!("CARGO_BIN_EXE_payments-api"))
        .current_dir(&dir)
        .env_clear()
        .env("PAYMENTS__SERVER__BIND", "127.0.0.1:0")
        .env("PAYMENTS__SERVER__METRICS_BIND", "127.0.0.1:0")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start payments-api");
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .unwrap_or_else(|_| {
            panic!("payments-api kept running with {env:?}; it should have refused to start")
        })
        .expect("wait for payments-api");
    let _ = std::fs::remove_dir_all(&dir);
    output
}

async fn assert_refused(env: &[(&str, &str)], names: &str) {
    let output = start_with(env).await;
    assert!(!output.status.success(), "{env:?} must stop start-up");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line, no backtrace: {stderr}");
    assert!(
        lines[0].contains(names),
        "the message names {names}: {stderr}"
    );
}

#[tokio::test]
async fn a_malformed_number_names_its_key() {
    assert_refused(
        &[("PAYMENTS__IDEMPOTENCY__TTL_SECS", "a day")],
        "idempotency.ttl_secs",
    )
    .await;
}

#[tokio::test]
async fn a_ttl_beyond_the_processor_key_window_is_refused() {
    assert_refused(
        &[
            ("PAYMENTS__IDEMPOTENCY__TTL_SECS", "172800"),
            ("PAYMENTS__PROCESSOR__KEY_WINDOW_SECS", "86400"),
        ],
        "processor.key_window_secs",
    )
    .await;
}

#[tokio::test]
async fn a_ttl_not_longer_than_the_lock_is_refused() {
    assert_refused(
        &[
            ("PAYMENTS__IDEMPOTENCY__TTL_SECS", "30"),
            ("PAYMENTS__IDEMPOTENCY__LOCK_TIMEOUT_SECS", "30"),
        ],
        "idempotency.lock_timeout_secs",
    )
    .await;
}

#[tokio::test]
async fn a_settle_grace_not_longer_than_the_processor_timeout_is_refused() {
    assert_refused(
        &[
            ("PAYMENTS__PROCESSOR__TIMEOUT_MS", "5000"),
            ("PAYMENTS__PROCESSOR__SETTLE_AFTER_MS", "5000"),
        ],
        "processor.settle_after_ms",
    )
    .await;
}

#[tokio::test]
async fn a_bad_bind_address_names_server_bind() {
    assert_refused(&[("PAYMENTS__SERVER__BIND", "localhost")], "server.bind").await;
}

#[tokio::test]
async fn a_database_url_of_another_kind_names_database_url() {
    assert_refused(
        &[("DATABASE_URL", "mysql://root@127.0.0.1/payments")],
        "database.url",
    )
    .await;
}

#[tokio::test]
async fn an_unreachable_database_names_database_url() {
    // Port 1 on loopback refuses connections at once.
    assert_refused(
        &[("DATABASE_URL", "postgres://postgres@127.0.0.1:1/payments")],
        "database.url",
    )
    .await;
}

#[tokio::test]
async fn a_plain_api_key_in_the_configuration_is_refused() {
    let dir =
        std::env::temp_dir().join(format!("payments-config-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("dir");
    let config = dir.join("payments.toml");
    std::fs::write(
        &config,
        "[[auth.api_keys]]\nkey = \"sk_live_plain\"\ntenant = \"initech\"\n",
    )
    .expect("write");
    assert_refused(
        &[("PAYMENTS_CONFIG", config.to_str().unwrap_or_default())],
        "key_sha256",
    )
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A configuration file with a syntax error used to stop start-up with the TOML parser's
/// message, which quotes the line at fault: a database password or the cache secret went to
/// the terminal and the deployment's log. The line names the file, the line and the key, never
/// the value, for a string left open and for a line that is no key at all.
#[tokio::test]
async fn a_config_file_with_a_syntax_error_is_named_by_line_and_key_without_its_value() {
    let dir = temp_dir("payments-broken-config");
    let secret = "SuperSecret-0123456789abcdef0123456789";
    for (text, line, key) in [
        (
            format!(
                "[database]\nmax_connections = 5\nurl = \"postgres://postgres:{secret}@db/payments\n"
            ),
            3,
            Some("database.url"),
        ),
        (
            format!("[redis]\nurl = \"\"\ncache_secret = \"{secret}\n"),
            3,
            Some("redis.cache_secret"),
        ),
        (format!("[redis]\n{secret} secret\n"), 2, None),
    ] {
        let config = dir.join("payments.toml");
        std::fs::write(&config, &text).expect("write");
        let path = config.to_str().unwrap_or_default();
        let output = start_with(&[("PAYMENTS_CONFIG", path)]).await;
        assert!(!output.status.success(), "{text} must stop start-up");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {stderr}");
        assert!(lines[0].contains("PAYMENTS_CONFIG: "), "{stderr}");
        assert!(lines[0].contains(path), "names the file: {stderr}");
        assert!(
            lines[0].contains(&format!("line {line}")),
            "names line {line}: {stderr}"
        );
        if let Some(key) = key {
            assert!(lines[0].contains(key), "names {key}: {stderr}");
        }
        assert!(
            !stderr.contains("SuperSecret"),
            "prints the value: {stderr}"
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            !stdout.contains("SuperSecret"),
            "prints the value: {stdout}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_database_url_without_a_scheme_names_database_url() {
    assert_refused(&[("DATABASE_URL", "payments.db")], "database.url").await;
}

#[tokio::test]
async fn a_sqlite_path_that_cannot_be_created_names_database_url() {
    // A regular file where the database's directory should be.
    let dir = temp_dir("payments-unusable");
    let file = dir.join("occupied");
    std::fs::write(&file, "not a directory").expect("write");
    let url = format!("sqlite://{}/payments.db", file.display());
    assert_refused(&[("DATABASE_URL", &url)], "database.url").await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_file_that_is_not_a_sqlite_database_names_database_url() {
    let dir = temp_dir("payments-not-a-database");
    let file = dir.join("payments.db");
    std::fs::write(
        &file,
        "this is not a database, only text long enough to be read as one",
    )
    .expect("write");
    let url = format!("sqlite://{}", file.display());
    assert_refused(&[("DATABASE_URL", &url)], "database.url").await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_wrong_type_in_the_config_file_names_its_key() {
    let dir = temp_dir("payments-config-type");
    let config = dir.join("payments.toml");
    std::fs::write(&config, "[server]\nbody_limit_bytes = \"lots\"\n").expect("write");
    assert_refused(
        &[("PAYMENTS_CONFIG", config.to_str().unwrap_or_default())],
        "server.body_limit_bytes",
    )
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_missing_config_file_names_payments_config() {
    assert_refused(
        &[("PAYMENTS_CONFIG", "/nonexistent/payments.toml")],
        "PAYMENTS_CONFIG",
    )
    .await;
}

#[tokio::test]
async fn a_zero_bound_names_its_key() {
    let redis = ("PAYMENTS__REDIS__URL", "redis://127.0.0.1:6379");
    for (key, variable) in [
        (
            "redis.stream_timeout_ms",
            "PAYMENTS__REDIS__STREAM_TIMEOUT_MS",
        ),
        ("redis.stream_max_len", "PAYMENTS__REDIS__STREAM_MAX_LEN"),
        (
            "workers.outbox_retention_secs",
            "PAYMENTS__WORKERS__OUTBOX_RETENTION_SECS",
        ),
        (
            "auth.rate_limit_per_sec",
            "PAYMENTS__AUTH__RATE_LIMIT_PER_SEC",
        ),
        ("auth.rate_limit_burst", "PAYMENTS__AUTH__RATE_LIMIT_BURST"),
    ] {
        assert_refused(&[redis, (variable, "0")], key).await;
    }
}

fn temp_dir(prefix: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("create a temporary directory");
    dir
}

#[tokio::test]
async fn redis_without_a_cache_secret_is_refused() {
    assert_refused(
        &[("PAYMENTS__REDIS__URL", "redis://127.0.0.1:6379")],
        "redis.cache_secret",
    )
    .await;
}

#[tokio::test]
async fn a_cache_secret_shorter_than_32_bytes_is_refused() {
    assert_refused(
        &[
            ("PAYMENTS__REDIS__URL", "redis://127.0.0.1:6379"),
            (
                "PAYMENTS__REDIS__CACHE_SECRET",
                "only-31-bytes-of-secret-0123456",
            ),
        ],
        "redis.cache_secret",
    )
    .await;
}

/// Sentinel needs its Sentinels, each as host:port, and is an alternative to `redis.url`, not
/// an addition: which of the two to use would be a guess.
#[tokio::test]
async fn a_sentinel_master_without_sentinels_or_beside_a_url_is_refused() {
    let master = ("PAYMENTS__REDIS__SENTINEL_MASTER", "payments");
    let no_url = ("PAYMENTS__REDIS__URL", "");
    for sentinels in ["", "127.0.0.1", "127.0.0.1:26379,:26380", "127.0.0.1:port"] {
        let sentinels = ("PAYMENTS__REDIS__SENTINELS", sentinels);
        assert_refused(&[master, no_url, sentinels], "redis.sentinels").await;
    }
    let sentinels = ("PAYMENTS__REDIS__SENTINELS", "127.0.0.1:26379");
    let url = ("PAYMENTS__REDIS__URL", "redis://127.0.0.1:6379");
    assert_refused(&[master, url, sentinels], "redis.sentinel_master").await;
}

/// The two passwords are the Sentinels' setting: a single Redis takes its password in its URL,
/// so a password beside `redis.url` would be a second, conflicting one.
#[tokio::test]
async fn a_redis_password_without_sentinels_is_refused() {
    let url = ("PAYMENTS__REDIS__URL", "redis://127.0.0.1:6379");
    for key in ["redis.password", "redis.sentinel_password"] {
        let variable = format!("PAYMENTS__{}", key.to_uppercase().replace('.', "__"));
        assert_refused(&[url, (&variable, "secret")], key).await;
    }
}

#[tokio::test]
async fn a_reconciliation_time_that_is_not_a_time_of_day_is_refused() {
    assert_refused(
        &[("PAYMENTS__WORKERS__RECONCILE_AT", "25:00")],
        "workers.reconcile_at",
    )
    .await;
}

#[tokio::test]
async fn an_operator_key_with_a_bad_name_or_a_tenants_hash_is_refused() {
    let dir = std::env::temp_dir();
    let tenant_hash = "0c24ce40313b1ce2b6daefa9dea10a4d3290af661123f6d499a3567b80d5ed49";
    for (name, hash) in [
        ("has space", &"ab".repeat(32)),
        ("ops", &tenant_hash.to_owned()),
    ] {
        let path = dir.join(format!(
            "payments-ops-{}.toml",
            uuid::Uuid::new_v4().simple()
        ));
        let toml = format!("[[auth.operator_keys]]\nkey_sha256 = \"{hash}\"\nname = \"{name}\"\n");
        std::fs::write(&path, toml).expect("write the configuration");
        let config = path.to_str().expect("a UTF-8 path");
        assert_refused(&[("PAYMENTS_CONFIG", config)], "auth.operator_keys").await;
        let _ = std::fs::remove_file(&path);
    }
}
