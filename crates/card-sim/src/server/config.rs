//! Where the `card-sim` binary listens, how slow it is and how long it remembers keys, from
//! flags and the environment.

use std::net::SocketAddr;
use std::time::Duration;

use crate::InMemoryCardProcessor;

/// The listen address when neither `--bind` nor `CARD_SIM_BIND` is given.
pub const DEFAULT_BIND: &str = "127.0.0.1:9090";

/// The command line, for error messages.
pub const USAGE: &str = "usage: card-sim [--bind <ip:port>]  \
    (env: CARD_SIM_BIND, CARD_SIM_LATENCY_MS, CARD_SIM_KEY_WINDOW_SECS, RUST_LOG)";

/// The validated settings of the `card-sim` server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerConfig {
    /// The address to listen on; port 0 picks a free port (the chosen one is printed).
    pub bind: SocketAddr,
    /// How long every new call (a charge, a refund, a capture, ...) processes before its
    /// outcome exists, whether or not the client waits: a client that gives up early sees a
    /// timeout, and what it made appears later, as with a real processor.
    pub latency: Duration,
    /// How long a key is remembered, with what was made under it, once it settled or was
    /// canceled (`CARD_SIM_KEY_WINDOW_SECS`, by default
    /// [`InMemoryCardProcessor::DEFAULT_KEY_WINDOW`], the service's own default).
    pub key_window: Duration,
}

/// Why the command line or the environment is not a valid [`ServerConfig`]. Each message names
/// the flag or variable at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// An argument other than `--bind`.
    #[error("unknown argument {0:?}; {USAGE}")]
    UnknownArgument(String),
    /// `--bind` as the last argument.
    #[error("{0} needs a value; {USAGE}")]
    MissingValue(&'static str),
    /// `--bind` or `CARD_SIM_BIND` is not an `ip:port` (host names are not resolved).
    #[error("{key} must be an ip:port address such as 127.0.0.1:9090, got {value:?}")]
    InvalidBind { key: &'static str, value: String },
    /// `CARD_SIM_LATENCY_MS` is not a non-negative integer.
    #[error("CARD_SIM_LATENCY_MS must be a whole number of milliseconds, got {0:?}")]
    InvalidLatency(String),
    /// `CARD_SIM_KEY_WINDOW_SECS` is not a positive integer: a window of 0 would forget every
    /// key as soon as it settled, and a retry could charge twice.
    #[error("CARD_SIM_KEY_WINDOW_SECS must be a whole number of seconds, at least 1, got {0:?}")]
    InvalidKeyWindow(String),
}

impl ServerConfig {
    /// Reads the process's arguments and environment.
    pub fn from_process() -> Result<Self, ConfigError> {
        Self::parse(std::env::args().skip(1), |key| std::env::var(key).ok())
    }

    /// `--bind` wins over `CARD_SIM_BIND`, which wins over [`DEFAULT_BIND`]. The environment is
    /// passed in so tests need not mutate the process's own.
    pub fn parse(
        args: impl IntoIterator<Item = String>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut flag_bind = None;
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "--bind" {
                flag_bind = Some(args.next().ok_or(ConfigError::MissingValue("--bind"))?);
            } else if let Some(value) = arg.strip_prefix("--bind=") {
                flag_bind = Some(value.to_owned());
            } else {
                return Err(ConfigError::UnknownArgument(arg));
            }
        }

        let (key, value) = match (flag_bind, env("CARD_SIM_BIND")) {
            (Some(value), _) => ("--bind", value),
            (None, Some(value)) => ("CARD_SIM_BIND", value),
            (None, None) => ("default", DEFAULT_BIND.to_owned()),
        };
        let bind = value
            .parse()
            .map_err(|_| ConfigError::InvalidBind { key, value })?;

        let latency = match env("CARD_SIM_LATENCY_MS") {
            None => Duration::ZERO,
            Some(ms) => ms
                .trim()
                .parse()
                .map(Duration::from_millis)
                .map_err(|_| ConfigError::InvalidLatency(ms))?,
        };
        let key_window = match env("CARD_SIM_KEY_WINDOW_SECS") {
            None => InMemoryCardProcessor::DEFAULT_KEY_WINDOW,
            Some(secs) => match secs.trim().parse() {
                Ok(secs) if secs > 0 => Duration::from_secs(secs),
                _ => return Err(ConfigError::InvalidKeyWindow(secs)),
            },
        };
        Ok(Self {
            bind,
            latency,
            key_window,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str], env: &[(&str, &str)]) -> Result<ServerConfig, ConfigError> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        ServerConfig::parse(args.iter().map(|a| (*a).to_owned()), |key| {
            env.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
        })
    }

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn defaults_to_port_9090_without_latency() {
        let config = parse(&[], &[]);
        assert_eq!(
            config,
            Ok(ServerConfig {
                bind: addr(DEFAULT_BIND),
                latency: Duration::ZERO,
                key_window: Duration::from_secs(604_800),
            })
        );
    }

    #[test]
    fn the_key_window_comes_from_the_environment_in_seconds() {
        let config = parse(&[], &[("CARD_SIM_KEY_WINDOW_SECS", "86400")]);
        assert_eq!(
            config.map(|c| c.key_window),
            Ok(Duration::from_secs(86_400))
        );
    }

    #[test]
    fn the_flag_wins_over_the_environment() {
        let env = [("CARD_SIM_BIND", "127.0.0.1:7000")];
        let flag = parse(&["--bind", "127.0.0.1:0"], &env).map(|c| c.bind);
        let joined = parse(&["--bind=127.0.0.1:1"], &env).map(|c| c.bind);
        let from_env = parse(&[], &env).map(|c| c.bind);
        assert_eq!(flag, Ok(addr("127.0.0.1:0")));
        assert_eq!(joined, Ok(addr("127.0.0.1:1")));
        assert_eq!(from_env, Ok(addr("127.0.0.1:7000")));
    }

    #[test]
    fn latency_comes_from_the_environment_in_milliseconds() {
        let config = parse(&[], &[("CARD_SIM_LATENCY_MS", "1500")]);
        assert_eq!(config.map(|c| c.latency), Ok(Duration::from_millis(1500)));
    }

    #[test]
    fn bad_input_names_the_flag_or_variable() {
        assert_eq!(
            parse(&["--bind"], &[]),
            Err(ConfigError::MissingValue("--bind"))
        );
        assert_eq!(
            parse(&["--port", "1"], &[]),
            Err(ConfigError::UnknownArgument("--port".into()))
        );
        assert_eq!(
            parse(&[], &[("CARD_SIM_BIND", "localhost")]),
            Err(ConfigError::InvalidBind {
                key: "CARD_SIM_BIND",
                value: "localhost".into()
            })
        );
        assert_eq!(
            parse(&[], &[("CARD_SIM_LATENCY_MS", "-5")]),
            Err(ConfigError::InvalidLatency("-5".into()))
        );
        for window in ["0", "a week", "-1", "1.5"] {
            assert_eq!(
                parse(&[], &[("CARD_SIM_KEY_WINDOW_SECS", window)]),
                Err(ConfigError::InvalidKeyWindow(window.into()))
            );
        }
    }
}
