//! The `payments-api` binary: everything lives in the library so tests build the same app.

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    match payments_api::run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // One line naming what is wrong; no backtrace for an operator's mistake.
            eprintln!("payments-api: {error}");
            ExitCode::FAILURE
        }
    }
}
