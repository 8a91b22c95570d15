//! Reading charges and the ledger back, always within the caller's tenant.

use serde_json::{Value, json};

use crate::helpers::{ACME, Backend, GLOBEX, new_key, problem, spawn_app, visa};

async fn a_charge_reads_back_exactly_as_it_was_created(backend: Backend) {
    let app = spawn_app(backend).await;
    let created: Value = app
        .post_charge(ACME, &new_key(), &visa(321))
        .await
        .json()
        .await
        .expect("charge");
    let id = created["id"].as_str().unwrap_or_default();

    let fetched = app.get(ACME, &format!("/charges/{id}")).await;
    assert_eq!(fetched.status().as_u16(), 200);
    assert_eq!(fetched.json::<Value>().await.expect("charge"), created);
}

async fn another_tenants_charge_is_not_found_and_never_listed(backend: Backend) {
    let app = spawn_app(backend).await;
    let created: Value = app
        .post_charge(ACME, &new_key(), &visa(321))
        .await
        .json()
        .await
        .expect("charge");
    let id = created["id"].as_str().unwrap_or_default();

    let (status, body) = problem(app.get(GLOBEX, &format!("/charges/{id}")).await).await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));
    let list: Value = app
        .get(GLOBEX, "/charges")
        .await
        .json()
        .await
        .expect("list");
    assert_eq!(list["data"], json!([]));
    let balances: Value = app
        .get(GLOBEX, "/ledger/balances")
        .await
        .json()
        .await
        .expect("balances");
    assert_eq!(balances["balances"], json!([]));
}

async fn a_malformed_charge_id_is_not_found(backend: Backend) {
    let app = spawn_app(backend).await;
    for id in [
        "nope",
        "ch_",
        "ch_not-a-uuid",
        "py_00000000-0000-0000-0000-000000000000",
        "%FF",
    ] {
        let (status, body) = problem(app.get(ACME, &format!("/charges/{id}")).await).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (404, Some("not_found")),
            "{id}"
        );
    }
}

async fn charges_are_listed_newest_first_in_pages(backend: Backend) {
    let app = spawn_app(backend).await;
    let mut ids = Vec::new();
    for amount in 1..=5 {
        let charge: Value = app
            .post_charge(ACME, &new_key(), &visa(amount))
            .await
            .json()
            .await
            .expect("charge");
        ids.push(charge["id"].as_str().unwrap_or_default().to_owned());
    }
    ids.reverse();

    let first: Value = app
        .get(ACME, "/charges?limit=2")
        .await
        .json()
        .await
        .expect("page 1");
    assert_eq!(first["object"], "list");
    assert_eq!(first["has_more"], true);
    let page_ids = |page: &Value| -> Vec<String> {
        page["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["id"].as_str().map(str::to_owned))
            .collect()
    };
    assert_eq!(page_ids(&first), ids[0..2]);

    let second: Value = app
        .get(ACME, &format!("/charges?limit=2&starting_after={}", ids[1]))
        .await
        .json()
        .await
        .expect("page 2");
    assert_eq!(page_ids(&second), ids[2..4]);
    let last: Value = app
        .get(ACME, &format!("/charges?limit=2&starting_after={}", ids[3]))
        .await
        .json()
        .await
        .expect("page 3");
    assert_eq!(page_ids(&last), ids[4..5]);
    assert_eq!(last["has_more"], false);

    let all: Value = app
        .get(ACME, "/charges")
        .await
        .json()
        .await
        .expect("default page");
    assert_eq!(page_ids(&all), ids);
}

async fn list_parameters_out_of_range_are_400(backend: Backend) {
    let app = spawn_app(backend).await;
    for query in [
        "limit=0",
        "limit=101",
        "limit=ten",
        "starting_after=ch_00000000-0000-0000-0000-000000000000",
        "colour=blue",
    ] {
        let (status, body) = problem(app.get(ACME, &format!("/charges?{query}")).await).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (400, Some("invalid_request")),
            "{query}"
        );
    }
    let ok: Value = app
        .get(ACME, "/charges?limit=100")
        .await
        .json()
        .await
        .expect("limit 100");
    assert_eq!(ok["has_more"], false);
}

async fn the_ledger_balances_per_currency_and_per_transaction(backend: Backend) {
    let app = spawn_app(backend).await;
    for (amount, currency) in [(1000, "usd"), (250, "usd"), (5000, "jpy"), (99, "eur")] {
        let body = json!({ "amount": amount, "currency": currency, "source": "tok_visa" });
        assert_eq!(
            app.post_charge(ACME, &new_key(), &body)
                .await
                .status()
                .as_u16(),
            201
        );
    }

    let balances: Value = app
        .get(ACME, "/ledger/balances")
        .await
        .json()
        .await
        .expect("balances");
    let balance = |account: &str, currency: &str| {
        balances["balances"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|b| b["account"] == account && b["currency"] == currency)
            .and_then(|b| b["balance"].as_i64())
    };
    assert_eq!(balance("processor_receivable", "USD"), Some(1250));
    assert_eq!(balance("customer_payments", "USD"), Some(-1250));
    assert_eq!(balance("processor_receivable", "JPY"), Some(5000));
    assert_eq!(balance("customer_payments", "EUR"), Some(-99));

    // Read the table itself: no transaction and no currency may be out of balance.
    let unbalanced: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT transaction_id, currency FROM ledger_entries
                               GROUP BY transaction_id, currency HAVING sum(amount) <> 0) t",
    )
    .fetch_one(app.db())
    .await
    .expect("query");
    assert_eq!(unbalanced, 0);
    let per_currency: Vec<(String, i64)> = sqlx::query_as(
        "SELECT currency, CAST(sum(amount) AS BIGINT) FROM ledger_entries
         GROUP BY currency ORDER BY currency",
    )
    .fetch_all(app.db())
    .await
    .expect("query");
    assert_eq!(
        per_currency,
        vec![("EUR".into(), 0), ("JPY".into(), 0), ("USD".into(), 0)]
    );
}

async fn the_database_refuses_an_unbalanced_ledger_transaction(backend: Backend) {
    let app = spawn_app(backend).await;
    let charge: Value = app
        .post_charge(ACME, &new_key(), &visa(100))
        .await
        .json()
        .await
        .expect("charge");
    let charge_id = charge["id"]
        .as_str()
        .and_then(|id| id.strip_prefix("ch_"))
        .unwrap_or_default();
    // Replace the charge's posting with one that is off by one: 100 debited, 99 credited.
    let db = &app.database;
    let tx_id = uuid::Uuid::new_v4().to_string();
    let transaction = format!(
        "INSERT INTO ledger_transactions (id, tenant_id, charge_id, created_at)
         VALUES ({}, 'acme', {}, {})",
        db.uuid_param("$1"),
        db.uuid_param("$2"),
        db.now()
    );
    let entries = format!(
        "INSERT INTO ledger_entries (transaction_id, line, tenant_id, account, currency, amount)
         VALUES ({id}, 1, 'acme', 'processor_receivable', 'USD', 100),
                ({id}, 2, 'acme', 'customer_payments', 'USD', -99)",
        id = db.uuid_param("$1")
    );
    // PostgreSQL checks the balance at commit (a deferred constraint trigger) and wants the
    // transaction row first; SQLite checks it when the transaction row seals its entries.
    let statements: Vec<(&str, Vec<&str>)> = match backend {
        Backend::Postgres => vec![
            (&transaction, vec![&tx_id, charge_id]),
            (&entries, vec![&tx_id]),
        ],
        Backend::Sqlite => vec![
            (&entries, vec![&tx_id]),
            (&transaction, vec![&tx_id, charge_id]),
        ],
    };
    let mut tx = app.db().begin().await.expect("begin");
    for clear in [
        "DELETE FROM ledger_entries",
        "DELETE FROM ledger_transactions",
    ] {
        sqlx::query(clear).execute(&mut *tx).await.expect("clear");
    }
    let mut refused = None;
    for (sql, params) in statements {
        let mut query = sqlx::query(sql);
        for param in params {
            query = query.bind(param);
        }
        if let Err(error) = query.execute(&mut *tx).await {
            refused = Some(error);
            break;
        }
    }
    let error = match refused {
        Some(error) => error,
        None => tx
            .commit()
            .await
            .expect_err("an unbalanced transaction cannot commit"),
    };
    let refused_by = error.as_database_error().map(|e| {
        e.constraint()
            .map_or_else(|| e.message().to_owned(), str::to_owned)
    });
    assert_eq!(refused_by.as_deref(), Some("ledger_entries_balanced"));
}

async fn health_and_readiness_answer(backend: Backend) {
    let app = spawn_app(backend).await;
    let live = app
        .client
        .get(app.url("/healthz"))
        .send()
        .await
        .expect("healthz");
    assert_eq!(live.status().as_u16(), 200);
    assert!(
        live.headers().get("x-request-id").is_some(),
        "every response carries a request id"
    );
    let ready = app
        .client
        .get(app.url("/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(
        ready.json::<Value>().await.expect("json"),
        json!({ "status": "ready", "durability": "local" })
    );
}

/// `GET /openapi.yaml` serves the contract this build answers by: the repository's
/// `openapi.yaml`, byte for byte, to a caller without a key.
async fn the_service_serves_its_contract(backend: Backend) {
    let app = spawn_app(backend).await;
    let response = app
        .client
        .get(app.url("/openapi.yaml"))
        .send()
        .await
        .expect("openapi.yaml");
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.headers()["content-type"], "application/yaml");
    let contract = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../openapi.yaml"))
        .expect("the repository's openapi.yaml");
    assert_eq!(response.bytes().await.expect("body").as_ref(), contract);
}

/// A problem's `type` is where its code is documented: the service answers it with what the
/// code means and what a caller does with it; an unknown code is a 404 problem.
async fn every_problem_links_to_the_documentation_of_its_code(backend: Backend) {
    let app = spawn_app(backend).await;
    let key = new_key();
    assert_eq!(app.post_charge(ACME, &key, &visa(100)).await.status(), 201);
    let (status, body) = problem(app.post_charge(ACME, &key, &visa(101)).await).await;
    assert_eq!(status, 422);
    assert_eq!(body["type"], "/problems/idempotency_key_reused");
    assert_eq!(body["title"], "Unprocessable Content");

    let documentation = app
        .client
        .get(app.url("/problems/idempotency_key_reused"))
        .send()
        .await
        .expect("documentation");
    assert_eq!(documentation.status().as_u16(), 200);
    assert_eq!(
        documentation.headers()["content-type"],
        "text/markdown; charset=utf-8"
    );
    let text = documentation.text().await.expect("text");
    assert!(text.contains("Status 422: "), "{text}");

    let unknown = app
        .client
        .get(app.url("/problems/no_such_code"))
        .send()
        .await
        .expect("unknown code");
    let (status, body) = problem(unknown).await;
    assert_eq!((status, body["code"].as_str()), (404, Some("not_found")));
}

on_every_backend!(
    a_charge_reads_back_exactly_as_it_was_created,
    another_tenants_charge_is_not_found_and_never_listed,
    a_malformed_charge_id_is_not_found,
    charges_are_listed_newest_first_in_pages,
    list_parameters_out_of_range_are_400,
    the_ledger_balances_per_currency_and_per_transaction,
    the_database_refuses_an_unbalanced_ledger_transaction,
    health_and_readiness_answer,
    the_service_serves_its_contract,
    every_problem_links_to_the_documentation_of_its_code,
);
