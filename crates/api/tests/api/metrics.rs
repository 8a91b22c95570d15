//! `GET /metrics` (on the metrics listener, `server.metrics_bind`) is unauthenticated, and so
//! is every request it counts: nothing a client sends may become a label value, or each
//! request could add a series until the exporter runs out of memory.

use reqwest::Method;

use crate::helpers::{Backend, TestApp, metrics_text, spawn_app};

/// The sample lines of the exposition (one per series; `#` lines are help and type).
async fn series(app: &TestApp) -> usize {
    let text = metrics_text(&app.metrics_url).await;
    text.lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
        .count()
}

/// A request with a made-up method to a known route, a known route with an id, and no route.
async fn send_junk(app: &TestApp, method: &str, n: usize) {
    let method = Method::from_bytes(method.as_bytes()).expect("a valid extension method");
    let path = match n % 3 {
        0 => "/charges".to_owned(),
        1 => format!("/charges/junk-{n}"),
        _ => format!("/no/such/path/{n}"),
    };
    let response = app
        .client
        .request(method, app.url(&path))
        .send()
        .await
        .expect("send");
    assert!(response.status().is_client_error(), "{path}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_methods_and_paths_add_no_metric_series() {
    let app = spawn_app(Backend::Postgres).await;
    // Once per shape of request, so the series a legitimate junk request adds (its route or
    // `unmatched`, method `other`, its status) exist before counting.
    for n in 0..3 {
        send_junk(&app, "WARMUP", n).await;
    }
    series(&app).await;
    let before = series(&app).await;

    for n in 1..=300 {
        send_junk(&app, &format!("JUNK{n}"), n).await;
    }

    let after = series(&app).await;
    // A handful of slack for series the background workers may add meanwhile.
    assert!(
        after <= before + 10,
        "300 junk requests grew the exposition from {before} to {after} series"
    );
}
