//! The guard on every connection a webhook makes: the [`AddressPolicy`] applied to what a
//! tenant's URL names at the moment the service connects, not only when the endpoint was
//! registered. A name that resolved to a public address then may resolve to loopback now.
//!
//! Two checks, because an HTTP client resolves only names: [`before_send`] checks a URL whose
//! host is an address (and that plain `http` goes only where the allow-list says), and
//! [`GuardedResolver`], the only resolver of the webhook client, refuses a name if any address
//! it resolves to is forbidden, so the connection is never opened. The client follows no
//! redirect and uses no proxy: a `3xx` is an answer, never a second destination.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use payments_domain::{AddressPolicy, AddressRefusal, EndpointUrl, Host};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Resolves names as the system does, then refuses the name if the policy forbids any of its
/// addresses.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    policy: Arc<AddressPolicy>,
}

impl GuardedResolver {
    pub fn new(policy: Arc<AddressPolicy>) -> Self {
        Self { policy }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = Arc::clone(&self.policy);
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addresses = resolve(&host).await?;
            for address in &addresses {
                policy.check_address(&host, *address)?;
            }
            if addresses.is_empty() {
                return Err(AddressRefusal::Unresolved(host).into());
            }
            let sockets: Addrs = Box::new(
                addresses
                    .into_iter()
                    .map(|address| SocketAddr::new(address, 0)),
            );
            Ok(sockets)
        })
    }
}

/// Every address `host` resolves to now.
pub async fn resolve(host: &str) -> std::io::Result<Vec<IpAddr>> {
    let found = tokio::net::lookup_host((host, 0)).await?;
    let mut addresses: Vec<IpAddr> = found.map(|socket| socket.ip()).collect();
    addresses.sort_unstable();
    addresses.dedup();
    Ok(addresses)
}

/// Why a URL may not be sent to now.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error(transparent)]
    Refused(#[from] AddressRefusal),
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        source: std::io::Error,
    },
}

/// Checks `url` against `policy` on the addresses its host has now: what registration runs, and
/// what each delivery runs before it sends.
pub async fn before_send(policy: &AddressPolicy, url: &EndpointUrl) -> Result<(), GuardError> {
    let addresses = match url.host() {
        Host::Address(address) => vec![address],
        Host::Name(name) => resolve(name).await.map_err(|source| GuardError::Resolve {
            host: name.to_owned(),
            source,
        })?,
    };
    Ok(policy.check(url, &addresses)?)
}

/// The HTTP client of webhooks: the guarded resolver, no redirects, no proxy, and `timeout` for
/// each attempt.
pub fn client(policy: Arc<AddressPolicy>, timeout: Duration) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .dns_resolver(Arc::new(GuardedResolver::new(policy)))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(timeout)
        .connect_timeout(timeout)
        .build()
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A listener on loopback that answers every request `204`; its port.
    async fn receiver() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("bind: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("address: {e}"))
            .port();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut request = [0_u8; 4096];
                let _ = stream.read(&mut request).await;
                let _ = stream
                    .write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")
                    .await;
            }
        });
        port
    }

    fn loopback_allowed() -> Arc<AddressPolicy> {
        let nets =
            ["127.0.0.0/8", "::1/128"].map(|net| net.parse().unwrap_or_else(|e| panic!("{e}")));
        Arc::new(AddressPolicy::allowing(nets.to_vec()))
    }

    fn url(text: &str) -> EndpointUrl {
        EndpointUrl::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn chain(error: &dyn std::error::Error) -> String {
        let mut text = error.to_string();
        let mut source = error.source();
        while let Some(inner) = source {
            text.push_str(": ");
            text.push_str(&inner.to_string());
            source = inner.source();
        }
        text
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_loopback_is_never_connected_to() {
        let port = receiver().await;
        let endpoint = format!("http://localhost:{port}/hooks");
        let guarded = client(Arc::new(AddressPolicy::default()), Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("{e}"));
        let refused = guarded.post(&endpoint).send().await;
        let error = refused
            .err()
            .unwrap_or_else(|| panic!("{endpoint} was reached"));
        assert!(
            chain(&error).contains("a loopback address"),
            "{}",
            chain(&error)
        );

        let allowed =
            client(loopback_allowed(), Duration::from_secs(5)).unwrap_or_else(|e| panic!("{e}"));
        let answer = allowed.post(&endpoint).send().await;
        assert_eq!(answer.map(|a| a.status().as_u16()).ok(), Some(204));
    }

    #[tokio::test]
    async fn a_url_naming_an_inner_address_is_refused_before_sending() {
        let policy = AddressPolicy::default();
        for text in [
            "http://127.0.0.1:9/hooks",
            "https://[::1]/hooks",
            "https://169.254.169.254/latest/meta-data/",
            "https://[::ffff:10.0.0.1]/",
            "https://localhost/hooks",
        ] {
            let refused = before_send(&policy, &url(text)).await;
            assert!(
                matches!(
                    refused,
                    Err(GuardError::Refused(AddressRefusal::Forbidden { .. }))
                ),
                "{text}: {refused:?}"
            );
        }
        let plain = before_send(&loopback_allowed(), &url("http://127.0.0.1:9/hooks")).await;
        assert!(plain.is_ok(), "{plain:?}");
        let public = before_send(&policy, &url("http://93.184.216.34/hooks")).await;
        assert!(
            matches!(public, Err(GuardError::Refused(AddressRefusal::NotHttps))),
            "{public:?}"
        );
    }
}
