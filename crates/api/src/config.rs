//! Layered configuration: compiled defaults, an optional TOML file, then the environment.
//!
//! Loading and validation are separate steps: [`Settings`] is what the sources say,
//! [`ValidSettings`] is what the service runs with. Every validation error names the key an
//! operator has to change, in one line.

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use chrono::NaiveTime;
use config::{Config, Environment, File, FileFormat};
use payments_domain::TenantId;
use payments_idempotency::engine::CompleterSettings;
use payments_idempotency::{IdempotencyPolicy, PolicyError};
use payments_idempotency_sql::UpkeepSettings;
use payments_redis::CacheSecret;
use payments_storage::{Database, PoolSettings};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::admission::Limits;
use crate::admission::TenantRate;
use crate::auth::{
    ApiKeys, DEMO_KEY_HASHES, DEMO_OPERATOR, DEMO_OPERATOR_KEY_HASH, OperatorName, parse_key_hash,
};
use crate::edge::EdgeLimits;
use crate::workers::WorkerSettings;

const DEFAULTS: &str = include_str!("defaults.toml");

/// The configuration as read from its sources, before validation.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub server: ServerSettings,
    pub database: DatabaseSettings,
    pub idempotency: IdempotencySettings,
    pub processor: ProcessorSettings,
    pub redis: RedisSettings,
    pub workers: WorkersSettings,
    pub auth: AuthSettings,
    pub log: LogSettings,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    pub bind: String,
    /// Where `/metrics` is served, apart from the API; empty serves no metrics.
    pub metrics_bind: String,
    pub body_limit_bytes: usize,
    pub body_timeout_ms: u64,
    pub max_in_flight: usize,
    pub max_in_flight_per_tenant: usize,
    pub header_limit_bytes: usize,
    pub request_timeout_ms: u64,
    pub header_read_timeout_ms: u64,
    pub max_connections: usize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// May hold a password: kept secret so it never prints.
    pub url: SecretString,
    pub max_connections: u32,
    pub acquire_timeout_ms: u64,
    pub statement_timeout_ms: u64,
    /// How long a statement waits for a row another transaction holds (PostgreSQL).
    pub lock_timeout_ms: u64,
    /// How long PostgreSQL lets a session sit inside a transaction without a statement.
    pub idle_in_transaction_timeout_ms: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdempotencySettings {
    pub ttl_secs: u64,
    pub lock_timeout_secs: u64,
    /// The memory for recent answers, in bytes; 0 keeps none.
    pub recent_answers_bytes: usize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessorSettings {
    pub key_window_secs: u64,
    /// How long a charge made with `"capture": false` holds its money before it can no longer
    /// be captured.
    pub authorization_window_secs: u64,
    pub url: String,
    pub timeout_ms: u64,
    pub settle_after_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    pub url: String,
    /// The master's name at the Sentinels; empty for a Redis reached at `url`.
    pub sentinel_master: String,
    /// The Sentinels, `host:port` separated by commas.
    pub sentinels: String,
    /// With Sentinels: the password of the master and its replicas; empty for none.
    pub password: SecretString,
    /// With Sentinels: the Sentinels' own password; empty for none.
    pub sentinel_password: SecretString,
    /// The replay cache's MAC key: never sent to Redis, never printed.
    pub cache_secret: SecretString,
    pub timeout_ms: u64,
    pub stream: String,
    pub key_prefix: String,
    pub stream_timeout_ms: u64,
    pub stream_max_len: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkersSettings {
    pub completer_interval_ms: u64,
    pub completer_concurrency: u32,
    pub completer_batch_size: u32,
    pub relay_interval_ms: u64,
    pub relay_batch_size: u32,
    pub reaper_interval_ms: u64,
    pub reaper_batch_size: u32,
    pub outbox_retention_secs: u64,
    /// `HH:MM` (UTC), `auto` or `off`.
    pub reconcile_at: String,
    pub hold_expiry_interval_ms: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    pub api_keys: Vec<ApiKeySetting>,
    /// Keys for the operator endpoints (`/ops/`); none by default.
    pub operator_keys: Vec<OperatorKeySetting>,
    /// Lets the public demo keys serve on an address other than loopback.
    pub allow_demo_keys: bool,
    /// Each tenant's sustained requests per second on one instance.
    pub rate_limit_per_sec: u32,
    /// How many requests a tenant may send at once above its rate, after a quiet spell.
    pub rate_limit_burst: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeySetting {
    /// The SHA-256 of the key, in hex: the key itself is never configured.
    pub key_sha256: String,
    pub tenant: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorKeySetting {
    /// The SHA-256 of the key, in hex, as for a tenant's key.
    pub key_sha256: String,
    /// Kept with every resolution the operator makes.
    pub name: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    pub format: LogFormat,
    pub filter: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// The validated configuration the service runs with.
#[derive(Debug)]
pub struct ValidSettings {
    pub bind: SocketAddr,
    /// `None` when metrics are not served (an empty `server.metrics_bind`).
    pub metrics_bind: Option<SocketAddr>,
    pub database: Database,
    pub pool: PoolSettings,
    pub policy: IdempotencyPolicy,
    /// The memory for recent answers, in bytes; 0 keeps none.
    pub recent_answers_bytes: usize,
    pub api_keys: ApiKeys,
    pub limits: Limits,
    pub edge: EdgeLimits,
    pub processor_url: Option<String>,
    pub processor_timeout: Duration,
    /// How long the processor remembers its keys; the in-process simulator is given it.
    pub processor_key_window: Duration,
    /// How long a hold may wait for its capture (its `capture_before`, from when it is made).
    pub authorization_window: Duration,
    pub workers: WorkerSettings,
    /// `None` when Redis is disabled (an empty `redis.url`).
    pub redis: Option<ValidRedis>,
    /// The public demo keys that serve on a non-loopback address, as `auth.allow_demo_keys`
    /// permits, named for the warning given on every start.
    pub demo_keys_exposed: Option<&'static str>,
    pub log: LogSettings,
}

/// Redis as the service uses it: its settings and the replay cache's MAC key, which it never
/// runs without.
#[derive(Debug)]
pub struct ValidRedis {
    pub settings: RedisSettings,
    pub cache_secret: CacheSecret,
    pub server: RedisServer,
}

/// Where the Redis is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisServer {
    /// `redis.url`.
    Url(String),
    /// Whichever Redis `redis.sentinels` name as the master `redis.sentinel_master`.
    Sentinel {
        master: String,
        /// Each Sentinel's host and port.
        sentinels: Vec<(String, u16)>,
    },
}

/// Why the service did not start. Each message is one line that names the setting.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("configuration: {0}")]
    Load(String),
    #[error("{key}: {reason}")]
    Invalid { key: &'static str, reason: String },
    #[error("database.url: {0}")]
    Database(String),
    #[error("{key}: cannot listen on {addr}: {reason}")]
    Bind {
        key: &'static str,
        addr: SocketAddr,
        reason: String,
    },
}

/// When the daily reconciliation runs (UTC), if it does: `HH:MM` or `HH:MM:SS`; `off`; or
/// `auto`, which is 01:00 on PostgreSQL and off in the embedded mode, whose in-process
/// simulator forgets everything at every restart.
fn reconcile_at(setting: &str, database: &Database) -> Result<Option<NaiveTime>, StartupError> {
    match setting {
        "off" | "" => Ok(None),
        "auto" => Ok(match database {
            Database::Postgres { .. } => NaiveTime::from_hms_opt(1, 0, 0),
            Database::Sqlite(_) => None,
        }),
        time => NaiveTime::parse_from_str(time, "%H:%M:%S")
            .or_else(|_| NaiveTime::parse_from_str(time, "%H:%M"))
            .map(Some)
            .map_err(|_| StartupError::Invalid {
                key: "workers.reconcile_at",
                reason: format!("must be HH:MM (UTC), auto or off, got {time:?}"),
            }),
    }
}

impl Settings {
    /// Reads defaults, then `PAYMENTS_CONFIG` (a TOML file) if set, then `PAYMENTS__*`
    /// variables, then `DATABASE_URL`.
    pub fn load() -> Result<Self, StartupError> {
        let mut builder = Config::builder().add_source(File::from_str(DEFAULTS, FileFormat::Toml));
        if let Ok(path) = std::env::var("PAYMENTS_CONFIG") {
            if !std::path::Path::new(&path).is_file() {
                return Err(StartupError::Invalid {
                    key: "PAYMENTS_CONFIG",
                    reason: format!("{path:?} is not a readable file"),
                });
            }
            crate::config_file::check(&path)?;
            builder = builder.add_source(File::new(&path, FileFormat::Toml).required(true));
        }
        builder = builder.add_source(
            Environment::with_prefix("PAYMENTS")
                .prefix_separator("__")
                .separator("__"),
        );
        if let Ok(url) = std::env::var("REDIS_URL") {
            builder = builder
                .set_override("redis.url", url)
                .map_err(|e| StartupError::Load(e.to_string()))?;
        }
        if let Ok(url) = std::env::var("DATABASE_URL") {
            builder = builder
                .set_override("database.url", url)
                .map_err(|e| StartupError::Load(e.to_string()))?;
        }
        builder
            .build()
            .and_then(Config::try_deserialize)
            .map_err(crate::config_file::load_error)
    }

    /// Checks every value and builds what the service runs with.
    pub fn validate(self) -> Result<ValidSettings, StartupError> {
        let bind = SocketAddr::from_str(&self.server.bind).map_err(|e| StartupError::Invalid {
            key: "server.bind",
            reason: format!(
                "{:?} is not an address like 127.0.0.1:8080 ({e})",
                self.server.bind
            ),
        })?;
        let metrics_bind = match self.server.metrics_bind.trim() {
            "" => None,
            address => Some(SocketAddr::from_str(address).map_err(|e| StartupError::Invalid {
                key: "server.metrics_bind",
                reason: format!(
                    "{address:?} is not an address like 127.0.0.1:9464, or empty for no metrics ({e})"
                ),
            })?),
        };
        let database = Database::parse(self.database.url.expose_secret()).map_err(|reason| {
            StartupError::Invalid {
                key: "database.url",
                reason,
            }
        })?;
        let counts = [
            (
                "database.max_connections",
                u64::from(self.database.max_connections),
            ),
            (
                "database.statement_timeout_ms",
                self.database.statement_timeout_ms,
            ),
            ("database.lock_timeout_ms", self.database.lock_timeout_ms),
            (
                "database.idle_in_transaction_timeout_ms",
                self.database.idle_in_transaction_timeout_ms,
            ),
            ("server.body_timeout_ms", self.server.body_timeout_ms),
            (
                "server.header_limit_bytes",
                self.server.header_limit_bytes as u64,
            ),
            ("server.request_timeout_ms", self.server.request_timeout_ms),
            (
                "server.header_read_timeout_ms",
                self.server.header_read_timeout_ms,
            ),
            ("server.max_connections", self.server.max_connections as u64),
            ("server.max_in_flight", self.server.max_in_flight as u64),
            (
                "server.max_in_flight_per_tenant",
                self.server.max_in_flight_per_tenant as u64,
            ),
            (
                "server.body_limit_bytes",
                self.server.body_limit_bytes as u64,
            ),
        ];
        if let Some((key, _)) = counts.iter().find(|(_, value)| *value == 0) {
            return Err(invalid(key, "must be at least 1"));
        }
        let tenant_rate = TenantRate::new(self.auth.rate_limit_per_sec, self.auth.rate_limit_burst)
            .map_err(|refused| invalid(refused.key(), "must be at least 1"))?;
        // The outbox relay keeps its transaction open while Redis takes the events (at most
        // redis.stream_timeout_ms); the database must not end it meanwhile.
        if self.database.idle_in_transaction_timeout_ms <= self.redis.stream_timeout_ms {
            return Err(invalid(
                "database.idle_in_transaction_timeout_ms",
                "must be longer than redis.stream_timeout_ms, which the outbox relay may wait \
                 inside a transaction",
            ));
        }
        let policy = IdempotencyPolicy::new(
            Duration::from_secs(self.idempotency.ttl_secs),
            Duration::from_secs(self.idempotency.lock_timeout_secs),
            Duration::from_secs(self.processor.key_window_secs),
        )
        .map_err(policy_refused)?;
        let processor_timeout = Duration::from_millis(self.processor.timeout_ms);
        if processor_timeout.is_zero() || processor_timeout >= policy.lock_timeout {
            return Err(invalid(
                "processor.timeout_ms",
                "must be more than 0 and shorter than idempotency.lock_timeout_secs, so that an \
                 attempt ends before another may take its record over",
            ));
        }
        let settle_after = Duration::from_millis(self.processor.settle_after_ms);
        if settle_after <= processor_timeout {
            return Err(invalid(
                "processor.settle_after_ms",
                "must be longer than processor.timeout_ms, so that a call the processor is still \
                 working on when the service gives up has finished before the completer asks",
            ));
        }
        let authorization_window = Duration::from_secs(self.processor.authorization_window_secs);
        if authorization_window.is_zero() {
            return Err(invalid(
                "processor.authorization_window_secs",
                "must be more than 0: a hold no capture can ever take is a cancel",
            ));
        }
        let processor_url = match self.processor.url.trim() {
            "" => None,
            url if url.starts_with("http://") || url.starts_with("https://") => {
                Some(url.to_owned())
            }
            _ => {
                return Err(invalid(
                    "processor.url",
                    "must be an http:// or https:// URL, or empty",
                ));
            }
        };
        let w = &self.workers;
        if w.completer_interval_ms == 0 || w.reaper_interval_ms == 0 {
            return Err(invalid(
                "workers",
                "completer_interval_ms and reaper_interval_ms must be more than 0",
            ));
        }
        if w.completer_concurrency == 0 {
            return Err(invalid(
                "workers.completer_concurrency",
                "must be at least 1",
            ));
        }
        if w.completer_batch_size == 0 || w.reaper_batch_size == 0 {
            return Err(invalid(
                "workers",
                "completer_batch_size and reaper_batch_size must be more than 0",
            ));
        }
        if w.relay_interval_ms == 0 || w.relay_batch_size == 0 {
            return Err(invalid(
                "workers",
                "relay_interval_ms and relay_batch_size must be more than 0",
            ));
        }
        if w.hold_expiry_interval_ms == 0 {
            return Err(invalid(
                "workers.hold_expiry_interval_ms",
                "must be more than 0",
            ));
        }
        if w.outbox_retention_secs == 0 {
            return Err(invalid(
                "workers.outbox_retention_secs",
                "must be more than 0",
            ));
        }
        let passwords = [
            ("redis.password", &self.redis.password),
            ("redis.sentinel_password", &self.redis.sentinel_password),
        ];
        if self.redis.sentinel_master.trim().is_empty()
            && let Some(&(key, _)) = passwords
                .iter()
                .find(|(_, password)| !password.expose_secret().is_empty())
        {
            return Err(invalid(
                key,
                "goes with redis.sentinel_master; a single Redis takes its password in redis.url",
            ));
        }
        let server = match (self.redis.url.trim(), self.redis.sentinel_master.trim()) {
            ("", "") => None,
            (url, "") if url.starts_with("redis://") || url.starts_with("rediss://") => {
                Some(RedisServer::Url(url.to_owned()))
            }
            (_, "") => {
                return Err(invalid(
                    "redis.url",
                    "must be a redis:// or rediss:// URL, or empty to run without Redis",
                ));
            }
            ("", master) => {
                let sentinels: Option<Vec<(String, u16)>> = self
                    .redis
                    .sentinels
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| {
                        let (host, port) = s.rsplit_once(':')?;
                        Some((host.to_owned(), port.parse().ok()?)).filter(|_| !host.is_empty())
                    })
                    .collect();
                let Some(sentinels) = sentinels.filter(|s| !s.is_empty()) else {
                    return Err(invalid(
                        "redis.sentinels",
                        "must list the Sentinels as host:port, separated by commas, when \
                         redis.sentinel_master is set",
                    ));
                };
                Some(RedisServer::Sentinel {
                    master: master.to_owned(),
                    sentinels,
                })
            }
            (_, _) => {
                return Err(invalid(
                    "redis.sentinel_master",
                    "set either redis.url (one Redis) or redis.sentinel_master with \
                     redis.sentinels (the master the Sentinels name), not both",
                ));
            }
        };
        let redis = match server {
            None => None,
            Some(server) => {
                if self.redis.timeout_ms == 0 {
                    return Err(invalid("redis.timeout_ms", "must be more than 0"));
                }
                if self.redis.stream.trim().is_empty() {
                    return Err(invalid("redis.stream", "must not be empty"));
                }
                if self.redis.stream_timeout_ms == 0 {
                    return Err(invalid("redis.stream_timeout_ms", "must be more than 0"));
                }
                if self.redis.stream_max_len == 0 {
                    return Err(invalid("redis.stream_max_len", "must be more than 0"));
                }
                let secret = self.redis.cache_secret.expose_secret().as_bytes();
                let secret = CacheSecret::new(secret).map_err(|e| StartupError::Invalid {
                    key: "redis.cache_secret",
                    reason: format!(
                        "{e} when Redis is used: the replay cache is authenticated with it \
                         (generate one with: openssl rand -hex 32)"
                    ),
                })?;
                Some(ValidRedis {
                    settings: self.redis.clone(),
                    cache_secret: secret,
                    server,
                })
            }
        };
        let workers = WorkerSettings {
            completer: CompleterSettings {
                interval: Duration::from_millis(w.completer_interval_ms),
                lanes: w.completer_concurrency,
                batch: w.completer_batch_size,
                settle_after,
            },
            upkeep: UpkeepSettings {
                reap_interval: Duration::from_millis(w.reaper_interval_ms),
                reap_batch: i64::from(w.reaper_batch_size),
                ..UpkeepSettings::default()
            },
            relay_interval: Duration::from_millis(w.relay_interval_ms),
            relay_batch: i64::from(w.relay_batch_size),
            outbox_retention: Duration::from_secs(w.outbox_retention_secs),
            reconcile_at: reconcile_at(&w.reconcile_at, &database)?,
            hold_expiry_interval: Duration::from_millis(w.hold_expiry_interval_ms),
        };
        let api_keys = api_keys(&self.auth.api_keys, &self.auth.operator_keys)?;
        let demo_keys = demo_keys(&self.auth);
        let demo_keys_exposed = demo_keys.filter(|_| !bind.ip().is_loopback());
        if let (Some(demo_keys), false) = (demo_keys_exposed, self.auth.allow_demo_keys) {
            return Err(StartupError::Invalid {
                key: "auth.allow_demo_keys",
                reason: format!(
                    "the public demo keys ({demo_keys}) are configured and server.bind {bind} \
                     is not a loopback address: configure your own auth.api_keys, bind to \
                     127.0.0.1, or set auth.allow_demo_keys = true"
                ),
            });
        }
        Ok(ValidSettings {
            bind,
            metrics_bind,
            database,
            pool: PoolSettings {
                max_connections: self.database.max_connections,
                acquire_timeout: Duration::from_millis(self.database.acquire_timeout_ms),
                statement_timeout: Duration::from_millis(self.database.statement_timeout_ms),
                lock_timeout: Duration::from_millis(self.database.lock_timeout_ms),
                idle_in_transaction_timeout: Duration::from_millis(
                    self.database.idle_in_transaction_timeout_ms,
                ),
            },
            policy,
            recent_answers_bytes: self.idempotency.recent_answers_bytes,
            api_keys,
            limits: Limits {
                body_limit_bytes: self.server.body_limit_bytes,
                body_timeout: Duration::from_millis(self.server.body_timeout_ms),
                max_in_flight: self.server.max_in_flight,
                // A share larger than the whole is the whole.
                max_in_flight_per_tenant: self
                    .server
                    .max_in_flight_per_tenant
                    .min(self.server.max_in_flight),
                header_limit_bytes: self.server.header_limit_bytes,
                request_timeout: Duration::from_millis(self.server.request_timeout_ms),
                tenant_rate,
            },
            edge: EdgeLimits {
                header_read_timeout: Duration::from_millis(self.server.header_read_timeout_ms),
                max_connections: self.server.max_connections,
            },
            processor_url,
            processor_timeout,
            processor_key_window: Duration::from_secs(self.processor.key_window_secs),
            authorization_window,
            workers,
            redis,
            demo_keys_exposed,
            log: self.log,
        })
    }
}

/// The public demo keys these settings serve, named for a warning or an error; `None` when
/// there are none.
fn demo_keys(auth: &AuthSettings) -> Option<&'static str> {
    let tenants = auth.api_keys.iter().any(ApiKeySetting::is_demo_key);
    let operator = auth
        .operator_keys
        .iter()
        .any(|entry| parse_key_hash(&entry.key_sha256) == Some(DEMO_OPERATOR_KEY_HASH))
        || serves_demo_operator(tenants, &auth.operator_keys);
    match (tenants, operator) {
        (false, false) => None,
        (true, false) => Some("sk_test_acme, sk_test_globex"),
        (false, true) => {
            Some("the operator key sk_test_ops, which reads and resolves every tenant's exceptions")
        }
        (true, true) => Some(
            "sk_test_acme, sk_test_globex, and the operator key sk_test_ops, which reads and \
             resolves every tenant's exceptions",
        ),
    }
}

/// Whether the demo operator key serves of itself: beside the demo tenant keys, in a
/// configuration that names no operator key of its own. A deployment that configures any key
/// of its own, tenant or operator, never has it.
fn serves_demo_operator(demo_tenants: bool, operators: &[OperatorKeySetting]) -> bool {
    demo_tenants && operators.is_empty()
}

impl ApiKeySetting {
    /// Whether this is one of the demo keys of the compiled defaults, whose plain text is
    /// public.
    fn is_demo_key(&self) -> bool {
        parse_key_hash(&self.key_sha256).is_some_and(|hash| DEMO_KEY_HASHES.contains(&hash))
    }
}

fn api_keys(
    entries: &[ApiKeySetting],
    operators: &[OperatorKeySetting],
) -> Result<ApiKeys, StartupError> {
    if entries.is_empty() {
        return Err(invalid("auth.api_keys", "at least one API key is required"));
    }
    let mut keys = Vec::with_capacity(entries.len());
    for entry in entries {
        let hash = parse_key_hash(&entry.key_sha256).ok_or_else(|| {
            invalid(
                "auth.api_keys",
                "key_sha256 must be the SHA-256 of the key as 64 hex digits",
            )
        })?;
        if entry.tenant.trim().is_empty() {
            return Err(invalid(
                "auth.api_keys",
                "every entry needs a non-empty tenant",
            ));
        }
        if keys.iter().any(|(known, _)| *known == hash) {
            return Err(invalid("auth.api_keys", "the same key is listed twice"));
        }
        keys.push((hash, TenantId::new(entry.tenant.clone())));
    }
    let mut operator_keys = Vec::with_capacity(operators.len());
    for entry in operators {
        let invalid_key = |reason: &str| invalid("auth.operator_keys", reason);
        let hash = parse_key_hash(&entry.key_sha256).ok_or_else(|| {
            invalid_key("key_sha256 must be the SHA-256 of the key as 64 hex digits")
        })?;
        let name = OperatorName::new(&entry.name).ok_or_else(|| {
            invalid_key("every entry needs a name of 1 to 64 letters, digits, _, - or .")
        })?;
        let known = keys.iter().map(|(known, _)| known);
        if known
            .chain(operator_keys.iter().map(|(known, _)| known))
            .any(|known| *known == hash)
        {
            return Err(invalid_key(
                "a key is listed twice, or is also a tenant's key in auth.api_keys",
            ));
        }
        operator_keys.push((hash, name));
    }
    let demo_tenants = keys.iter().any(|(hash, _)| DEMO_KEY_HASHES.contains(hash));
    if serves_demo_operator(demo_tenants, operators) {
        let name = OperatorName::new(DEMO_OPERATOR).ok_or_else(|| {
            invalid(
                "auth.operator_keys",
                "the demo operator's name is not valid",
            )
        })?;
        operator_keys.push((DEMO_OPERATOR_KEY_HASH, name));
    }
    Ok(ApiKeys::new(keys).with_operators(operator_keys))
}

/// The engine's refusal of the idempotency policy, naming this service's settings.
fn policy_refused(refused: PolicyError) -> StartupError {
    match refused {
        PolicyError::ZeroTtl => invalid("idempotency.ttl_secs", "must be at least 1"),
        PolicyError::ZeroLockTimeout => {
            invalid("idempotency.lock_timeout_secs", "must be at least 1")
        }
        PolicyError::TtlNotLongerThanLock {
            ttl_secs,
            lock_secs,
        } => invalid(
            "idempotency.ttl_secs",
            &format!(
                "({ttl_secs}) must be longer than idempotency.lock_timeout_secs ({lock_secs}): a \
                 record must outlive the attempt that holds it"
            ),
        ),
        PolicyError::TtlBeyondEffectKeyWindow {
            ttl_secs,
            window_secs,
        } => invalid(
            "idempotency.ttl_secs",
            &format!(
                "({ttl_secs}) must not exceed processor.key_window_secs ({window_secs}): a retry \
                 after the processor forgot its key could charge twice"
            ),
        ),
    }
}

fn invalid(key: &'static str, reason: &str) -> StartupError {
    StartupError::Invalid {
        key,
        reason: reason.to_owned(),
    }
}
