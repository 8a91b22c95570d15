//! [`HttpCardProcessor`]: the [`CardProcessor`](payments_domain::CardProcessor) and
//! [`PayoutProcessor`](payments_domain::PayoutProcessor) ports over HTTP, talking to a
//! `card-sim` server (or anything that speaks the same small protocol).
//!
//! The mapping keeps the ports' contract (the `ports` module), for charges (and
//! authorisations), refunds, captures, voids and payouts alike: only a 200 is what was made and
//! only a 402 is a decline. Everything else (a 409 while a call under the key
//! is processing or after it was canceled, a 5xx, a refused connection, a timeout, a body that
//! cannot be read) is [`ProcessorError::Unavailable`], because the caller learns nothing
//! definitive about money from it; only the same idempotency key, which the processor
//! deduplicates, can tell. A charge, a refund, a capture or a void is returned as the processor
//! reported it (charge, amount, currency, status), never as requested: an authorisation is a
//! charge sent with `"capture": false`, which the caller checks reports `requires_capture`.
//! Every call sends its metadata; the settlement report is read in the `settlement` module.

mod ports;
mod reported;
mod settlement;

use std::time::Duration;

use payments_domain::{CancelOutcome, ProcessorCharge, ProcessorChargeRequest, ProcessorError};
use reqwest::{StatusCode, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::wire::{
    CANCELED, CancelView, ChargeBody, ConflictCode, ErrorEnvelope, IDEMPOTENCY_KEY, Metadata,
};
use reported::reported_charge;

/// A card processor reached over HTTP.
#[derive(Debug, Clone)]
pub struct HttpCardProcessor {
    http: reqwest::Client,
    charges_url: Url,
    cancel_url: Url,
    refunds_url: Url,
    refund_cancel_url: Url,
    captures_url: Url,
    capture_cancel_url: Url,
    voids_url: Url,
    void_cancel_url: Url,
    payouts_url: Url,
    payout_cancel_url: Url,
    settlement_report_url: Url,
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
        let refunds_url = join("v1/refunds")?;
        let refund_cancel_url = join("v1/refunds/cancel")?;
        let captures_url = join("v1/captures")?;
        let capture_cancel_url = join("v1/captures/cancel")?;
        let voids_url = join("v1/voids")?;
        let void_cancel_url = join("v1/voids/cancel")?;
        let payouts_url = join("v1/payouts")?;
        let payout_cancel_url = join("v1/payouts/cancel")?;
        let settlement_report_url = join("v1/reports/settlement")?;
        let http = reqwest::Client::builder().timeout(timeout).build()?;
        Ok(Self {
            http,
            charges_url,
            cancel_url,
            refunds_url,
            refund_cancel_url,
            captures_url,
            capture_cancel_url,
            voids_url,
            void_cancel_url,
            payouts_url,
            payout_cancel_url,
            settlement_report_url,
            timeout,
        })
    }

    /// `POST /v1/charges`: a charge, or with `capture` `Some(false)` an authorisation, as the
    /// processor reported it. A charge is sent without `capture`, as it always was.
    async fn create_charge(
        &self,
        request: ProcessorChargeRequest,
        capture: Option<bool>,
    ) -> Result<ProcessorCharge, ProcessorError> {
        let body = ChargeBody {
            amount: request.money.amount.minor_units(),
            currency: request.money.currency.code().to_owned(),
            source: request.source.as_str().to_owned(),
            metadata: Metadata::of(Some(&request.metadata)),
            capture,
        };
        let view = self
            .create(&self.charges_url, &request.idempotency_key, &body)
            .await?;
        reported_charge(view)
    }

    /// A transport failure: the request may or may not have reached the processor.
    fn unreachable(&self, error: &reqwest::Error) -> ProcessorError {
        let reason = if error.is_timeout() {
            // The charge or refund may well exist: only a retry with the same key can tell.
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

    /// `POST url` with the key and `body`: what the processor made (or had made under the
    /// key), as its view, or the port's error.
    async fn create<V: DeserializeOwned>(
        &self,
        url: &Url,
        idempotency_key: &str,
        body: &impl Serialize,
    ) -> Result<V, ProcessorError> {
        let response = self
            .http
            .post(url.clone())
            .header(IDEMPOTENCY_KEY, idempotency_key)
            .json(body)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        match response.status() {
            // As the processor reports it: the caller checks it against the request.
            StatusCode::OK => self.read(response).await,
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
                    None => (None, "The processor declined.".to_owned()),
                };
                Err(ProcessorError::Declined {
                    decline_code: decline_code.unwrap_or_else(|| "unknown".to_owned()),
                    message,
                })
            }
            // Still processing, or the key was canceled: either way this call made nothing.
            StatusCode::CONFLICT => Err(conflict(self.error_code(response).await)),
            status => Err(unexpected(status)),
        }
    }

    /// `GET url?idempotency_key=K`: the view of what was made under K, or `None` on a 404.
    async fn find<V: DeserializeOwned>(
        &self,
        mut url: Url,
        idempotency_key: &str,
    ) -> Result<Option<V>, ProcessorError> {
        url.query_pairs_mut()
            .append_pair("idempotency_key", idempotency_key);
        let response = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        match response.status() {
            StatusCode::OK => self.read(response).await.map(Some),
            StatusCode::NOT_FOUND => Ok(None),
            status => Err(unexpected(status)),
        }
    }

    /// `POST url` with the key: the processor's definitive answer about it, with what exists
    /// under it still as its view.
    async fn cancel_key<V: DeserializeOwned>(
        &self,
        url: &Url,
        idempotency_key: &str,
    ) -> Result<CancelOutcome<V>, ProcessorError> {
        let response = self
            .http
            .post(url.clone())
            .header(IDEMPOTENCY_KEY, idempotency_key)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        match response.status() {
            StatusCode::OK => match self.read(response).await? {
                CancelView::Exists(view) => Ok(CancelOutcome::Exists(view)),
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

    #[test]
    fn the_refund_urls_append_to_the_base_path() {
        let client = HttpCardProcessor::new("http://sim.local/prefix", Duration::from_secs(1));
        let urls = client.map(|c| (c.refunds_url.to_string(), c.refund_cancel_url.to_string()));
        assert_eq!(
            urls.ok(),
            Some((
                "http://sim.local/prefix/v1/refunds".to_owned(),
                "http://sim.local/prefix/v1/refunds/cancel".to_owned()
            ))
        );
    }

    #[test]
    fn the_payout_urls_append_to_the_base_path() {
        let client = HttpCardProcessor::new("http://sim.local/prefix", Duration::from_secs(1));
        let urls = client.map(|c| (c.payouts_url.to_string(), c.payout_cancel_url.to_string()));
        assert_eq!(
            urls.ok(),
            Some((
                "http://sim.local/prefix/v1/payouts".to_owned(),
                "http://sim.local/prefix/v1/payouts/cancel".to_owned()
            ))
        );
    }

    #[test]
    fn the_capture_and_void_urls_append_to_the_base_path() {
        let client = HttpCardProcessor::new("http://sim.local/prefix", Duration::from_secs(1));
        let urls = client.map(|c| {
            [
                c.captures_url,
                c.capture_cancel_url,
                c.voids_url,
                c.void_cancel_url,
            ]
            .map(|url| url.to_string())
        });
        let expected = ["captures", "captures/cancel", "voids", "voids/cancel"]
            .map(|path| format!("http://sim.local/prefix/v1/{path}"));
        assert_eq!(urls.ok(), Some(expected));
    }

    #[test]
    fn a_base_url_must_be_absolute_http() {
        assert!(charges_url("127.0.0.1:9090").is_err());
        assert!(charges_url("ftp://sim.local").is_err());
        assert!(charges_url("not a url").is_err());
    }
}
