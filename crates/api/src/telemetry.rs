//! Structured logging with `tracing`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, LogSettings};

/// Where the log lines go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogTo {
    /// The service's own output.
    Stdout,
    /// Apart from a command's output (`reconcile --json` prints JSON on stdout).
    Stderr,
}

/// Installs the global subscriber. `RUST_LOG` wins over `log.filter` when set.
pub(crate) fn init(settings: &LogSettings, to: LogTo) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&settings.filter))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    // try_init: a second initialisation (tests building several apps) is not an error.
    let _ = match (settings.format, to) {
        (LogFormat::Json, LogTo::Stdout) => builder.json().flatten_event(true).try_init(),
        (LogFormat::Json, LogTo::Stderr) => builder
            .json()
            .flatten_event(true)
            .with_writer(std::io::stderr)
            .try_init(),
        (LogFormat::Text, LogTo::Stdout) => builder
            .with_ansi(std::io::stdout().is_terminal())
            .try_init(),
        (LogFormat::Text, LogTo::Stderr) => builder
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .try_init(),
    };
}
