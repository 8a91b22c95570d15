//! What the command line takes: its options, its commands and how each is parsed. A wrong
//! value (an amount that is no integer, a reason or an operation the service does not name)
//! is a usage error, exit 2, before anything is sent.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use payments_client::types::{CancellationReason, KeyOperation, RefundReason};

#[derive(Debug, Parser)]
#[command(
    name = "payments",
    version,
    about = "Charges, holds, refunds and payouts, exactly once."
)]
// Its options are global: taken before or after the command alike.
pub(crate) struct Cli {
    /// The service's address (its value is never printed).
    #[arg(
        long,
        global = true,
        env = "PAYMENTS_BASE_URL",
        hide_env_values = true,
        default_value = "http://127.0.0.1:8080"
    )]
    pub(crate) base_url: String,
    /// The tenant's API key (`sk_...`). Given here, it is seen by every user of the machine
    /// in the process list: prefer PAYMENTS_API_KEY or --api-key-file.
    #[arg(long, global = true, env = "PAYMENTS_API_KEY", hide_env_values = true)]
    pub(crate) api_key: Option<String>,
    /// A file holding the tenant's API key (its first line), used instead of --api-key.
    #[arg(long, global = true, env = "PAYMENTS_API_KEY_FILE")]
    pub(crate) api_key_file: Option<PathBuf>,
    /// How long the service keeps a key after its final answer: its `idempotency.ttl_secs`.
    /// Once a journaled key may be older, the service is asked about it before it is sent
    /// again. Less than the service's only asks sooner; more could resend a forgotten key.
    #[arg(
        long,
        global = true,
        env = "PAYMENTS_KEY_RETENTION_SECS",
        default_value_t = 86_400,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub(crate) key_retention_secs: u64,
    /// How long the whole command may take, every retry included.
    #[arg(long, global = true, default_value_t = 120)]
    pub(crate) deadline_secs: u64,
    /// How long one attempt may take.
    #[arg(long, global = true, default_value_t = 30)]
    pub(crate) attempt_timeout_secs: u64,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Charges a card: POST /charges.
    Charge {
        /// In the currency's minor units (1999 is $19.99).
        #[arg(long)]
        amount: i64,
        #[arg(long)]
        currency: String,
        /// A card token, `tok_...`.
        #[arg(long)]
        source: String,
        #[arg(long)]
        description: Option<String>,
        /// Only authorise the card (`"capture": false`): the charge holds its amount until
        /// `payments capture` takes it or `payments cancel` releases it.
        #[arg(long)]
        no_capture: bool,
        #[command(flatten)]
        write: Write,
    },
    /// Captures a hold, all of it or part: POST /charges/{id}/capture.
    Capture {
        /// The hold's charge id, `ch_...`.
        charge: String,
        /// In minor units, at most the hold's amount; all of it when absent. The rest of the
        /// hold is released.
        #[arg(long)]
        amount: Option<i64>,
        #[command(flatten)]
        write: Write,
    },
    /// Cancels a hold, releasing all of it: POST /charges/{id}/cancel.
    Cancel {
        /// The hold's charge id, `ch_...`.
        charge: String,
        /// duplicate, fraudulent, requested_by_customer or abandoned.
        #[arg(long, value_parser = parse_cancellation_reason)]
        reason: Option<CancellationReason>,
        #[command(flatten)]
        write: Write,
    },
    /// Refunds part or all of a charge: POST /charges/{id}/refunds.
    Refund {
        /// The charge's id, `ch_...`.
        #[arg(long)]
        charge: String,
        /// In minor units; all that remains when absent.
        #[arg(long)]
        amount: Option<i64>,
        /// requested_by_customer, duplicate or fraudulent.
        #[arg(long, value_parser = parse_reason)]
        reason: Option<RefundReason>,
        #[command(flatten)]
        write: Write,
    },
    /// Pays out of the balance: POST /payouts.
    Payout {
        #[arg(long)]
        amount: i64,
        #[arg(long)]
        currency: String,
        /// The bank account, as the processor names it.
        #[arg(long)]
        destination: String,
        #[arg(long)]
        description: Option<String>,
        #[command(flatten)]
        write: Write,
    },
    /// The tenant's balance: GET /balance.
    Balance,
    /// What the service holds under a key: GET /idempotency-keys/{key}.
    Key {
        key: String,
        /// charges.create, charges.capture, charges.cancel, refunds.create or payouts.create.
        #[arg(long, default_value = "charges.create", value_parser = parse_operation)]
        operation: KeyOperation,
    },
}

/// How a write is made exactly once.
#[derive(Debug, Args)]
pub(crate) struct Write {
    /// The Idempotency-Key; a new random one when absent (recorded in the journal, if any).
    #[arg(long)]
    pub(crate) key: Option<String>,
    /// A file that remembers the operation and its key across runs.
    #[arg(long)]
    pub(crate) journal: Option<PathBuf>,
    /// Ask the service to wait up to N seconds (at most 10) for an attempt in flight under
    /// the key, instead of answering 409 at once (`Prefer: wait=N`).
    #[arg(long)]
    pub(crate) wait_secs: Option<u8>,
}

fn parse_reason(value: &str) -> Result<RefundReason, String> {
    serde_json::from_value(serde_json::Value::from(value))
        .map_err(|_| "one of requested_by_customer, duplicate, fraudulent".to_owned())
}

fn parse_cancellation_reason(value: &str) -> Result<CancellationReason, String> {
    serde_json::from_value(serde_json::Value::from(value))
        .map_err(|_| "one of duplicate, fraudulent, requested_by_customer, abandoned".to_owned())
}

fn parse_operation(value: &str) -> Result<KeyOperation, String> {
    serde_json::from_value(serde_json::Value::from(value)).map_err(|_| {
        "one of charges.create, charges.capture, charges.cancel, refunds.create, \
         payouts.create"
            .to_owned()
    })
}
