//! Memory that a client's requests could grow without bound.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::address_of;
use crate::helpers::{Backend, TestApp, spawn_app_with};

/// Sends `n` GETs of `/healthz` over each of `connections` keep-alive connections, pipelined
/// in batches, and waits for every answer.
async fn healthz_requests(app: &TestApp, connections: usize, n: usize) {
    const BATCH: usize = 500;
    const STATUS_LINE: &[u8] = b"HTTP/1.1 200 OK";
    let request = b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n";
    let tasks: Vec<_> = (0..connections)
        .map(|_| {
            let address = address_of(app).to_owned();
            tokio::spawn(async move {
                let mut stream = TcpStream::connect(&address).await.expect("connect");
                let mut buffer = vec![0_u8; 64 * 1024];
                let mut sent = 0;
                while sent < n {
                    let batch = BATCH.min(n - sent);
                    stream
                        .write_all(&request.repeat(batch))
                        .await
                        .expect("write");
                    let mut answered = 0;
                    // The bytes of a status line that may go on in the next read.
                    let mut carried = Vec::new();
                    while answered < batch {
                        let read = stream.read(&mut buffer).await.expect("read");
                        assert!(read > 0, "the service closed the connection");
                        carried.extend_from_slice(&buffer[..read]);
                        answered += count(&carried, STATUS_LINE);
                        let keep = carried.len().min(STATUS_LINE.len() - 1);
                        carried.drain(..carried.len() - keep);
                    }
                    sent += batch;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("join");
    }
}

/// How many times `needle` stands in `haystack`.
fn count(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .filter(|w| *w == needle)
        .count()
}

/// A deployment that nobody scrapes (`cargo run`, or no Prometheus yet) would otherwise keep
/// every request's latency sample until a scrape that never comes: 16 to 19 bytes a request,
/// 1.6 GB a day at 1,000 requests a second. The recorder's upkeep folds the samples into
/// their buckets every second, so 1,000,000 requests after a warm-up leave the resident size
/// where it was, within 8 MiB: the allocator keeps freed pages for reuse, more of them when
/// other tests load the machine (up to 3,160 KiB seen with the other security tests running
/// beside it). With the upkeep removed it grew by 21,668 KiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_flat_with_nobody_scraping_the_metrics() {
    let app = spawn_app_with(Backend::Sqlite, &[]).await;
    healthz_requests(&app, 8, 10_000).await;
    let before = app.resident_kib();
    healthz_requests(&app, 8, 125_000).await;
    let after = app.resident_kib();
    assert!(
        after.saturating_sub(before) < 8 * 1024,
        "resident size grew from {before} KiB to {after} KiB over 1,000,000 requests"
    );
}
