//! One delivery attempt: the URL checked against the policy on the addresses it has now, the
//! event's body signed with a fresh timestamp under the endpoint's secrets, one `POST` through
//! the guarded client, and what came of it. A `2xx` is delivered; `410 Gone` says the endpoint
//! is gone for good (its endpoint is to be disabled, never tried again); anything else (another
//! status, a redirect, which is never followed, a timeout, a refused or reset connection, an
//! address the policy refuses) is to be tried again on the schedule. Of the answer's body only
//! a bounded excerpt is kept.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use payments_domain::{AddressPolicy, EndpointUrl};
use reqwest::header::{CONTENT_TYPE, HeaderMap, RETRY_AFTER, USER_AGENT};

use crate::guard::before_send;
use crate::{Secret, signature_header};

/// The most of an answer's body an attempt keeps, in bytes.
pub const EXCERPT_BYTES: usize = 1024;

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub outcome: Outcome,
    /// The answer's status, when there was an answer.
    pub status: Option<u16>,
    /// At most [`EXCERPT_BYTES`] of the answer's body, as text.
    pub excerpt: String,
}

/// What to do after an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Delivered,
    /// `410 Gone`: the endpoint is disabled, and nothing is sent there again.
    Gone,
    /// Tried again on the schedule, not sooner than `retry_after` when the endpoint said so.
    Retry {
        reason: String,
        retry_after: Option<Duration>,
    },
}

/// One event to deliver: its id (the `webhook-id`) and its body, as `GET /events` shows it.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    pub webhook_id: &'a str,
    pub body: &'a [u8],
}

/// Makes one attempt of `delivery` to `url` with `client` (built by
/// [`guard::client`](crate::guard::client) with the same `policy`), signed with `secrets`.
pub async fn attempt(
    client: &reqwest::Client,
    policy: &AddressPolicy,
    url: &EndpointUrl,
    secrets: &[&Secret],
    delivery: Delivery<'_>,
) -> Attempt {
    if let Err(refused) = before_send(policy, url).await {
        return unanswered(format!("not sent: {refused}"));
    }
    let now = SystemTime::now();
    let timestamp = now.duration_since(UNIX_EPOCH).map_or(0, |since| {
        i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
    });
    let signature = signature_header(secrets, delivery.webhook_id, timestamp, delivery.body);
    let sent = client
        .post(url.as_url().clone())
        .header(CONTENT_TYPE, "application/json")
        .header(
            USER_AGENT,
            concat!("payments-webhooks/", env!("CARGO_PKG_VERSION")),
        )
        .header("webhook-id", delivery.webhook_id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(delivery.body.to_vec())
        .send()
        .await;
    let mut response = match sent {
        Ok(response) => response,
        Err(error) => return unanswered(failure(&error)),
    };
    let status = response.status();
    let retry_after = retry_after(response.headers(), now);
    let excerpt = excerpt(&mut response).await;
    let code = Some(status.as_u16());
    let outcome = if status.is_success() {
        Outcome::Delivered
    } else if status == reqwest::StatusCode::GONE {
        Outcome::Gone
    } else if status.is_redirection() {
        Outcome::Retry {
            reason: format!("answered {status}: redirects are not followed"),
            retry_after: None,
        }
    } else {
        Outcome::Retry {
            reason: format!("answered {status}"),
            retry_after,
        }
    };
    Attempt {
        outcome,
        status: code,
        excerpt,
    }
}

/// An attempt that got no answer: tried again on the schedule.
fn unanswered(reason: String) -> Attempt {
    Attempt {
        outcome: Outcome::Retry {
            reason,
            retry_after: None,
        },
        status: None,
        excerpt: String::new(),
    }
}

/// Why a request got no answer, with its causes: a refused address names itself there.
fn failure(error: &reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "could not connect"
    } else {
        "failed"
    };
    let mut text = format!("{kind}: {error}");
    let mut source = std::error::Error::source(error);
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

/// `Retry-After` in seconds or as an HTTP date, from `now`; `None` when absent or unreadable.
fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    match text.parse::<u64>() {
        Ok(seconds) => Some(Duration::from_secs(seconds)),
        Err(_) => {
            let at = httpdate::parse_http_date(text).ok()?;
            Some(at.duration_since(now).unwrap_or_default())
        }
    }
}

/// The first [`EXCERPT_BYTES`] of the body, read no further, cut on a character boundary.
async fn excerpt(response: &mut reqwest::Response) -> String {
    let mut kept = Vec::new();
    while kept.len() < EXCERPT_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => kept.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    kept.truncate(EXCERPT_BYTES);
    let mut text = String::from_utf8_lossy(&kept).into_owned();
    // A character cut in two at the end shows as one replacement character; drop it.
    if kept.len() == EXCERPT_BYTES && text.ends_with('\u{fffd}') {
        text.pop();
    }
    text
}
