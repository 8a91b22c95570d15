//! [`HttpCardProcessor`]: the [`CardProcessor`] port over HTTP, talking to a `card-sim` server
//! (or anything that speaks the same small protocol).
//!
//! The mapping keeps the port's contract: only a 200 is a charge and only a 402 is a decline.
//! Everything else (a 5xx, a refused connection, a timeout, a body that cannot be read) is
//! [`ProcessorError::Unavailable`], because the caller cannot know whether money moved and must
//! retry with the same idempotency key, which the processor deduplicates.

use std::time::Duration;

use async_trait::async_trait;
use payments_domain::{
    Amount, CardProcessor, Currency, CurrencyError, Money, ProcessorCharge, ProcessorChargeRequest,
    ProcessorError,
};
use reqwest::{StatusCode, Url};
use serde::de::DeserializeOwned;

use crate::wire::{ChargeBody, ChargeView, ErrorEnvelope, IDEMPOTENCY_KEY, SUCCEEDED};

/// A card processor reached over HTTP.
#[derive(Debug, Clone)]
pub struct HttpCardProcessor {
    http: reqwest::Client,
    charges_url: Url,
    timeout: Duration,
}

/// Why an [`HttpCardProcessor`] cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The base URL does not parse, or is not `http`/`https`.
    #[error("processor base URL {url:?} is not an absolute http(s) URL: {reason}")]
    InvalidBaseUrl { url: String, reason: String },
    /// reqwest could not build its client (TLS back-end initialisation).
    #[error("cannot build the HTTP client: {0}")]
    Build(#[from] reqwest::Error),
}

impl HttpCardProcessor {
    /// A client for the processor at `base_url` (such as `http://127.0.0.1:9090`). Every
    /// request, body included, must finish within `timeout` or it is `Unavailable`.
    pub fn new(base_url: &str, timeout: Duration) -> Result<Self, ClientError> {
        let invalid = |reason: String| ClientError::InvalidBaseUrl {
            url: base_url.to_owned(),
            reason,
        };
        let mut base = Url::parse(base_url).map_err(|e| invalid(e.to_string()))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(invalid("the scheme must be http or https".into()));
        }
        // Without a trailing slash, `join` would replace the last path segment of a base such
        // as `http://host/sim` instead of appending to it.
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        let charges_url = base
            .join("v1/charges")
            .map_err(|e| invalid(e.to_string()))?;
        let http = reqwest::Client::builder().timeout(timeout).build()?;
        Ok(Self {
            http,
            charges_url,
            timeout,
        })
    }

    /// A transport failure: the request may or may not have reached the processor.
    fn unreachable(&self, error: &reqwest::Error) -> ProcessorError {
        let reason = if error.is_timeout() {
            // The charge may well exist: only a retry with the same key can tell.
            format!(
                "no answer within {} ms; the outcome is unknown",
                self.timeout.as_millis()
            )
        } else {
            error_chain(error)
        };
        ProcessorError::Unavailable { reason }
    }

    /// Reads a JSON body; failing to (a timeout mid-body, a malformed document) is `Unavailable`.
    async fn read<T: DeserializeOwned>(
        &self,
        response: reqwest::Response,
    ) -> Result<T, ProcessorError> {
        response.json().await.map_err(|e| self.unreachable(&e))
    }
}

#[async_trait]
impl CardProcessor for HttpCardProcessor {
    async fn charge(
        &self,
        request: ProcessorChargeRequest,
    ) -> Result<ProcessorCharge, ProcessorError> {
        let body = ChargeBody {
            amount: request.money.amount.minor_units(),
            currency: request.money.currency.code().to_owned(),
            source: request.source.as_str().to_owned(),
        };
        let response = self
            .http
            .post(self.charges_url.clone())
            .header(IDEMPOTENCY_KEY, &request.idempotency_key)
            .json(&body)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        match response.status() {
            StatusCode::OK => {
                let charge: ChargeView = self.read(response).await?;
                if charge.status != SUCCEEDED {
                    return Err(unavailable(format!(
                        "200 with charge status {:?}",
                        charge.status
                    )));
                }
                Ok(ProcessorCharge {
                    id: charge.id,
                    money: request.money,
                })
            }
            // The status is the decision; the body only explains it, so an unreadable body
            // still makes a decline (retrying would only be declined again).
            StatusCode::PAYMENT_REQUIRED => {
                let detail = self
                    .read::<ErrorEnvelope>(response)
                    .await
                    .ok()
                    .map(|envelope| envelope.error);
                let (decline_code, message) = match detail {
                    Some(detail) => (detail.decline_code, detail.message),
                    None => (None, "The card was declined.".to_owned()),
                };
                Err(ProcessorError::Declined {
                    decline_code: decline_code.unwrap_or_else(|| "unknown".to_owned()),
                    message,
                })
            }
            status => Err(unexpected(status)),
        }
    }

    async fn find_charge(
        &self,
        idempotency_key: &str,
    ) -> Result<Option<ProcessorCharge>, ProcessorError> {
        let mut url = self.charges_url.clone();
        url.query_pairs_mut()
            .append_pair("idempotency_key", idempotency_key);
        let response = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        match response.status() {
            StatusCode::OK => {
                let charge: ChargeView = self.read(response).await?;
                let amount = Amount::new(charge.amount).map_err(|e| unavailable(e.to_string()))?;
                let currency: Currency = charge
                    .currency
                    .parse()
                    .map_err(|e: CurrencyError| unavailable(e.to_string()))?;
                Ok(Some(ProcessorCharge {
                    id: charge.id,
                    money: Money::new(amount, currency),
                }))
            }
            StatusCode::NOT_FOUND => Ok(None),
            status => Err(unexpected(status)),
        }
    }
}

fn unavailable(reason: String) -> ProcessorError {
    ProcessorError::Unavailable { reason }
}

/// Any status but the ones the protocol defines: a 5xx, or a proxy's or a misconfigured
/// server's answer. Nothing can be concluded from it, so it is retryable.
fn unexpected(status: StatusCode) -> ProcessorError {
    unavailable(format!("processor answered {status}"))
}

/// reqwest's `Display` omits the cause ("connection refused"), which is the useful part.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charges_url(base: &str) -> Result<String, ClientError> {
        HttpCardProcessor::new(base, Duration::from_secs(1)).map(|c| c.charges_url.to_string())
    }

    #[test]
    fn the_charges_url_appends_to_the_base_path() {
        assert_eq!(
            charges_url("http://127.0.0.1:9090").ok().as_deref(),
            Some("http://127.0.0.1:9090/v1/charges")
        );
        assert_eq!(
            charges_url("http://sim.local/prefix").ok().as_deref(),
            Some("http://sim.local/prefix/v1/charges")
        );
    }

    #[test]
    fn a_base_url_must_be_absolute_http() {
        assert!(charges_url("127.0.0.1:9090").is_err());
        assert!(charges_url("ftp://sim.local").is_err());
        assert!(charges_url("not a url").is_err());
    }
}
