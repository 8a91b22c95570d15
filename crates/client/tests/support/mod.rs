//! A server that answers from a script, for the tests of the client against what the service
//! (or whatever stands in front of it) may answer.

#![allow(dead_code, reason = "each test file uses what it needs of it")]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use payments_client::types::ChargeRequest;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// The charge every test sends: 100 minor units in USD, by the test card.
pub(crate) fn charge() -> ChargeRequest {
    ChargeRequest {
        amount: 100,
        currency: "usd".to_owned(),
        source: "tok_visa".to_owned(),
        description: None,
        capture: None,
    }
}

/// One scripted answer: status, extra headers, body. `None` holds the connection open
/// without answering.
pub(crate) type Scripted = Option<(u16, &'static str, &'static str)>;

/// A server answering from a script; it records the `Idempotency-Key` of every request, and
/// its `Prefer` when it has one, and every request's method and path.
pub(crate) struct ScriptedServer {
    pub(crate) url: String,
    pub(crate) keys: Arc<Mutex<Vec<String>>>,
    pub(crate) requests: Arc<Mutex<Vec<String>>>,
}

pub(crate) async fn serve(script: Vec<Scripted>) -> ScriptedServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let keys = Arc::new(Mutex::new(Vec::new()));
    let requests = Arc::new(Mutex::new(Vec::new()));
    let (seen, asked) = (Arc::clone(&keys), Arc::clone(&requests));
    let script = Arc::new(Mutex::new(VecDeque::from(script)));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (script, seen) = (Arc::clone(&script), Arc::clone(&seen));
            let asked = Arc::clone(&asked);
            tokio::spawn(async move {
                let mut stream = BufReader::new(stream);
                let (mut length, mut key) = (0, String::new());
                let mut request_line = String::new();
                loop {
                    let mut line = String::new();
                    if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    if request_line.is_empty() {
                        // "POST /charges HTTP/1.1": its method and path.
                        let words = line.split_whitespace();
                        request_line = words.take(2).collect::<Vec<_>>().join(" ");
                    }
                    let lower = line.to_ascii_lowercase();
                    if let Some(value) = lower.strip_prefix("content-length:") {
                        length = value.trim().parse().expect("length");
                    }
                    if lower.starts_with("idempotency-key:") {
                        key.insert_str(0, line["idempotency-key:".len()..].trim());
                    }
                    if lower.starts_with("prefer:") {
                        key.push_str(&format!(" ({})", line["prefer:".len()..].trim()));
                    }
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut body = vec![0; length];
                stream.read_exact(&mut body).await.expect("body");
                seen.lock().expect("keys").push(key);
                asked.lock().expect("requests").push(request_line);
                let next = script.lock().expect("script").pop_front().flatten();
                let Some((status, headers, body)) = next else {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    return;
                };
                let answer = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n{headers}\
                     content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.get_mut().write_all(answer.as_bytes()).await;
            });
        }
    });
    ScriptedServer {
        url,
        keys,
        requests,
    }
}
