//! Where a webhook may be sent. A tenant names its endpoint's URL, so the URL is untrusted: what
//! the service sends there must never reach the service's own network (loopback, private,
//! link-local, a cloud's metadata address), whatever the name resolves to, now or later.
//!
//! [`EndpointUrl`] is a URL fit to be an endpoint at all; [`AddressPolicy`] says which addresses
//! may be connected to and whether plain `http` may be used. Both are checked when an endpoint
//! is registered and again every time the service connects, on the addresses the name resolves
//! to then: a name that pointed elsewhere at registration and at loopback now is refused then.
//! An operator's allow-list (the demo and the tests name loopback) lifts both rules for the
//! networks it names, and only for those.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use url::Url;

/// The longest endpoint URL, in bytes.
pub const MAX_URL_LEN: usize = 2048;

/// A URL that can be an endpoint: `http` or `https`, with a host, without credentials or a
/// fragment, at most [`MAX_URL_LEN`] bytes. Whether it may be reached is [`AddressPolicy`]'s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointUrl(Url);

/// Why a URL cannot be an endpoint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("url must be an absolute http or https URL")]
    NotAUrl,
    #[error("url must be at most {MAX_URL_LEN} bytes")]
    TooLong,
    #[error("url must use https or http")]
    Scheme,
    #[error("url must name a host")]
    NoHost,
    #[error("url must not carry a user name or password")]
    Credentials,
    #[error("url must not carry a fragment")]
    Fragment,
}

impl EndpointUrl {
    pub fn parse(text: &str) -> Result<Self, UrlError> {
        if text.len() > MAX_URL_LEN {
            return Err(UrlError::TooLong);
        }
        let url = Url::parse(text).map_err(|_| UrlError::NotAUrl)?;
        if !matches!(url.scheme(), "https" | "http") {
            return Err(UrlError::Scheme);
        }
        if url.host().is_none() {
            return Err(UrlError::NoHost);
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(UrlError::Credentials);
        }
        if url.fragment().is_some() {
            return Err(UrlError::Fragment);
        }
        Ok(Self(url))
    }

    pub fn as_url(&self) -> &Url {
        &self.0
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// The host as the URL names it: a name to resolve, or an address.
    pub fn host(&self) -> Host<'_> {
        match self.0.host() {
            Some(url::Host::Ipv4(address)) => Host::Address(IpAddr::V4(address)),
            Some(url::Host::Ipv6(address)) => Host::Address(IpAddr::V6(address)),
            Some(url::Host::Domain(name)) => Host::Name(name),
            // `parse` refused a URL without a host.
            None => Host::Name(""),
        }
    }

    fn is_https(&self) -> bool {
        self.0.scheme() == "https"
    }
}

/// What an endpoint URL names to connect to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host<'a> {
    Name(&'a str),
    Address(IpAddr),
}

/// What kind of address may never be reached, unless allow-listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forbidden {
    Loopback,
    Private,
    LinkLocal,
    /// A cloud's instance metadata service.
    Metadata,
    /// Unspecified, multicast, broadcast, documentation, benchmarking or otherwise reserved:
    /// nothing a merchant's endpoint is on.
    Reserved,
}

impl Forbidden {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Loopback => "loopback",
            Self::Private => "private",
            Self::LinkLocal => "link-local",
            Self::Metadata => "metadata",
            Self::Reserved => "reserved",
        }
    }

    /// What kind of forbidden address `address` is; `None` for a public one.
    pub fn of(address: IpAddr) -> Option<Self> {
        match address {
            IpAddr::V4(v4) => Self::of_v4(v4),
            IpAddr::V6(v6) => Self::of_v6(v6),
        }
    }

    fn of_v4(address: Ipv4Addr) -> Option<Self> {
        const METADATA: [Ipv4Addr; 2] = [
            // AWS, GCP, Azure, DigitalOcean, OpenStack...
            Ipv4Addr::new(169, 254, 169, 254),
            // Alibaba Cloud.
            Ipv4Addr::new(100, 100, 100, 200),
        ];
        let [a, b, c, _] = address.octets();
        if METADATA.contains(&address) {
            Some(Self::Metadata)
        } else if address.is_loopback() {
            Some(Self::Loopback)
        } else if address.is_link_local() {
            Some(Self::LinkLocal)
        } else if address.is_private() || (a == 100 && (64..128).contains(&b)) {
            // RFC 1918, and the carrier-grade NAT's shared space (RFC 6598).
            Some(Self::Private)
        } else if a == 0
            || address.is_multicast()
            || address.is_broadcast()
            || address.is_documentation()
            || a >= 240
            || (a == 192 && b == 0 && c == 0)
            || (a == 198 && (18..20).contains(&b))
        {
            Some(Self::Reserved)
        } else {
            None
        }
    }

    fn of_v6(address: Ipv6Addr) -> Option<Self> {
        // An IPv4 address in IPv6 clothes (mapped, or the old compatible form) is that address.
        if let Some(v4) = address.to_ipv4_mapped() {
            return Self::of_v4(v4);
        }
        let segments = address.segments();
        if address == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
            // AWS's metadata service over IPv6.
            Some(Self::Metadata)
        } else if address.is_loopback() {
            Some(Self::Loopback)
        } else if segments[0] & 0xffc0 == 0xfe80 {
            Some(Self::LinkLocal)
        } else if segments[0] & 0xfe00 == 0xfc00 {
            // Unique local addresses: IPv6's private networks.
            Some(Self::Private)
        } else if address.is_unspecified()
            || address.is_multicast()
            || segments[0] == 0
            // NAT64 (64:ff9b::/96) reaches any IPv4 address, private ones among them.
            || (segments[0] == 0x64 && segments[1] == 0xff9b)
            || (segments[0] == 0x2001 && segments[1] == 0xdb8)
            || (segments[0] == 0x100 && segments[1..4] == [0, 0, 0])
        {
            Some(Self::Reserved)
        } else {
            None
        }
    }
}

/// Why an endpoint, or one connection to it, is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressRefusal {
    #[error("{host} resolves to {address}, a {} address, which webhooks never reach", .kind.as_str())]
    Forbidden {
        host: String,
        address: IpAddr,
        kind: Forbidden,
    },
    #[error("url must use https")]
    NotHttps,
    #[error("{0} resolves to no address")]
    Unresolved(String),
}

/// Which addresses webhooks may reach: every public address, and the networks an operator
/// allow-lists (`webhooks.allowed_networks`), where plain `http` is allowed too.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    allowed: Vec<IpNet>,
}

impl AddressPolicy {
    /// The policy with `allowed` networks beside the public ones.
    pub fn allowing(allowed: Vec<IpNet>) -> Self {
        Self { allowed }
    }

    fn allows(&self, address: IpAddr) -> bool {
        self.allowed.iter().any(|net| net.contains(&address))
    }

    /// Checks every address `url`'s host resolves to (all of them: a name may answer with any
    /// one of them next time): each must be public or allow-listed, and the URL `https` unless
    /// all of them are allow-listed.
    pub fn check(&self, url: &EndpointUrl, addresses: &[IpAddr]) -> Result<(), AddressRefusal> {
        let host = url.as_url().host_str().unwrap_or_default();
        if addresses.is_empty() {
            return Err(AddressRefusal::Unresolved(host.to_owned()));
        }
        for &address in addresses {
            self.check_address(host, address)?;
        }
        if !url.is_https() && !addresses.iter().all(|&address| self.allows(address)) {
            return Err(AddressRefusal::NotHttps);
        }
        Ok(())
    }

    /// Checks one address `host` resolved to.
    pub fn check_address(&self, host: &str, address: IpAddr) -> Result<(), AddressRefusal> {
        match Forbidden::of(address) {
            Some(kind) if !self.allows(address) => Err(AddressRefusal::Forbidden {
                host: host.to_owned(),
                address,
                kind,
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> EndpointUrl {
        EndpointUrl::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn an_endpoint_url_is_http_or_https_with_a_host_and_nothing_secret() {
        assert_eq!(
            url("https://shop.example/hooks?x=1").as_str(),
            "https://shop.example/hooks?x=1"
        );
        let long = format!("https://shop.example/{}", "a".repeat(MAX_URL_LEN));
        let refused = [
            ("shop.example/hooks", UrlError::NotAUrl),
            ("ftp://shop.example/", UrlError::Scheme),
            ("file:///etc/passwd", UrlError::Scheme),
            ("https://user:pw@shop.example/", UrlError::Credentials),
            ("https://shop.example/#top", UrlError::Fragment),
            (long.as_str(), UrlError::TooLong),
        ];
        for (text, error) in refused {
            assert_eq!(EndpointUrl::parse(text), Err(error), "{text}");
        }
    }

    #[test]
    fn every_kind_of_inner_address_is_forbidden_and_public_ones_are_not() {
        use Forbidden::*;
        let cases = [
            ("127.0.0.1", Some(Loopback)),
            ("127.5.6.7", Some(Loopback)),
            ("::1", Some(Loopback)),
            ("::ffff:127.0.0.1", Some(Loopback)),
            ("10.1.2.3", Some(Private)),
            ("172.16.0.1", Some(Private)),
            ("192.168.1.1", Some(Private)),
            ("100.64.0.1", Some(Private)),
            ("fd12:3456::1", Some(Private)),
            ("169.254.1.1", Some(LinkLocal)),
            ("fe80::1", Some(LinkLocal)),
            ("169.254.169.254", Some(Metadata)),
            ("::ffff:169.254.169.254", Some(Metadata)),
            ("100.100.100.200", Some(Metadata)),
            ("fd00:ec2::254", Some(Metadata)),
            ("0.0.0.0", Some(Reserved)),
            ("::", Some(Reserved)),
            ("224.0.0.1", Some(Reserved)),
            ("255.255.255.255", Some(Reserved)),
            ("192.0.2.1", Some(Reserved)),
            ("198.18.0.1", Some(Reserved)),
            ("64:ff9b::a00:1", Some(Reserved)),
            ("ff02::1", Some(Reserved)),
            ("93.184.216.34", None),
            ("8.8.8.8", None),
            ("100.128.0.1", None),
            ("2606:4700::1111", None),
        ];
        for (address, kind) in cases {
            assert_eq!(Forbidden::of(ip(address)), kind, "{address}");
        }
    }

    #[test]
    fn a_policy_refuses_any_inner_address_a_name_resolves_to() {
        let policy = AddressPolicy::default();
        let endpoint = url("https://shop.example/hooks");
        assert_eq!(policy.check(&endpoint, &[ip("93.184.216.34")]), Ok(()));
        assert_eq!(
            policy.check(&endpoint, &[ip("93.184.216.34"), ip("10.0.0.5")]),
            Err(AddressRefusal::Forbidden {
                host: "shop.example".into(),
                address: ip("10.0.0.5"),
                kind: Forbidden::Private,
            })
        );
        assert_eq!(
            policy.check(&endpoint, &[]),
            Err(AddressRefusal::Unresolved("shop.example".into()))
        );
        assert_eq!(
            policy.check(&url("http://shop.example/"), &[ip("93.184.216.34")]),
            Err(AddressRefusal::NotHttps)
        );
    }

    #[test]
    fn an_allow_list_lifts_both_rules_for_its_networks_only() {
        let loopback = ["127.0.0.0/8", "::1/128"]
            .map(|net| net.parse().unwrap_or_else(|e| panic!("{net}: {e}")));
        let policy = AddressPolicy::allowing(loopback.to_vec());
        let local = url("http://localhost:9000/hooks");
        assert_eq!(policy.check(&local, &[ip("127.0.0.1"), ip("::1")]), Ok(()));
        assert!(matches!(
            policy.check(&local, &[ip("127.0.0.1"), ip("169.254.169.254")]),
            Err(AddressRefusal::Forbidden {
                kind: Forbidden::Metadata,
                ..
            })
        ));
        assert_eq!(
            policy.check(&local, &[ip("127.0.0.1"), ip("93.184.216.34")]),
            Err(AddressRefusal::NotHttps),
            "http only where every address is allow-listed"
        );
    }
}
