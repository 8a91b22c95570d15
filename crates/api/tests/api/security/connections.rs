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
    // On a new connection: the client's pooled one sat idle past the header timeout too, and
    // the service closed it like the others (sent on it, the request could meet that close).
    let fresh = reqwest::Client::new();
    let after = fresh.get(app.url("/healthz")).send().await;
    assert_eq!(after.map(|r| r.status().as_u16()).ok(), Some(200));
}

/// The client preface every HTTP/2 connection starts with (RFC 9113, 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// An HTTP/2 frame's 9-byte header: the length of its payload, its type, flags and stream.
fn frame_header(length: u32, kind: u8, flags: u8, stream: u32) -> Vec<u8> {
    let mut header = length.to_be_bytes()[1..].to_vec();
    header.extend([kind, flags]);
    header.extend(stream.to_be_bytes());
    header
}

/// Whatever arrives on `stream` until the server closes it or `deadline` passes, and whether
/// it closed.
async fn read_until_closed(stream: &mut TcpStream, deadline: Instant) -> (Vec<u8>, bool) {
    let (mut received, mut buffer) = (Vec::new(), [0_u8; 1024]);
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Err(_) => return (received, false),
            Ok(Ok(0) | Err(_)) => return (received, true),
            Ok(Ok(n)) => received.extend_from_slice(&buffer[..n]),
        }
    }
}

/// The listener speaks HTTP/2 too (cleartext, with prior knowledge), and hyper bounds only
/// HTTP/1's request head: connections that sent half the HTTP/2 preface, or the preface and
/// SETTINGS, or half a HEADERS frame, were still open after 150 s, and as many of them as
/// `server.max_connections` locked everyone out. With a cap of 40 connections and a header
/// timeout of 3 s, 8 connections of each of those openings and of HTTP/1's (nothing sent,
/// half a head) hold every slot, so that a 41st is refused unanswered; every one of them is
/// closed after the timeout and within a few seconds of it, and then both protocols are
/// answered. The server's SETTINGS cap the streams of one connection at 100.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_of_either_protocol_that_never_finish_a_request_are_closed() {
    const TIMEOUT: Duration = Duration::from_secs(3);
    const EACH: usize = 8;
    let settings = frame_header(0, 0x4, 0, 0);
    // HEADERS (type 1, END_STREAM | END_HEADERS) on stream 1 announcing 64 bytes, 2 sent.
    let half_headers = [frame_header(64, 0x1, 0x5, 1), vec![0x82, 0x86]].concat();
    let openings: [(&str, Vec<u8>); 5] = [
        ("HTTP/2, half a preface", PREFACE[..16].to_vec()),
        (
            "HTTP/2, preface and SETTINGS",
            [PREFACE, &settings].concat(),
        ),
        (
            "HTTP/2, half a HEADERS frame",
            [PREFACE, &settings, &half_headers].concat(),
        ),
        ("HTTP/1, nothing", Vec::new()),
        (
            "HTTP/1, half a head",
            b"POST /charges HTTP/1.1\r\nHost: test\r\nAuthorization: Bea".to_vec(),
        ),
    ];
    let cap = (openings.len() * EACH).to_string();
    let app = spawn_app_with(
        Backend::Postgres,
        &[
            ("PAYMENTS__SERVER__HEADER_READ_TIMEOUT_MS", "3000"),
            ("PAYMENTS__SERVER__MAX_CONNECTIONS", cap.as_str()),
        ],
    )
    .await;
    let opened = Instant::now();
    let mut held = Vec::new();
    for (opening, bytes) in &openings {
        for _ in 0..EACH {
            let mut stream = TcpStream::connect(address_of(&app)).await.expect("connect");
            stream.write_all(bytes).await.expect("write the opening");
            held.push((*opening, stream));
        }
    }

    // Every slot is held: one more connection is closed without an answer.
    let mut refused = TcpStream::connect(address_of(&app)).await.expect("connect");
    let _ = refused.write_all(HEALTHZ).await;
    let (answer, closed) = read_until_closed(&mut refused, Instant::now() + TIMEOUT).await;
    assert!(
        closed && answer.is_empty(),
        "a connection beyond the cap was answered: {}",
        String::from_utf8_lossy(&answer)
    );

    let deadline = opened + TIMEOUT + Duration::from_secs(5);
    let mut still_open = Vec::new();
    let mut server_settings = Vec::new();
    for (opening, stream) in &mut held {
        let (received, closed) = read_until_closed(stream, deadline).await;
        if !closed {
            still_open.push(*opening);
        }
        if *opening == "HTTP/2, preface and SETTINGS" {
            server_settings = received;
        }
    }
    assert_eq!(
        still_open,
        Vec::<&str>::new(),
        "left open after the timeout"
    );
    assert!(
        opened.elapsed() >= TIMEOUT,
        "closed before the timeout: {:?}",
        opened.elapsed()
    );
    // The server's first frame is its SETTINGS (type 4 on stream 0), which holds
    // SETTINGS_MAX_CONCURRENT_STREAMS (3) = 100.
    assert_eq!(server_settings.get(3..9), Some(&[4, 0, 0, 0, 0, 0][..]));
    let length = usize::from(server_settings[2]) | usize::from(server_settings[1]) << 8;
    let caps_streams = server_settings[9..9 + length]
        .chunks(6)
        .any(|setting| setting == [0, 3, 0, 0, 0, 100]);
    assert!(caps_streams, "SETTINGS {server_settings:?}");

    let http1 = app.client.get(app.url("/healthz")).send().await;
    assert_eq!(http1.map(|r| r.status().as_u16()).ok(), Some(200));
    let http2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .expect("an HTTP/2 client")
        .get(app.url("/healthz"))
        .send()
        .await
        .expect("an HTTP/2 request");
    assert_eq!(
        (http2.version(), http2.status().as_u16()),
        (reqwest::Version::HTTP_2, 200)
    );
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
