//! The listener's edge: connections that never finish a request, and more connections than one
//! instance keeps open.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::{address_of, read_answer, status_of};
use crate::helpers::{Backend, metrics_text, spawn_app_with};

/// A GET of `/healthz` on a keep-alive connection.
const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n";

/// Waits until the server closes `stream` (a read sees the end, or an error) or `deadline`
/// passes; whether it closed.
async fn closed_by(stream: &mut TcpStream, deadline: Instant) -> bool {
    let mut buffer = [0_u8; 1024];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            // Whatever the server answers before it closes (a 408, say) is not the close.
            Ok(Ok(_)) => continue,
        }
    }
}

/// One client opening thousands of connections and never finishing a request on them would
/// otherwise hold a descriptor and a task each for ever, until the instance could accept no
/// one. With a header timeout of one second, 1,500 connections that send nothing and 1,500
/// that stop midway through their request head are all closed soon after it, and meanwhile
/// the service still answers everyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_half_sent_connections_are_closed_after_the_header_timeout() {
    const TIMEOUT: Duration = Duration::from_secs(1);
    let app = spawn_app_with(
        Backend::Postgres,
        &[("PAYMENTS__SERVER__HEADER_READ_TIMEOUT_MS", "1000")],
    )
    .await;
    let opened = Instant::now();
    let mut connections = Vec::new();
    for i in 0..3_000 {
        let mut stream = TcpStream::connect(address_of(&app)).await.expect("connect");
        if i % 2 == 1 {
            let half = b"POST /charges HTTP/1.1\r\nHost: test\r\nAuthorization: Bea";
            stream.write_all(half).await.expect("write half a head");
        }
        connections.push(stream);
    }
    let healthz = app.client.get(app.url("/healthz")).send().await;
    assert_eq!(healthz.map(|r| r.status().as_u16()).ok(), Some(200));

    let deadline = Instant::now() + TIMEOUT + Duration::from_secs(20);
    let mut still_open = 0;
    for stream in &mut connections {
        if !closed_by(stream, deadline).await {
            still_open += 1;
        }
    }
    assert_eq!(still_open, 0, "connections the header timeout left open");
    assert!(
        opened.elapsed() >= TIMEOUT,
        "closed before the timeout: {:?}",
        opened.elapsed()
    );
    let after = app.client.get(app.url("/healthz")).send().await;
    assert_eq!(after.map(|r| r.status().as_u16()).ok(), Some(200));
}

/// Beyond `server.max_connections`, a new connection is closed as soon as it is accepted
/// (counted in `http_connections_refused_total`), and the connections already open keep
/// working; once one of them closes, its slot serves a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_are_refused_and_the_open_ones_keep_working() {
    let app = spawn_app_with(
        Backend::Postgres,
        &[("PAYMENTS__SERVER__MAX_CONNECTIONS", "20")],
    )
    .await;
    let mut open = Vec::new();
    for _ in 0..20 {
        let stream = TcpStream::connect(address_of(&app)).await.expect("connect");
        let (mut reader, mut writer) = stream.into_split();
        writer.write_all(HEALTHZ).await.expect("write");
        assert_eq!(status_of(&read_answer(&mut reader).await), Some(200));
        open.push((reader, writer));
    }

    let mut refused = TcpStream::connect(address_of(&app)).await.expect("connect");
    let _ = refused.write_all(HEALTHZ).await;
    assert!(
        closed_by(&mut refused, Instant::now() + Duration::from_secs(10)).await,
        "the 21st connection was served"
    );
    let metrics = metrics_text(&app.metrics_url).await;
    assert!(
        metrics.contains("http_connections_refused_total 1"),
        "{metrics}"
    );

    for (reader, writer) in &mut open {
        writer.write_all(HEALTHZ).await.expect("write");
        assert_eq!(
            status_of(&read_answer(reader).await),
            Some(200),
            "an open connection"
        );
    }

    // One connection closes; its slot comes back once the service has seen the close.
    drop(open.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stream = TcpStream::connect(address_of(&app)).await.expect("connect");
        let (mut reader, mut writer) = stream.into_split();
        let _ = writer.write_all(HEALTHZ).await;
        if status_of(&read_answer(&mut reader).await) == Some(200) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the closed connection's slot never came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
