//! One Redis connection, made on first use, re-made after a failure, and never allowed to
//! hold a request up for longer than its timeout.
//!
//! Redis is an accelerator and a transport here, never the source of truth, so every failure
//! is an ordinary error the caller can ignore: a hung Redis costs at most the timeout, and a
//! dead one costs nothing during the back-off after a failed connect.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, FromRedisValue, Pipeline, RedisConnectionInfo,
    RedisError,
};
use tokio::sync::Mutex;
use tokio::time::Instant;

/// How long a failed connection attempt keeps the link down before the next try.
const BACKOFF: Duration = Duration::from_secs(1);

/// Why a Redis call did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum RedisFailure {
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("redis is down; not retrying until the back-off ends")]
    BackingOff,
    #[error("redis error")]
    Redis(#[from] RedisError),
}

#[derive(Debug)]
struct LinkState {
    connection: Option<MultiplexedConnection>,
    down_until: Option<Instant>,
}

/// The passwords a link through Sentinels presents: the master's (and its replicas'), and the
/// Sentinels' own. `None` for a server that asks for none.
#[derive(Clone, Copy, Default)]
pub struct SentinelPasswords<'a> {
    pub master: Option<&'a str>,
    pub sentinels: Option<&'a str>,
}

impl fmt::Debug for SentinelPasswords<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelPasswords")
            .field("master", &self.master.map(|_| "[redacted]"))
            .field("sentinels", &self.sentinels.map(|_| "[redacted]"))
            .finish()
    }
}

/// Where a link connects: one Redis, or whichever Redis the Sentinels name as the master.
enum Target {
    Direct(redis::Client),
    /// Asked again on every new connection, so that after a failover the link follows the
    /// promoted replica.
    Sentinel(Mutex<SentinelClient>),
}

/// A shared, self-healing Redis connection. Cheap to clone.
#[derive(Clone)]
pub struct RedisLink {
    target: Arc<Target>,
    timeout: Duration,
    state: Arc<Mutex<LinkState>>,
}

impl std::fmt::Debug for RedisLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLink")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisLink {
    /// Parses the URL; connects only when first used.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, RedisError> {
        Ok(Self::to(Target::Direct(redis::Client::open(url)?), timeout))
    }

    /// A link to the master the Sentinels at `sentinels` (host and port each) name for
    /// `master`, asked again whenever the link reconnects: after a failover, the first call
    /// that finds the old master gone (or demoted: `READONLY`) drops the connection, and the
    /// next connects to the promoted replica. Connects only when first used.
    pub fn through_sentinels(
        sentinels: &[(String, u16)],
        master: &str,
        passwords: SentinelPasswords<'_>,
        timeout: Duration,
    ) -> Result<Self, RedisError> {
        let authenticated = |password: Option<&str>| RedisConnectionInfo {
            password: password.map(str::to_owned),
            ..RedisConnectionInfo::default()
        };
        let sentinels: Vec<ConnectionInfo> = sentinels
            .iter()
            .map(|(host, port)| ConnectionInfo {
                addr: ConnectionAddr::Tcp(host.clone(), *port),
                redis: authenticated(passwords.sentinels),
            })
            .collect();
        let nodes = SentinelNodeConnectionInfo {
            tls_mode: None,
            redis_connection_info: Some(authenticated(passwords.master)),
        };
        let client = SentinelClient::build(
            sentinels,
            master.to_owned(),
            Some(nodes),
            SentinelServerType::Master,
        )?;
        Ok(Self::to(Target::Sentinel(Mutex::new(client)), timeout))
    }

    fn to(target: Target, timeout: Duration) -> Self {
        Self {
            target: Arc::new(target),
            timeout,
            state: Arc::new(Mutex::new(LinkState {
                connection: None,
                down_until: None,
            })),
        }
    }

    /// The longest any call on this link may take.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs one command.
    pub async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, RedisFailure> {
        let mut connection = self.connection().await?;
        let result = tokio::time::timeout(self.timeout, cmd.query_async(&mut connection)).await;
        self.settle(result).await
    }

    /// Runs a pipeline (one round trip for many commands).
    pub async fn query_pipeline<T: FromRedisValue>(
        &self,
        pipe: &Pipeline,
    ) -> Result<T, RedisFailure> {
        let mut connection = self.connection().await?;
        let result = tokio::time::timeout(self.timeout, pipe.query_async(&mut connection)).await;
        self.settle(result).await
    }

    /// A clone of the live connection, connecting first if there is none.
    async fn connection(&self) -> Result<MultiplexedConnection, RedisFailure> {
        let mut state = self.state.lock().await;
        if let Some(connection) = &state.connection {
            return Ok(connection.clone());
        }
        if state.down_until.is_some_and(|until| Instant::now() < until) {
            return Err(RedisFailure::BackingOff);
        }
        let connecting = async {
            match self.target.as_ref() {
                Target::Direct(client) => client.get_multiplexed_async_connection().await,
                Target::Sentinel(sentinels) => {
                    let master = sentinels.lock().await.async_get_client().await?;
                    master.get_multiplexed_async_connection().await
                }
            }
        };
        match tokio::time::timeout(self.timeout, connecting).await {
            Ok(Ok(connection)) => {
                state.down_until = None;
                state.connection = Some(connection.clone());
                Ok(connection)
            }
            Ok(Err(error)) => {
                state.down_until = Some(Instant::now() + BACKOFF);
                Err(error.into())
            }
            Err(_) => {
                state.down_until = Some(Instant::now() + BACKOFF);
                Err(RedisFailure::Timeout(self.timeout))
            }
        }
    }

    /// Drops the connection after a timeout or a broken connection, so the next call
    /// reconnects instead of queueing behind a dead socket.
    async fn settle<T>(
        &self,
        result: Result<Result<T, RedisError>, tokio::time::error::Elapsed>,
    ) -> Result<T, RedisFailure> {
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => {
                // A master demoted to a replica answers writes with READONLY: reconnecting asks
                // the Sentinels for the new one.
                if error.is_io_error()
                    || error.is_connection_dropped()
                    || error.is_connection_refusal()
                    || error.kind() == ErrorKind::ReadOnly
                {
                    self.state.lock().await.connection = None;
                }
                Err(error.into())
            }
            Err(_) => {
                self.state.lock().await.connection = None;
                Err(RedisFailure::Timeout(self.timeout))
            }
        }
    }
}
