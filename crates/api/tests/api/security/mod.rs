//! Attacks on the service's edges: a replay cache an attacker can write to, card numbers where
//! tokens belong, bodies of the wrong shape, demo keys on a public address, metrics on the API
//! port, request ids that forge log lines, ambiguous credentials, readable database files, one
//! tenant starving the others of the in-flight limit or with its request rate, connections
//! that never finish a request, and requests that grow memory. Each test names the guarantee;
//! its doc comment names the attack it stops.

mod cache;
mod card_numbers;
mod connections;
mod demo_keys;
mod headers;
mod in_flight;
mod input;
mod memory;
mod rate_limit;

use reqwest::Response;
use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::net::tcp::OwnedReadHalf;

use crate::helpers::TestApp;

/// A response header as text.
fn header(response: &Response, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Where the service listens, for a raw socket.
fn address_of(app: &TestApp) -> &str {
    app.base_url.trim_start_matches("http://")
}

/// Reads one HTTP answer: its head and a `Content-Length` body, or everything until the
/// connection closes.
async fn read_answer(reader: &mut OwnedReadHalf) -> String {
    let mut answer = Vec::new();
    let mut buffer = [0_u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&answer).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n")
            && let Some(length) =
                header_of(head, "content-length").and_then(|l| l.parse::<usize>().ok())
            && body.len() >= length
        {
            return text;
        }
        match reader.read(&mut buffer).await {
            Ok(0) | Err(_) => return text,
            Ok(n) => answer.extend_from_slice(&buffer[..n]),
        }
    }
}

/// The status of a raw HTTP answer.
fn status_of(answer: &str) -> Option<u16> {
    answer.split_whitespace().nth(1)?.parse().ok()
}

/// A header of a raw HTTP answer.
fn header_of(answer: &str, name: &str) -> Option<String> {
    let head = answer.split("\r\n\r\n").next()?;
    head.lines().skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim()
            .eq_ignore_ascii_case(name)
            .then(|| value.trim().to_owned())
    })
}

/// The problem `code` of a raw HTTP answer.
fn code_of(answer: &str) -> Option<String> {
    let body: Value = serde_json::from_str(answer.split_once("\r\n\r\n")?.1).ok()?;
    body["code"].as_str().map(str::to_owned)
}
