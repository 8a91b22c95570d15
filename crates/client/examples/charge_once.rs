//! A charge made exactly once by a caller that may crash: the README's "Calling it correctly"
//! in full. Run it twice against a service (`cargo run -p payments-api` in another terminal):
//! the second run prints the same charge, from its journal.
//!
//!   cargo run -p payments-client --example charge_once

use std::sync::Arc;

use payments_client::types::ChargeRequest;
use payments_client::{Client, FileJournal, Operation};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::new("http://127.0.0.1:8080", "sk_test_acme")?
        .with_journal(Arc::new(FileJournal::open("charges.journal")?));
    let request = ChargeRequest {
        amount: 1999,
        currency: "usd".into(),
        source: "tok_visa".into(),
        description: None,
        capture: None, // Some(false) holds: then client.capture_charge or client.cancel_charge
    };
    // Named after the caller's own order: a restart that names it again resumes it.
    let operation = Operation::new().journaled("order-1001");
    let answer = client.create_charge(&request, &operation).await?;
    println!(
        "{} ({:?}, {} attempt(s))",
        answer.value.id, answer.origin, answer.attempts
    );
    Ok(())
}
