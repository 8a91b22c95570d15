//! A TCP relay between the service and PostgreSQL that a test controls: it can cut every
//! connection (a node that died), and freeze them (a node that stopped answering: a stopped
//! process or a paused machine, whose kernel still holds the connections open).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, watch};
use tokio::task::AbortHandle;

pub(crate) struct Relay {
    port: u16,
    open: Arc<AtomicBool>,
    frozen: watch::Sender<bool>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl Relay {
    /// A relay in front of the server of `database_url` (`postgres://user@host:port/db`), and
    /// the URL that reaches the same database through it.
    pub(crate) async fn in_front_of(database_url: &str) -> (Self, String) {
        let (user_host, path) = database_url
            .trim_start_matches("postgres://")
            .split_once('/')
            .expect("a postgres:// URL with a database");
        let (user, upstream) = user_host.split_once('@').expect("user@host");
        let relay = Self::start(upstream.to_owned()).await;
        let via = format!("postgres://{user}@127.0.0.1:{}/{path}", relay.port);
        (relay, via)
    }

    async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let port = listener.local_addr().expect("relay address").port();
        let open = Arc::new(AtomicBool::new(true));
        let (frozen, thawed) = watch::channel(false);
        let connections: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accept = tokio::spawn({
            let (open, connections) = (open.clone(), connections.clone());
            async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    if !open.load(Ordering::SeqCst) {
                        continue; // dropped: the connection is refused while cut
                    }
                    let (upstream, thawed) = (upstream.clone(), thawed.clone());
                    let task = tokio::spawn(async move {
                        let Ok(outbound) = TcpStream::connect(upstream).await else {
                            return;
                        };
                        let (from_client, to_client) = inbound.into_split();
                        let (from_server, to_server) = outbound.into_split();
                        tokio::join!(
                            pump(from_client, to_server, thawed.clone()),
                            pump(from_server, to_client, thawed),
                        );
                    });
                    connections.lock().await.push(task.abort_handle());
                }
            }
        })
        .abort_handle();
        Self {
            port,
            open,
            frozen,
            connections,
            accept,
        }
    }

    /// Severs every connection and refuses new ones; what a frozen relay held is dropped.
    pub(crate) async fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        for connection in self.connections.lock().await.drain(..) {
            connection.abort();
        }
    }

    /// Accepts connections again, and lets bytes through.
    pub(crate) fn restore(&self) {
        self.frozen.send_replace(false);
        self.open.store(true, Ordering::SeqCst);
    }

    /// Holds every byte in both directions, on the connections open and on new ones, which
    /// are still accepted: nothing is refused and nothing is answered.
    pub(crate) fn freeze(&self) {
        self.frozen.send_replace(true);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies `from` to `to`, holding what it read while the relay is frozen.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut frozen: watch::Receiver<bool>) {
    let mut buffer = vec![0; 16 * 1024];
    while let Ok(read @ 1..) = from.read(&mut buffer).await {
        if frozen.wait_for(|frozen| !frozen).await.is_err()
            || to.write_all(&buffer[..read]).await.is_err()
        {
            return;
        }
    }
    let _ = to.shutdown().await;
}
