//! The sending half of webhooks, apart from any store or web framework: the signature a delivery
//! carries ([`Secret`], [`signature_header`]) and the guard on every connection to a tenant's
//! URL ([`guard`]), which keeps what the service sends out of its own network. Where a URL may
//! point is `payments_domain`'s [`AddressPolicy`](payments_domain::AddressPolicy); this crate
//! applies it to the addresses a name has when the service connects.

pub mod guard;
mod signature;

pub use signature::{Secret, SecretError, signature_header};
