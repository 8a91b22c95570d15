//! A private `redis-server` on a free port, with an append-only file fsynced on every write,
//! so the test can stop it (SIGKILL) and start it again with its stream intact; and a proxy
//! that makes a Redis slow.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio::task::AbortHandle;

/// A free loopback port, and a fresh directory for a server of `kind` to keep its files in.
fn free_port_and_directory(kind: &str) -> (u16, PathBuf) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let dir = std::env::temp_dir().join(format!(
        "payments-test-{kind}-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).expect("a directory for the server's files");
    (port, dir)
}

pub(crate) struct RedisServer {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
    /// The master's port, for a replica.
    replica_of: Option<u16>,
    /// What the server requires of its clients (`requirepass`), if anything.
    password: Option<String>,
}

impl RedisServer {
    pub(crate) async fn start() -> Self {
        Self::start_with(None, None).await
    }

    /// A server that answers only clients that `AUTH` with `password`.
    pub(crate) async fn start_requiring(password: &str) -> Self {
        Self::start_with(None, Some(password.to_owned())).await
    }

    /// A replica of `master`, started once it has caught up with it (its link is up).
    pub(crate) async fn start_replica_of(master: &RedisServer) -> Self {
        let replica = Self::start_with(Some(master.port), None).await;
        // A full sync on a busy machine (the suite runs tests in parallel) can take a while.
        for _ in 0..600 {
            if replica
                .info_replication()
                .await
                .contains("master_link_status:up")
            {
                return replica;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "the replica on port {} never linked to its master",
            replica.port
        );
    }

    async fn start_with(replica_of: Option<u16>, password: Option<String>) -> Self {
        let (port, dir) = free_port_and_directory("redis");
        let mut server = Self {
            port,
            dir,
            child: None,
            replica_of,
            password,
        };
        server.restart().await;
        server
    }

    pub(crate) fn url(&self) -> String {
        match &self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// Starts the server (again) on the same port and data directory, and waits until it
    /// answers.
    pub(crate) async fn restart(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            // A replica's first sync starts at once, not after the default 5 s wait for others.
            .args(["--repl-diskless-sync-delay", "0"])
            .args(self.replica_of.iter().flat_map(|master| {
                [
                    "--replicaof".to_owned(),
                    "127.0.0.1".to_owned(),
                    master.to_string(),
                ]
            }))
            .args(
                self.password
                    .iter()
                    .flat_map(|password| ["--requirepass", password.as_str()]),
            )
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server must be installed for the Redis tests");
        self.child = Some(child);
        let client = redis::Client::open(self.url()).expect("url");
        for _ in 0..100 {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await
                && redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("redis-server did not start on port {}", self.port);
    }

    /// `INFO replication`, as the server answers it.
    pub(crate) async fn info_replication(&self) -> String {
        let client = redis::Client::open(self.url()).expect("url");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect to redis-server");
        redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut conn)
            .await
            .expect("INFO replication")
    }

    /// Stops (`SIGSTOP`) or resumes (`SIGCONT`) the server: a node that hangs, and comes back.
    pub(crate) fn signal(&self, signal: &str) {
        let pid = self
            .child
            .as_ref()
            .and_then(Child::id)
            .expect("a running redis-server");
        let status = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// Kills the server outright, as a crash or an operator would.
    pub(crate) async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A proxy in front of a Redis that holds every reply back for a while: a Redis that answers,
/// only slowly, as one does under load or across a congested link.
pub(crate) struct SlowRedis {
    port: u16,
    accept: AbortHandle,
}

impl SlowRedis {
    /// Proxies to the Redis at `upstream` (a `redis://host:port` URL), delaying each reply.
    pub(crate) async fn start(upstream: &str, delay: Duration) -> Self {
        let upstream = upstream.trim_start_matches("redis://").to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (mut from_client, mut to_client) = inbound.into_split();
                let (mut from_redis, mut to_redis) = outbound.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut from_client, &mut to_redis).await;
                });
                tokio::spawn(async move {
                    let mut buffer = vec![0; 64 * 1024];
                    while let Ok(n @ 1..) = from_redis.read(&mut buffer).await {
                        tokio::time::sleep(delay).await;
                        if to_client.write_all(&buffer[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        })
        .abort_handle();
        Self { port, accept }
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for SlowRedis {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// A Sentinel watching one master with a quorum of one and short timeouts, so that it promotes
/// the replica about a second after the master dies.
pub(crate) struct Sentinel {
    pub port: u16,
    dir: PathBuf,
    /// What the Sentinel requires of its clients (`requirepass`), if anything.
    password: Option<String>,
    _child: Child,
}

impl Sentinel {
    /// Starts a Sentinel that watches `master` under the name `name`, and waits until it
    /// names it.
    pub(crate) async fn start(name: &str, master: &RedisServer) -> Self {
        Self::start_with(name, master, None).await
    }

    /// A Sentinel that answers only clients that `AUTH` with `password`, and that presents
    /// the master's password (if it has one) to the master.
    pub(crate) async fn start_requiring(name: &str, master: &RedisServer, password: &str) -> Self {
        Self::start_with(name, master, Some(password.to_owned())).await
    }

    async fn start_with(name: &str, master: &RedisServer, password: Option<String>) -> Self {
        let (port, dir) = free_port_and_directory("sentinel");
        let config = dir.join("sentinel.conf");
        let mut lines = format!(
            "port {port}\nbind 127.0.0.1\n\
             sentinel monitor {name} 127.0.0.1 {master} 1\n\
             sentinel down-after-milliseconds {name} 500\n\
             sentinel failover-timeout {name} 2000\n",
            master = master.port
        );
        if let Some(master_password) = &master.password {
            lines.push_str(&format!("sentinel auth-pass {name} {master_password}\n"));
        }
        if let Some(password) = &password {
            lines.push_str(&format!("requirepass {password}\n"));
        }
        std::fs::write(&config, lines).expect("write sentinel.conf");
        let child = Command::new("redis-server")
            .arg(&config)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server --sentinel");
        let sentinel = Self {
            port,
            dir,
            password,
            _child: child,
        };
        sentinel.wait_for_master(name, master.port).await;
        sentinel
    }

    /// Waits until the Sentinel names the Redis on `port` as the master `name`.
    pub(crate) async fn wait_for_master(&self, name: &str, port: u16) {
        let auth = self
            .password
            .as_ref()
            .map(|password| format!(":{password}@"))
            .unwrap_or_default();
        let client =
            redis::Client::open(format!("redis://{auth}127.0.0.1:{}", self.port)).expect("url");
        for _ in 0..600 {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await
                && let Ok(Some((_, named))) = redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(name)
                    .query_async::<Option<(String, u16)>>(&mut conn)
                    .await
                && named == port
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "the Sentinel on {} never named port {port} as {name}",
            self.port
        );
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
