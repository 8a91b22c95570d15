//! One attempt against a receiver of the test's own, over real HTTP on loopback (allow-listed,
//! as the tests and the demo allow it): what each way an endpoint can answer, or fail to,
//! comes to, and that what arrives carries the event's id and verifies with the secret.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use payments_client::webhooks::Verifier;
use payments_domain::{AddressPolicy, EndpointUrl};
use payments_webhooks::{Attempt, Delivery, EXCERPT_BYTES, Outcome, Secret, attempt, guard};
use tokio::net::TcpListener;

const BODY: &[u8] = br#"{"id":"evt_1","type":"payment.completed"}"#;

/// A receiver on loopback, answering by path; its address.
async fn receiver(secret: &Secret) -> SocketAddr {
    let verifier = Arc::new(Verifier::new(&secret.expose()).unwrap_or_else(|e| panic!("{e}")));
    let verifies = move |headers: HeaderMap, body: Bytes| {
        let verifier = Arc::clone(&verifier);
        async move {
            match verifier.verify(&headers, &body, chrono::Utc::now()) {
                Ok(verified) if verified.webhook_id == "evt_1" => StatusCode::NO_CONTENT,
                _ => StatusCode::BAD_REQUEST,
            }
        }
    };
    let app = Router::new()
        .route("/ok", post(verifies))
        .route(
            "/fail",
            post(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "boom") }),
        )
        .route("/gone", post(|| async { StatusCode::GONE }))
        .route(
            "/busy",
            post(|| async { (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "7")]) }),
        )
        .route(
            "/moved",
            post(|| async { (StatusCode::FOUND, [("location", "/ok")]).into_response() }),
        )
        .route(
            "/slow",
            post(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                StatusCode::OK
            }),
        )
        .route(
            "/big",
            post(|| async { (StatusCode::BAD_GATEWAY, "é".repeat(100_000)) }),
        );
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let address = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    address
}

/// A listener that accepts each connection and closes it at once, answering nothing.
async fn resetting() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let address = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            drop(stream);
        }
    });
    address
}

fn loopback() -> AddressPolicy {
    let nets = ["127.0.0.0/8", "::1/128"].map(|net| net.parse().unwrap_or_else(|e| panic!("{e}")));
    AddressPolicy::allowing(nets.to_vec())
}

async fn send(policy: AddressPolicy, url: &str, secret: &Secret) -> Attempt {
    let policy = Arc::new(policy);
    let client = guard::client(Arc::clone(&policy), Duration::from_millis(500))
        .unwrap_or_else(|e| panic!("{e}"));
    let url = EndpointUrl::parse(url).unwrap_or_else(|e| panic!("{e}"));
    let delivery = Delivery {
        webhook_id: "evt_1",
        body: BODY,
    };
    attempt(&client, &policy, &url, &[secret], delivery).await
}

fn retried(attempt: &Attempt) -> (&str, Option<Duration>) {
    match &attempt.outcome {
        Outcome::Retry {
            reason,
            retry_after,
        } => (reason.as_str(), *retry_after),
        other => panic!("not a retry: {other:?}"),
    }
}

#[tokio::test]
async fn a_signed_delivery_is_delivered_and_verifies_with_the_secret() {
    let secret = Secret::generate();
    let address = receiver(&secret).await;
    let sent = send(loopback(), &format!("http://{address}/ok"), &secret).await;
    assert_eq!((sent.outcome, sent.status), (Outcome::Delivered, Some(204)));
    // Signed with another secret, the receiver refuses it: the signature is what it checks.
    let other = send(
        loopback(),
        &format!("http://{address}/ok"),
        &Secret::generate(),
    )
    .await;
    assert_eq!(other.status, Some(400));
}

#[tokio::test]
async fn every_failure_is_retried_and_only_gone_is_final() {
    let secret = Secret::generate();
    let address = receiver(&secret).await;
    let at = |path: &str| format!("http://{address}{path}");

    let failed = send(loopback(), &at("/fail"), &secret).await;
    assert_eq!(failed.status, Some(500));
    assert_eq!(failed.excerpt, "boom");
    assert_eq!(
        retried(&failed),
        ("answered 500 Internal Server Error", None)
    );

    let busy = send(loopback(), &at("/busy"), &secret).await;
    assert_eq!(retried(&busy).1, Some(Duration::from_secs(7)));

    let moved = send(loopback(), &at("/moved"), &secret).await;
    assert_eq!(moved.status, Some(302));
    assert!(retried(&moved).0.contains("redirects are not followed"));

    let slow = send(loopback(), &at("/slow"), &secret).await;
    assert!(retried(&slow).0.starts_with("timed out"), "{slow:?}");

    let reset = send(
        loopback(),
        &format!("http://{}/hooks", resetting().await),
        &secret,
    )
    .await;
    assert_eq!(reset.status, None);
    assert!(retried(&reset).0.starts_with("failed") || retried(&reset).0.starts_with("could not"));

    let gone = send(loopback(), &at("/gone"), &secret).await;
    assert_eq!((gone.outcome, gone.status), (Outcome::Gone, Some(410)));
}

#[tokio::test]
async fn only_a_bounded_excerpt_of_an_answer_is_kept() {
    let secret = Secret::generate();
    let address = receiver(&secret).await;
    let big = send(loopback(), &format!("http://{address}/big"), &secret).await;
    assert_eq!(big.status, Some(502));
    assert!(big.excerpt.len() <= EXCERPT_BYTES, "{}", big.excerpt.len());
    assert!(big.excerpt.len() >= EXCERPT_BYTES - 1);
    assert!(
        big.excerpt.chars().all(|c| c == 'é'),
        "cut on a character boundary"
    );
}

#[tokio::test]
async fn an_inner_address_is_never_sent_to_without_the_allow_list() {
    let secret = Secret::generate();
    let address = receiver(&secret).await;
    for url in [
        format!("http://{address}/ok"),
        format!("http://localhost:{}/ok", address.port()),
    ] {
        let refused = send(AddressPolicy::default(), &url, &secret).await;
        assert_eq!(refused.status, None, "{url}");
        assert!(retried(&refused).0.contains("loopback"), "{refused:?}");
    }
}
