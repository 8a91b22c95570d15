//! What a client controls in headers and what the service exposes: metrics off the API port,
//! request ids that cannot forge log lines, exactly one `Authorization`, and database files
//! only the service's user can read.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::{address_of, header, header_of, read_answer, status_of};
use crate::helpers::{
    ACME, Backend, Footprint, GLOBEX, Service, TestDatabase, new_key, problem, spawn_app, visa,
};

/// The metrics name routes, tenants' traffic and internal errors; on the API port anyone who
/// can reach the API could read them. `/metrics` is not a route of the API port, with or
/// without an API key; the service's own metrics listener serves it.
async fn metrics_are_served_on_their_own_listener_only(backend: Backend) {
    let app = spawn_app(backend).await;
    let anonymous = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .expect("GET /metrics");
    let (status, body) = problem(anonymous).await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));
    let (status, body) = problem(app.get(ACME, "/metrics").await).await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));

    let response = app
        .client
        .get(&app.metrics_url)
        .send()
        .await
        .expect("GET the metrics listener");
    assert_eq!(response.status().as_u16(), 200);
    assert!(
        header(&response, "content-type").is_some_and(|t| t.starts_with("text/plain")),
        "{:?}",
        response.headers()
    );
    let text = response.text().await.expect("metrics text");
    assert!(text.contains("http_requests_total"), "{text}");
}

/// The request id is written into every log line of the request. A client-chosen id that is
/// not a UUID could forge log content (`abc} charge created charge.id=ch_x`) or collide with
/// another request's id; such an id is replaced by a fresh UUID, and a UUID is kept as sent so
/// that clients can correlate.
async fn a_uuid_request_id_is_kept_and_anything_else_is_replaced_by_a_fresh_one(backend: Backend) {
    let app = spawn_app(backend).await;
    let request_id = |sent: &'static str| {
        let request = app
            .client
            .get(app.url("/charges"))
            .bearer_auth(ACME)
            .header("X-Request-Id", sent);
        async move {
            let response = request.send().await.expect("GET /charges");
            assert_eq!(response.status().as_u16(), 200, "{sent:?}");
            header(&response, "x-request-id").expect("an x-request-id on every response")
        }
    };
    let uuid = "6f1c2e4a-9b3d-4c5e-8f70-1a2b3c4d5e6f";
    assert_eq!(request_id(uuid).await, uuid);

    let mut fresh = Vec::new();
    for sent in ["abc} charge created charge.id=ch_x", "not-a-uuid"] {
        let answered = request_id(sent).await;
        assert!(
            uuid::Uuid::parse_str(&answered).is_ok(),
            "{sent:?} came back as {answered:?}"
        );
        assert_ne!(answered, sent);
        fresh.push(answered);
    }
    assert_ne!(fresh[0], fresh[1], "each replacement is a new id");
    assert!(!fresh.iter().any(|id| id == uuid));
}

/// An obsolete line folding (a header line continued on a line starting with a space) is how
/// a header value could carry a line break into the logs. Such a request is refused (400), or
/// its request id replaced by a fresh UUID; the sent text never comes back.
async fn a_folded_request_id_never_comes_back(backend: Backend) {
    let app = spawn_app(backend).await;
    let request = format!(
        "GET /charges HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {ACME}\r\n\
         X-Request-Id: abc\r\n charge created charge.id=ch_x\r\nConnection: close\r\n\r\n"
    );
    let mut stream = TcpStream::connect(address_of(&app)).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("write");
    let (mut reader, _writer) = stream.into_split();
    let answer = tokio::time::timeout(Duration::from_secs(10), read_answer(&mut reader))
        .await
        .expect("an answer");
    let status = status_of(&answer);
    if status != Some(400) {
        let id = header_of(&answer, "x-request-id").unwrap_or_default();
        assert!(
            uuid::Uuid::parse_str(&id).is_ok() && !id.contains("abc") && !id.contains("charge"),
            "a folded request id came back: {answer}"
        );
    }
    assert!(!answer.contains("charge.id=ch_x"), "{answer}");
}

/// Two `Authorization` headers are ambiguous: a proxy may check one and the service use the
/// other. Whether they name the same key or two tenants' keys, the request is refused with 400
/// `invalid_authorization`, and nothing is read or stored under either tenant.
async fn two_authorization_headers_are_400_invalid_authorization(backend: Backend) {
    let app = spawn_app(backend).await;
    for (first, second) in [(ACME, ACME), (ACME, GLOBEX), (GLOBEX, ACME)] {
        let response = app
            .client
            .get(app.url("/charges"))
            .header("Authorization", format!("Bearer {first}"))
            .header("Authorization", format!("Bearer {second}"))
            .send()
            .await
            .expect("GET /charges");
        let (status, body) = problem(response).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (400, Some("invalid_authorization")),
            "{first} and {second}"
        );
    }
    let key = new_key();
    let charge = app
        .client
        .post(app.url("/charges"))
        .header("Authorization", format!("Bearer {ACME}"))
        .header("Authorization", format!("Bearer {GLOBEX}"))
        .header("Idempotency-Key", &key)
        .json(&visa(100))
        .send()
        .await
        .expect("POST /charges");
    let (status, body) = problem(charge).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_authorization"))
    );
    assert_eq!(app.footprint().await, Footprint::EMPTY);
}

/// The SQLite database holds every charge and idempotency record. Created with the usual
/// umask it would be world-readable on a shared host; the database file and its `-wal` and
/// `-shm` files are the owner's only (0600).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_files_are_readable_and_writable_by_their_owner_only() {
    let app = spawn_app(Backend::Sqlite).await;
    app.charged(100, "tok_visa").await;
    let path = app
        .database
        .url
        .strip_prefix("sqlite://")
        .expect("a sqlite URL")
        .to_owned();
    for file in [path.clone(), format!("{path}-wal"), format!("{path}-shm")] {
        let mode = std::fs::metadata(&file)
            .unwrap_or_else(|e| panic!("{file}: {e}"))
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{file} has mode {:o}", mode & 0o777);
    }
}

/// A database file left world-readable (created by an older version, or by hand) is narrowed
/// to its owner when the service starts on it, not left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_world_readable_sqlite_file_is_narrowed_to_its_owner() {
    let database = TestDatabase::create(Backend::Sqlite).await;
    let path = database
        .url
        .strip_prefix("sqlite://")
        .expect("a sqlite URL")
        .to_owned();
    let dir = std::path::Path::new(&path).parent().expect("a directory");
    std::fs::create_dir_all(dir).expect("create the directory");
    std::fs::write(&path, b"").expect("create the file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let _service = Service::start(&database.url, &[]).await;
    let mode = std::fs::metadata(&path)
        .expect("metadata")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{path} has mode {:o}", mode & 0o777);
}

// ---------------------------------------------------------------------------------------------

on_every_backend!(
    metrics_are_served_on_their_own_listener_only,
    a_uuid_request_id_is_kept_and_anything_else_is_replaced_by_a_fresh_one,
    a_folded_request_id_never_comes_back,
    two_authorization_headers_are_400_invalid_authorization,
);
