//! `payments`: the payments API from a shell, retrying as a caller should.
//!
//! Prints the answer's JSON on stdout and exits 0, or prints the problem on stderr and exits
//! with a code that says what to do next:
//!
//! | exit | meaning |
//! | ---: | --- |
//! | 0 | the answer is on stdout |
//! | 1 | a final error (the problem JSON is on stderr): retrying changes nothing |
//! | 2 | the command line is wrong (or the API key cannot be read) |
//! | 3 | no final answer before the deadline: run the same command again (with the same `--journal`, or `--key`) to resume it; stderr says until when it is resent as it is |
//! | 4 | the key holds another request (`idempotency_key_reused`): the request was changed under one key |
//! | 5 | the journal cannot be used (another service's or another tenant's entry, a symbolic link, in use), the base URL is wrong (or redirects), or an answer does not answer the request; nothing more is sent |
//! | 6 | the journal holds the operation without an answer and the service no longer holds its key: nothing was sent, and whether it happened must be checked (`GET /charges`, ...) |
//!
//! With `--journal FILE`, a write is recorded in FILE (created 0600, never opened through a
//! symbolic link), with its key, the service's base URL, a hash of the API key and the time,
//! before its first send, and its answer when it comes. The same command with the same journal
//! is the same operation (with `--key`, the key names it within its kind): a run killed in the
//! middle and started again resumes it under the same key, and once it has its answer every
//! later run prints that answer without sending anything. A run with another base URL or API
//! key is refused before anything is sent (exit 5). Once the key may be past the service's
//! retention (`--key-retention-secs`, the service's `idempotency.ttl_secs`), a run asks the
//! service about the key before sending it again, and stops (exit 6) if the key is gone.
//!
//! The API key is read from `PAYMENTS_API_KEY` or from the file `--api-key-file` names; one
//! given as `--api-key` is seen by every user of the machine in the process list, and is
//! warned about.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use payments_client::types::{
    CancelRequest, CaptureRequest, ChargeRequest, KeyOperation, PayoutRequest, RefundRequest,
};
use payments_client::{Answer, Client, Error, FileJournal, Operation, Origin, RetryPolicy};
use serde::Serialize;

use args::{Cli, Command, Write};

// The command line's arguments, beside it in `payments/` (a binary's root file looks for its
// modules in `src/bin/` otherwise, where every file is a binary of its own).
#[path = "payments/args.rs"]
mod args;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let in_argv = matches.value_source("api_key") == Some(ValueSource::CommandLine);
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    let api_key = match (cli.api_key_file.take(), cli.api_key.take()) {
        (Some(path), _) => match read_api_key(&path) {
            Ok(api_key) => api_key,
            Err(reason) => {
                eprintln!("payments: the API key file {}: {reason}", path.display());
                return ExitCode::from(2);
            }
        },
        (None, Some(api_key)) => {
            if in_argv {
                eprintln!(
                    "payments: warning: an API key given as --api-key is seen by every user of \
                     this machine in the process list; set PAYMENTS_API_KEY or use \
                     --api-key-file instead"
                );
            }
            api_key
        }
        // Required, but clap cannot require an option taken on either side of the command.
        (None, None) => {
            eprintln!(
                "payments: no API key: set PAYMENTS_API_KEY, or pass --api-key-file (or --api-key)"
            );
            return ExitCode::from(2);
        }
    };
    let rerun = Rerun::of(&cli.command);
    match run(cli, &api_key).await {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            match error.problem() {
                Some(problem) => eprintln!("{}", pretty(problem)),
                None => eprintln!("payments: {error}"),
            }
            if let Error::OutcomeUnknown {
                key: Some(key),
                resend_before,
                ..
            } = &error
            {
                eprintln!("payments: {}", rerun.hint(key, *resend_before));
            }
            ExitCode::from(match error {
                Error::Problem { .. } => 1,
                Error::OutcomeUnknown { .. } => 3,
                Error::RequestChanged { .. } => 4,
                Error::KeyGone { .. } => 6,
                _ => 5,
            })
        }
    }
}

/// The API key in the file at `path`: its first line, without surrounding blanks.
fn read_api_key(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|error| error.to_string())?;
    let api_key = text.lines().next().unwrap_or_default().trim();
    if api_key.is_empty() {
        return Err("it is empty".to_owned());
    }
    Ok(api_key.to_owned())
}

/// How a write's rerun finds its key: by its journal, by the key given, or not at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rerun {
    Journal,
    Key,
    Neither,
}

impl Rerun {
    fn of(command: &Command) -> Self {
        match command {
            Command::Charge { write, .. }
            | Command::Capture { write, .. }
            | Command::Cancel { write, .. }
            | Command::Refund { write, .. }
            | Command::Payout { write, .. } => match (&write.journal, &write.key) {
                (Some(_), _) => Self::Journal,
                (None, Some(_)) => Self::Key,
                (None, None) => Self::Neither,
            },
            Command::Balance | Command::Key { .. } => Self::Neither,
        }
    }

    /// What to do about a write without a final answer under `key`, which a rerun started
    /// before `before` may resend as it is.
    fn hint(self, key: &str, before: Option<SystemTime>) -> String {
        let ask = format!("ask the service about the key first (payments key {key})");
        match (self, before.map(httpdate::fmt_http_date)) {
            (Self::Journal, Some(before)) => format!(
                "run the same command with the same --journal again to resume it: before {before} \
                 it is resent as it is, and after that the run asks the service about the key first"
            ),
            (Self::Journal, None) => "run the same command with the same --journal again to \
                 resume it: the key may be past the service's retention, so the run asks the \
                 service about the key first"
                .to_owned(),
            (Self::Key, Some(before)) => format!(
                "run the same command (with --key {key}) again before {before} to resume it; \
                 after that, {ask}: a key it no longer holds would make it a second time"
            ),
            (Self::Neither, Some(before)) => {
                format!("to resume it, run the same command with --key {key} before {before}")
            }
            (Self::Key | Self::Neither, None) => format!(
                "the key may be past the service's retention: {ask}, before running the same \
                 command with --key {key}"
            ),
        }
    }
}

async fn run(cli: Cli, api_key: &str) -> Result<String, Error> {
    let policy = RetryPolicy {
        deadline: Duration::from_secs(cli.deadline_secs),
        attempt_timeout: Duration::from_secs(cli.attempt_timeout_secs),
        ..RetryPolicy::default()
    };
    let client = Client::new(&cli.base_url, api_key)?
        .with_policy(policy)
        .with_key_retention(Duration::from_secs(cli.key_retention_secs));
    match cli.command {
        Command::Charge {
            amount,
            currency,
            source,
            description,
            no_capture,
            write,
        } => {
            let request = ChargeRequest {
                amount,
                currency,
                source,
                description,
                // Sent only to hold: a charge captured at once is the request it always was.
                capture: no_capture.then_some(false),
            };
            let (client, operation) =
                write.prepare(client, KeyOperation::Charge, "charge", &request)?;
            let answer = client.create_charge(&request, &operation).await?;
            Ok(report(answer))
        }
        Command::Capture {
            charge,
            amount,
            write,
        } => {
            let request = CaptureRequest {
                amount_to_capture: amount,
            };
            let command = format!("capture {charge}");
            let (client, operation) =
                write.prepare(client, KeyOperation::Capture, &command, &request)?;
            let answer = client.capture_charge(&charge, &request, &operation).await?;
            Ok(report(answer))
        }
        Command::Cancel {
            charge,
            reason,
            write,
        } => {
            let request = CancelRequest {
                cancellation_reason: reason,
            };
            let command = format!("cancel {charge}");
            let (client, operation) =
                write.prepare(client, KeyOperation::Cancel, &command, &request)?;
            let answer = client.cancel_charge(&charge, &request, &operation).await?;
            Ok(report(answer))
        }
        Command::Refund {
            charge,
            amount,
            reason,
            write,
        } => {
            let request = RefundRequest { amount, reason };
            let command = format!("refund {charge}");
            let (client, operation) =
                write.prepare(client, KeyOperation::Refund, &command, &request)?;
            let answer = client.create_refund(&charge, &request, &operation).await?;
            Ok(report(answer))
        }
        Command::Payout {
            amount,
            currency,
            destination,
            description,
            write,
        } => {
            let request = PayoutRequest {
                amount,
                currency,
                destination,
                description,
            };
            let (client, operation) =
                write.prepare(client, KeyOperation::Payout, "payout", &request)?;
            let answer = client.create_payout(&request, &operation).await?;
            Ok(report(answer))
        }
        Command::Balance => Ok(pretty(&client.balance().await?)),
        Command::Key { key, operation } => Ok(pretty(&client.key(&key, operation).await?)),
    }
}

impl Write {
    /// The client and the operation of one write, named in the journal by [`journal_name`].
    fn prepare(
        self,
        client: Client,
        kind: KeyOperation,
        command: &str,
        request: &impl Serialize,
    ) -> Result<(Client, Operation), Error> {
        let policy = RetryPolicy {
            prefer_wait_secs: self.wait_secs,
            ..client.policy()
        };
        let client = client.with_policy(policy);
        let operation = match &self.key {
            Some(key) => Operation::with_key(key),
            None => Operation::new(),
        };
        let Some(path) = self.journal else {
            return Ok((client, operation));
        };
        let journal = FileJournal::open(path)?;
        let name = journal_name(kind, command, self.key.as_deref(), request);
        let client = client.with_journal(Arc::new(journal));
        Ok((client, operation.journaled(name)))
    }
}

/// A write's name in the journal. A given key names the operation within its kind, as the
/// service scopes keys (the same key may name a charge and a refund); without one, the command
/// and its request do, so that the same command with the same journal is the same operation.
fn journal_name(
    kind: KeyOperation,
    command: &str,
    key: Option<&str>,
    request: &impl Serialize,
) -> String {
    match key {
        Some(key) => format!("{} key {key}", kind.as_str()),
        None => format!(
            "{command} {}",
            serde_json::to_string(request).unwrap_or_default()
        ),
    }
}

/// The answer's JSON for stdout; its key and where it came from on stderr, for people.
fn report<T: Serialize>(answer: Answer<T>) -> String {
    let origin = match answer.origin {
        Origin::Executed => "executed",
        Origin::Replayed => "replayed by the service",
        Origin::Journal => "from the journal",
    };
    eprintln!(
        "payments: idempotency key {} ({origin}; replayed until {})",
        answer.key.as_deref().unwrap_or("-"),
        answer
            .key_expires
            .map_or_else(|| "-".to_owned(), httpdate::fmt_http_date),
    );
    pretty(&answer.value)
}

fn pretty(value: &impl Serialize) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charge(amount: i64) -> ChargeRequest {
        ChargeRequest {
            amount,
            currency: "usd".to_owned(),
            source: "tok_visa".to_owned(),
            description: None,
            capture: None,
        }
    }

    #[test]
    fn a_key_names_its_operation_within_its_kind_and_otherwise_the_request_does() {
        let name =
            |kind, command, key, request: &ChargeRequest| journal_name(kind, command, key, request);
        let (one, other) = (charge(100), charge(200));
        let charge_kind = KeyOperation::Charge;
        // Under a key, another request is the same operation: the journal refuses it.
        assert_eq!(
            name(charge_kind, "charge", Some("k"), &one),
            name(charge_kind, "charge", Some("k"), &other)
        );
        // The same key for a refund names another operation, as at the service.
        let refund = journal_name(
            KeyOperation::Refund,
            "refund ch_1",
            Some("k"),
            &RefundRequest::default(),
        );
        assert_ne!(name(charge_kind, "charge", Some("k"), &one), refund);
        // And for a capture and a cancel of the same charge.
        let capture = journal_name(
            KeyOperation::Capture,
            "capture ch_1",
            Some("k"),
            &CaptureRequest::default(),
        );
        let cancel = journal_name(
            KeyOperation::Cancel,
            "cancel ch_1",
            Some("k"),
            &CancelRequest::default(),
        );
        assert_ne!(capture, cancel);
        assert_ne!(name(charge_kind, "charge", Some("k"), &one), capture);
        // Without a key, the command and its request name it.
        assert_eq!(
            name(charge_kind, "charge", None, &one),
            name(charge_kind, "charge", None, &charge(100))
        );
        assert_ne!(
            name(charge_kind, "charge", None, &one),
            name(charge_kind, "charge", None, &other)
        );
    }
}
