//! One in-flight limit for the whole instance, and a share of it per tenant.

use std::time::Duration;

use futures::future::join_all;
use reqwest::Response;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{address_of, code_of, header, header_of, read_answer, status_of};
use crate::helpers::{
    ACME, Backend, Footprint, GLOBEX, TestApp, metrics_text, new_key, problem, spawn_app_with,
    visa, wait_for_in_flight,
};

/// `POST /charges` requests as acme whose bodies stall after their first byte (of 60): each
/// holds whatever in-flight slot it was given until the body timeout. The write halves keep
/// the requests open (dropping one ends its body); each answer, when it comes, is sent on the
/// channel with the request's index.
struct Stalled {
    _writers: Vec<OwnedWriteHalf>,
    answers: mpsc::UnboundedReceiver<(usize, String)>,
}

async fn stall_charges(app: &TestApp, n: usize) -> Stalled {
    let (sender, answers) = mpsc::unbounded_channel();
    let mut writers = Vec::new();
    for i in 0..n {
        let stream = TcpStream::connect(address_of(app)).await.expect("connect");
        let (mut reader, mut writer) = stream.into_split();
        let head = format!(
            "POST /charges HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {ACME}\r\n\
             Idempotency-Key: {}\r\nContent-Type: application/json\r\nContent-Length: 60\r\n\r\n{{",
            new_key()
        );
        writer.write_all(head.as_bytes()).await.expect("write");
        let sender = sender.clone();
        tokio::spawn(async move {
            let answer = read_answer(&mut reader).await;
            let _ = sender.send((i, answer));
        });
        writers.push(writer);
    }
    Stalled {
        _writers: writers,
        answers,
    }
}

impl Stalled {
    /// The answers that arrive until `n` have or the deadline passes.
    async fn answers_until(&mut self, n: usize, deadline: Instant) -> Vec<(usize, String)> {
        let mut answers = Vec::new();
        while answers.len() < n {
            match tokio::time::timeout_at(deadline, self.answers.recv()).await {
                Ok(Some(answer)) => answers.push(answer),
                Ok(None) | Err(_) => break,
            }
        }
        answers
    }

    /// Asserts none of the stalled requests still waiting has been answered: they held their
    /// slots all along.
    fn assert_still_waiting(&mut self) {
        let early = self.answers.try_recv();
        assert!(
            matches!(early, Err(mpsc::error::TryRecvError::Empty)),
            "a stalled request was answered before the assertions were done: {early:?}"
        );
    }
}

/// Asserts a problem answer with `Retry-After: 1`.
async fn assert_shed(response: Response, status: u16, code: &str) {
    assert_eq!(header(&response, "retry-after").as_deref(), Some("1"));
    let (answered, body) = problem(response).await;
    assert_eq!((answered, body["code"].as_str()), (status, Some(code)));
}

/// One tenant's clients that send their bodies slowly (or an attacker with one tenant's key)
/// would otherwise hold every in-flight slot of the instance, and every other tenant would get
/// 503. Each tenant gets a share: of acme's eight stalled requests, four hold acme's share and
/// four are turned away at once with 429 `tenant_in_flight_limit`; acme's next charge is 429
/// too, while globex's charge goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_stalled_bodies_take_only_its_share_of_the_in_flight_limit() {
    let app = spawn_app_with(
        Backend::Postgres,
        &[
            ("PAYMENTS__SERVER__MAX_IN_FLIGHT", "8"),
            ("PAYMENTS__SERVER__MAX_IN_FLIGHT_PER_TENANT", "4"),
            ("PAYMENTS__SERVER__BODY_TIMEOUT_MS", "20000"),
        ],
    )
    .await;
    let mut stalled = stall_charges(&app, 8).await;
    let turned_away = stalled
        .answers_until(4, Instant::now() + Duration::from_secs(15))
        .await;
    assert_eq!(
        turned_away.len(),
        4,
        "four beyond acme's share: {turned_away:?}"
    );
    for (i, answer) in &turned_away {
        assert_eq!(
            (status_of(answer), code_of(answer).as_deref()),
            (Some(429), Some("tenant_in_flight_limit")),
            "stalled request {i}: {answer}"
        );
        assert_eq!(header_of(answer, "retry-after").as_deref(), Some("1"));
    }

    let extra = app.post_charge(ACME, &new_key(), &visa(100)).await;
    assert_shed(extra, 429, "tenant_in_flight_limit").await;
    let other_tenant = app.post_charge(GLOBEX, &new_key(), &visa(100)).await;
    assert_eq!(
        other_tenant.status().as_u16(),
        201,
        "globex is not starved by acme"
    );
    stalled.assert_still_waiting();
    assert_eq!(
        app.footprint().await,
        Footprint::charged(1),
        "only globex's charge"
    );
}

/// The starvation the share prevents, at the default limits (512 slots, 128 per tenant):
/// while acme has 700 `tok_slow` charges sent at once, globex's 20 ordinary charges all answer
/// 201. Acme's charges beyond its share are turned away with 429 `tenant_in_flight_limit`
/// (never 503), and each that was admitted is one charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_one_tenant_has_700_slow_charges_in_flight_another_tenants_charges_answer_201() {
    let app = spawn_app_with(Backend::Postgres, &[]).await;
    let slow = json!({ "amount": 100, "currency": "usd", "source": "tok_slow" });
    let ordinary = visa(100);
    let acme_keys: Vec<String> = (0..700).map(|_| new_key()).collect();
    let globex_keys: Vec<String> = (0..20).map(|_| new_key()).collect();
    let acme = async {
        let sent = acme_keys
            .iter()
            .map(|key| app.post_charge(ACME, key, &slow));
        let answers = join_all(sent).await.into_iter().map(|response| async move {
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.expect("a JSON body"))
        });
        join_all(answers).await
    };
    let globex = async {
        wait_for_in_flight_at_least(&app, 128).await;
        join_all(
            globex_keys
                .iter()
                .map(|key| app.post_charge(GLOBEX, key, &ordinary)),
        )
        .await
    };
    let (acme, globex) = tokio::join!(acme, globex);
    let statuses: Vec<u16> = globex.iter().map(|r| r.status().as_u16()).collect();
    assert_eq!(statuses, vec![201; 20], "globex is not starved by acme");

    let charged = acme.iter().filter(|(status, _)| *status == 201).count();
    let turned_away = acme
        .iter()
        .filter(|(status, body)| {
            *status == 429 && body["code"].as_str() == Some("tenant_in_flight_limit")
        })
        .count();
    assert_eq!(charged + turned_away, 700, "acme: only 201 or 429");
    assert!(charged >= 128, "acme's share was charged: {charged}");
    let charges = i64::try_from(charged + 20).expect("a count");
    assert_eq!(app.footprint().await, Footprint::charged(charges));
}

/// The in-flight limit is one for the whole instance, not one per route: requests stalled on
/// `POST /charges` leave no room for a `GET /charges`, which is shed with 503 `overloaded`
/// and `Retry-After` (so memory and connections stay bounded whatever the mix of routes). Once
/// the stalled requests end, the slots are free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_flight_limit_is_one_for_the_whole_service() {
    let app = spawn_app_with(
        Backend::Postgres,
        &[
            ("PAYMENTS__SERVER__MAX_IN_FLIGHT", "4"),
            ("PAYMENTS__SERVER__MAX_IN_FLIGHT_PER_TENANT", "4"),
            ("PAYMENTS__SERVER__BODY_TIMEOUT_MS", "20000"),
        ],
    )
    .await;
    let mut stalled = stall_charges(&app, 4).await;
    wait_for_in_flight(&app, 4).await;

    let shed = app.get(GLOBEX, "/charges").await;
    assert_shed(shed, 503, "overloaded").await;
    stalled.assert_still_waiting();

    // Ending the stalled requests frees their slots.
    drop(stalled);
    wait_for_in_flight(&app, 0).await;
    let status = app.get(GLOBEX, "/charges").await.status().as_u16();
    assert_eq!(
        status, 200,
        "the slots are free once the stalled requests end"
    );
}

/// Waits until the service reports at least `n` requests holding in-flight slots.
async fn wait_for_in_flight_at_least(app: &TestApp, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = metrics_text(&app.metrics_url).await;
        let in_flight = metrics
            .lines()
            .find_map(|line| line.strip_prefix("http_requests_in_flight "))
            .and_then(|value| value.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        if in_flight >= n as f64 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the service never held {n} requests in flight ({in_flight})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
