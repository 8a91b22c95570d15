//! The `payments-api` binary: everything lives in the library so tests build the same app.
//!
//! `payments-api` serves; `payments-api events tail` follows the event stream.

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => payments_api::run().await,
        ["events", "tail"] => payments_api::tail_events().await,
        _ => {
            eprintln!("usage: payments-api [events tail]");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // One line naming what is wrong; no backtrace for an operator's mistake.
            eprintln!("payments-api: {error}");
            ExitCode::FAILURE
        }
    }
}
