//! [`HttpCardProcessor`]: the [`CardProcessor`] port over HTTP, talking to a `card-sim` server
//! (or anything that speaks the same small protocol).
//!
//! The mapping keeps the port's contract: only a 200 is a charge and only a 402 is a decline.
//! Everything else (a 409 while a call under the key is processing or after it was canceled,
//! a 5xx, a refused connection, a timeout, a body that cannot be read) is
//! [`ProcessorError::Unavailable`], because the caller learns nothing definitive about money
//! from it; only the same idempotency key, which the processor deduplicates, can tell. A charge
//! is returned as the processor reported it (amount, currency, status), never as requested.

use std::time::Duration;

use async_trait::async_trait;
use payments_domain::{
    Amount, CancelOutcome, CardProcessor, Currency, CurrencyError, Money, ProcessorCharge,
    ProcessorChargeRequest, ProcessorChargeStatus, ProcessorError,
};
use reqwest::{StatusCode, Url};
use serde::de::DeserializeOwned;

use crate::wire::{
    CANCELED, CancelView, ChargeBody, ChargeView, ConflictCode, ErrorEnvelope, IDEMPOTENCY_KEY,
};

/// A card processor reached over HTTP.
#[derive(Debug, Clone)]
pub struct HttpCardProcessor {
    http: reqwest::Client,
    charges_url: Url,
    cancel_url: Url,
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
        let join = |path: &str| base.join(path).map_err(|e| invalid(e.to_string()));
        let charges_url = join("v1/charges")?;
        let cancel_url = join("v1/charges/cancel")?;
        let http = reqwest::Client::builder().timeout(timeout).build()?;
        Ok(Self {
            http,
            charges_url,
            cancel_url,
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

    /// The `code` of an error body; `None` if it has none or cannot be read.
    async fn error_code(&self, response: reqwest::Response) -> Option<String> {
        let envelope = self.read::<ErrorEnvelope>(response).await.ok()?;
        envelope.error.code
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
            // As the processor reports it: the caller checks it against the request.
            StatusCode::OK => reported_charge(self.read(response).await?),
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
            // Still processing, or the key was canceled: either way this call charged nothing.
            StatusCode::CONFLICT => Err(conflict(self.error_code(response).await)),
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
            StatusCode::OK => reported_charge(self.read(response).await?).map(Some),
            StatusCode::NOT_FOUND => Ok(None),
            status => Err(unexpected(status)),
        }
    }

    async fn cancel(
        &self,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<ProcessorCharge>, ProcessorError> {
        let response = self
            .http
            .post(self.cancel_url.clone())
            .header(IDEMPOTENCY_KEY, idempotency_key)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        match response.status() {
            StatusCode::OK => match self.read(response).await? {
                CancelView::Charged(charge) => reported_charge(charge).map(CancelOutcome::Exists),
                CancelView::Canceled(view) if view.status == CANCELED => {
                    Ok(CancelOutcome::Canceled)
                }
                CancelView::Canceled(view) => Err(unavailable(format!(
                    "cancel answered 200 with status {:?}",
                    view.status
                ))),
            },
            // Only `processing` is an answer; any other conflict says nothing definitive.
            StatusCode::CONFLICT => match self.error_code(response).await {
                Some(code) if code == ConflictCode::Processing.as_str() => {
                    Ok(CancelOutcome::StillProcessing)
                }
                code => Err(conflict(code)),
            },
            status => Err(unexpected(status)),
        }
    }
}

/// A charge as the processor reported it, with its own amount, currency and status: the
/// caller decides whether it is the charge it asked for. A field this side cannot read is
/// `Unavailable`, never a guess.
fn reported_charge(view: ChargeView) -> Result<ProcessorCharge, ProcessorError> {
    let amount = Amount::new(view.amount).map_err(|e| unavailable(e.to_string()))?;
    let currency: Currency = view
        .currency
        .parse()
        .map_err(|e: CurrencyError| unavailable(e.to_string()))?;
    let status = ProcessorChargeStatus::parse(&view.status).ok_or_else(|| {
        unavailable(format!(
            "charge {} has unknown status {:?}",
            view.id, view.status
        ))
    })?;
    Ok(ProcessorCharge {
        id: view.id,
        money: Money::new(amount, currency),
        status,
    })
}

fn unavailable(reason: String) -> ProcessorError {
    ProcessorError::Unavailable { reason }
}

/// A 409, named by its `code` when the body has one.
fn conflict(code: Option<String>) -> ProcessorError {
    let code = code.unwrap_or_else(|| "without a code".to_owned());
    unavailable(format!("processor answered 409 {code}"))
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
        let cancel_url = HttpCardProcessor::new("http://sim.local/prefix", Duration::from_secs(1))
            .map(|c| c.cancel_url.to_string());
        assert_eq!(
            cancel_url.ok().as_deref(),
            Some("http://sim.local/prefix/v1/charges/cancel")
        );
    }

    fn view(amount: i64, currency: &str, status: &str) -> ChargeView {
        ChargeView {
            id: "ch_1".into(),
            amount,
            currency: currency.into(),
            status: status.into(),
        }
    }

    #[test]
    fn a_charge_is_read_as_reported_and_never_guessed() {
        let pending = reported_charge(view(2000, "EUR", "pending"));
        assert_eq!(
            pending,
            Ok(ProcessorCharge {
                id: "ch_1".into(),
                money: Money::new(
                    Amount::new(2000).unwrap_or_else(|e| panic!("{e}")),
                    Currency::Eur
                ),
                status: ProcessorChargeStatus::Pending,
            })
        );
        for unreadable in [
            view(2000, "EUR", "refunded"),
            view(0, "EUR", "succeeded"),
            view(2000, "XXX", "succeeded"),
        ] {
            let result = reported_charge(unreadable);
            assert!(
                matches!(result, Err(ProcessorError::Unavailable { .. })),
                "{result:?}"
            );
        }
    }

    #[test]
    fn a_base_url_must_be_absolute_http() {
        assert!(charges_url("127.0.0.1:9090").is_err());
        assert!(charges_url("ftp://sim.local").is_err());
        assert!(charges_url("not a url").is_err());
    }
}
