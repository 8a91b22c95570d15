//! The `card-sim` binary: a simulated card processor over HTTP. Everything but start-up lives
//! in the library (`payments_card_sim::server`), so tests can build the same router.

use std::io::IsTerminal;
use std::process::ExitCode;

use payments_card_sim::server::{self, ServerConfig};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    let config = match ServerConfig::from_process() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("card-sim: {error}");
            return ExitCode::FAILURE;
        }
    };
    // Logs go to stderr: stdout carries only the `listening address=` line.
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match server::run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("card-sim: {error}");
            ExitCode::FAILURE
        }
    }
}
