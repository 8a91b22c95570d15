//! The operator endpoints: only an operator key opens `/ops/`, and an operator key opens
//! nothing else; the exceptions a reconciliation run keeps are listed there, among them a
//! record held by a processor that charged another amount than asked.

use std::path::PathBuf;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::card_sim::CardSim;
use crate::helpers::{ACME, Backend, TestApp, new_key, problem, spawn_app_with, visa};
use crate::reconciliation::reconcile;

/// The demo's public operator key (`sk_test_ops`), beside the demo tenant keys.
const DEMO_OPERATOR: &str = "sk_test_ops";

pub(crate) const OPERATOR: &str = "sk_test_operator_key_of_alice";

/// A configuration file that adds an operator key named `alice`; removed when dropped.
pub(crate) struct OperatorConfig(PathBuf);

impl OperatorConfig {
    pub(crate) fn write() -> Self {
        let hash = hex::encode(Sha256::digest(OPERATOR.as_bytes()));
        let path = std::env::temp_dir().join(format!("payments-ops-{}.toml", uuid::Uuid::new_v4()));
        let toml = format!("[[auth.operator_keys]]\nkey_sha256 = \"{hash}\"\nname = \"alice\"\n");
        std::fs::write(&path, toml).expect("write the operator configuration");
        Self(path)
    }

    pub(crate) fn path(&self) -> &str {
        self.0.to_str().expect("a UTF-8 path")
    }
}

impl Drop for OperatorConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The service with an operator key (and `extra` settings).
pub(crate) async fn with_operator(
    backend: Backend,
    extra: &[(&str, &str)],
) -> (OperatorConfig, TestApp) {
    let config = OperatorConfig::write();
    let mut env = vec![("PAYMENTS_CONFIG", config.path())];
    env.extend_from_slice(extra);
    let app = spawn_app_with(backend, &env).await;
    (config, app)
}

async fn each_kind_of_key_opens_only_its_own_endpoints(backend: Backend) {
    let (_config, app) = with_operator(backend, &[]).await;
    let list = app.get_json(OPERATOR, "/ops/exceptions").await;
    assert_eq!(
        list,
        json!({ "object": "list", "data": [], "has_more": false })
    );

    let (status, body) = problem(app.get(ACME, "/ops/exceptions").await).await;
    assert_eq!((status, body["code"].as_str()), (403, Some("forbidden")));
    let (status, body) = problem(app.get("sk_nobody", "/ops/exceptions").await).await;
    assert_eq!((status, body["code"].as_str()), (401, Some("unauthorized")));

    for path in ["/charges", "/events", "/balance", "/ledger/balances"] {
        let (status, body) = problem(app.get(OPERATOR, path).await).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (403, Some("forbidden")),
            "{path}"
        );
    }
    // Refused before the claim: the key stays free for the tenant.
    let key = new_key();
    let (status, _) = problem(app.post_charge(OPERATOR, &key, &visa(100)).await).await;
    assert_eq!(status, 403);
    app.assert_key_is_free(&key).await;
}

/// `tok_amountMismatch` makes the processor charge one minor unit more than asked: the request
/// answers 503 and its record stays pending, never posted. The day's run finds the charge in
/// the report, settles the record, finds it still does not match, and keeps it as a
/// `processor_mismatch`, which operators see with the record it holds.
async fn a_record_held_by_a_processor_mismatch_is_listed_for_operators(backend: Backend) {
    let card_sim = CardSim::start().await;
    let (_config, app) = with_operator(
        backend,
        &[
            ("PAYMENTS__PROCESSOR__URL", card_sim.url.as_str()),
            ("PAYMENTS__WORKERS__COMPLETER_INTERVAL_MS", "3600000"),
        ],
    )
    .await;
    let key = new_key();
    let body = json!({ "amount": 500, "currency": "usd", "source": "tok_amountMismatch" });
    let (status, _) = problem(app.post_charge(ACME, &key, &body).await).await;
    assert_eq!(status, 503);
    card_sim.unsolicited_charge("made-elsewhere-1", 800).await;
    card_sim.unsolicited_charge("made-elsewhere-2", 900).await;

    let (status, run) = reconcile(&app.database, &card_sim).await;
    assert_eq!(status, 3, "{run}");
    assert_eq!(run["counts"]["processor_mismatch"], 1, "{run}");
    assert_eq!(run["counts"]["processor_only"], 2, "{run}");
    assert_eq!(
        app.footprint().await.charges,
        0,
        "a mismatch is never posted"
    );

    // Pages of one, oldest first, without gaps or repeats.
    let mut seen: Vec<Value> = Vec::new();
    let mut path = "/ops/exceptions?limit=1".to_owned();
    for _ in 0..10 {
        let page = app.get_json(OPERATOR, &path).await;
        let data = page["data"].as_array().expect("data").clone();
        assert!(data.len() <= 1);
        seen.extend(data);
        if page["has_more"] != json!(true) {
            break;
        }
        assert!(seen.len() < 10, "the pages never end: {seen:?}");
        let last = seen.last().expect("a page")["id"]
            .as_str()
            .expect("id")
            .to_owned();
        path = format!("/ops/exceptions?limit=1&starting_after={last}");
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
    let mismatch = seen
        .iter()
        .find(|e| e["kind"] == "processor_mismatch")
        .expect("the mismatch is listed");
    assert_eq!(mismatch["status"], "open");
    assert_eq!(mismatch["tenant"], "acme");
    assert_eq!(mismatch["processor"]["amount"], 501, "the processor's side");
    assert_eq!(mismatch["books"], Value::Null);
    assert_eq!(
        mismatch["record"],
        json!({ "operation": "charges.create", "idempotency_key": key })
    );
    let id = mismatch["id"].as_str().expect("id");
    let mut one = app
        .get_json(OPERATOR, &format!("/ops/exceptions/{id}"))
        .await;
    let mut listed = mismatch.clone();
    for view in [&mut one, &mut listed] {
        view["age_secs"] = Value::Null;
    }
    assert_eq!(one, listed);

    let resolved = app
        .get_json(OPERATOR, "/ops/exceptions?status=resolved")
        .await;
    assert_eq!(resolved["data"], json!([]));
    let (status, body) = problem(app.get(OPERATOR, "/ops/exceptions?status=closed").await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_request"))
    );
    let (status, body) = problem(app.get(OPERATOR, "/ops/exceptions/exc_nope").await).await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));
    let (status, body) = problem(app.get(ACME, &format!("/ops/exceptions/{id}")).await).await;
    assert_eq!((status, body["code"].as_str()), (403, Some("forbidden")));
}

/// The demo's operator key opens `/ops/` beside the demo tenant keys, and not once the
/// tenants' keys are a deployment's own, nor once the deployment names an operator key of its
/// own: the second security review found `sk_test_ops` still reading every tenant's
/// exceptions beside an operator key of one's own.
async fn the_demo_operator_key_serves_only_beside_the_demo_tenant_keys(backend: Backend) {
    let (_config, own_operator) = with_operator(backend, &[]).await;
    let (status, body) = problem(own_operator.get(DEMO_OPERATOR, "/ops/exceptions").await).await;
    assert_eq!((status, body["code"].as_str()), (401, Some("unauthorized")));
    let list = own_operator.get_json(OPERATOR, "/ops/exceptions").await;
    assert_eq!(list["data"], json!([]));
    assert_eq!(
        own_operator.get(ACME, "/charges").await.status().as_u16(),
        200
    );

    let app = spawn_app_with(backend, &[]).await;
    let list = app.get_json(DEMO_OPERATOR, "/ops/exceptions").await;
    assert_eq!(list["data"], json!([]));

    let hash = hex::encode(Sha256::digest(b"sk_live_own_key"));
    let path = std::env::temp_dir().join(format!("payments-own-{}.toml", uuid::Uuid::new_v4()));
    let toml = format!("[[auth.api_keys]]\nkey_sha256 = \"{hash}\"\ntenant = \"acme\"\n");
    std::fs::write(&path, toml).expect("write the configuration");
    let own = spawn_app_with(
        backend,
        &[("PAYMENTS_CONFIG", path.to_str().expect("path"))],
    )
    .await;
    let (status, body) = problem(own.get(DEMO_OPERATOR, "/ops/exceptions").await).await;
    let _ = std::fs::remove_file(&path);
    assert_eq!((status, body["code"].as_str()), (401, Some("unauthorized")));
}

/// `POST /ops/reconciliations` runs a day on the serving instance, against its processor (here
/// the in-process simulator, which only the serving process can read), as the command does.
async fn an_operator_runs_a_day_through_the_api(backend: Backend) {
    let app = spawn_app_with(
        backend,
        &[("PAYMENTS__WORKERS__COMPLETER_INTERVAL_MS", "3600000")],
    )
    .await;
    let charge = app.post_charge(ACME, &new_key(), &visa(400)).await;
    assert_eq!(charge.status().as_u16(), 201);
    let body = json!({ "amount": 500, "currency": "usd", "source": "tok_amountMismatch" });
    let (status, _) = problem(app.post_charge(ACME, &new_key(), &body).await).await;
    assert_eq!(status, 503);

    let today = json!({ "date": chrono::Utc::now().date_naive().to_string() });
    let run = run_day(&app, DEMO_OPERATOR, &today).await;
    assert_eq!(run.status().as_u16(), 200);
    let run: Value = run.json().await.expect("run");
    assert_eq!(
        (
            &run["counts"]["matched"],
            &run["counts"]["processor_mismatch"]
        ),
        (&json!(1), &json!(1)),
        "{run}"
    );
    assert_eq!(
        (&run["exceptions"], &run["exceptions_added"]),
        (&json!(1), &json!(1))
    );
    let again: Value = run_day(&app, DEMO_OPERATOR, &today)
        .await
        .json()
        .await
        .expect("run");
    assert_eq!(again["exceptions_added"], 0, "runs are idempotent by day");
    let listed = app.get_json(DEMO_OPERATOR, "/ops/exceptions").await;
    assert_eq!(listed["data"][0]["kind"], "processor_mismatch");

    for (key, body, want) in [
        (ACME, today.clone(), (403, "forbidden")),
        (
            DEMO_OPERATOR,
            json!({ "date": "2026-13-01" }),
            (400, "invalid_request"),
        ),
        (
            DEMO_OPERATOR,
            json!({ "day": "2026-12-01" }),
            (400, "invalid_request"),
        ),
    ] {
        let (status, problem) = problem(run_day(&app, key, &body).await).await;
        assert_eq!(
            (status, problem["code"].as_str()),
            (want.0, Some(want.1)),
            "{body}"
        );
    }
}

async fn run_day(app: &TestApp, api_key: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(app.url("/ops/reconciliations"))
        .bearer_auth(api_key)
        .json(body)
        .send()
        .await
        .expect("POST /ops/reconciliations")
}

on_every_backend!(
    the_demo_operator_key_serves_only_beside_the_demo_tenant_keys,
    an_operator_runs_a_day_through_the_api,
    each_kind_of_key_opens_only_its_own_endpoints,
    a_record_held_by_a_processor_mismatch_is_listed_for_operators,
);
