//! [`Client`]: the API's calls, each sent under the retry policy, the writes each under one key
//! per logical operation (the `write` module).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use reqwest::header::CONTENT_TYPE;
use reqwest::{Method, Url};
use serde::de::DeserializeOwned;

use crate::error::Error;
use crate::journal::{Journal, api_key_fingerprint};
use crate::received::{Received, answer, problem};
use crate::retention::{DEFAULT_KEY_RETENTION, Held};
use crate::retry::{RetryPolicy, Verdict, retry_after, verdict};
use crate::types::{Balance, Charge, EventList, IdempotencyKeyRecord, KeyOperation};

const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// A client of the payments API for one tenant's API key.
#[derive(Clone)]
pub struct Client {
    pub(crate) http: reqwest::Client,
    pub(crate) base_url: Url,
    api_key: String,
    /// What the journal records of the API key: a hash, never the key.
    pub(crate) api_key_fingerprint: String,
    pub(crate) policy: RetryPolicy,
    /// How long the service keeps a key after its final answer, as the client was told.
    pub(crate) key_retention: Duration,
    pub(crate) journal: Option<Arc<dyn Journal>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The API key is a secret: it is never printed.
        f.debug_struct("Client")
            .field("base_url", &self.base_url.as_str())
            .field("policy", &self.policy)
            .field("key_retention", &self.key_retention)
            .field("journal", &self.journal)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client of the service at `base_url` (such as `http://127.0.0.1:8080`), calling with
    /// `api_key`, under the default [`RetryPolicy`], the service's default key retention and
    /// no journal. It follows no redirection (a redirection is [`Error::Redirected`]).
    pub fn new(base_url: &str, api_key: &str) -> Result<Self, Error> {
        let invalid = |reason| Error::InvalidBaseUrl {
            url: without_user_info(base_url),
            reason,
        };
        let not_http = "is not an absolute http(s) URL";
        let base_url = Url::parse(base_url).map_err(|_| invalid(not_http))?;
        if !matches!(base_url.scheme(), "http" | "https") || base_url.cannot_be_a_base() {
            return Err(invalid(not_http));
        }
        if !base_url.username().is_empty() || base_url.password().is_some() {
            return Err(invalid(
                "carries user-info: the API key is the only credential the service takes",
            ));
        }
        // A redirection would carry the body and the key to another service, and an answer
        // from there is no answer of this one.
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(Error::Build)?;
        Ok(Self {
            http,
            base_url,
            api_key: api_key.to_owned(),
            api_key_fingerprint: api_key_fingerprint(api_key),
            policy: RetryPolicy::default(),
            key_retention: DEFAULT_KEY_RETENTION,
            journal: None,
        })
    }

    /// The same client under `policy`.
    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The policy its calls are sent under.
    pub fn policy(&self) -> RetryPolicy {
        self.policy
    }

    /// The same client, for a service that keeps a key for `retention` after its final answer
    /// (its `idempotency.ttl_secs`; a day, the service's default, unless told), at least a
    /// second. The client cannot ask the service: told less, it only asks about a key sooner
    /// (see the `retention` module); told more, it would resend a key the service may have
    /// forgotten.
    pub fn with_key_retention(mut self, retention: Duration) -> Self {
        self.key_retention = retention.max(Duration::from_secs(1));
        self
    }

    /// The same client, recording its journaled operations in `journal`.
    pub fn with_journal(mut self, journal: Arc<dyn Journal>) -> Self {
        self.journal = Some(journal);
        self
    }

    /// `GET /charges/{id}`.
    pub async fn charge(&self, id: &str) -> Result<Charge, Error> {
        self.read(&["charges", id], &[]).await
    }

    /// `GET /balance`.
    pub async fn balance(&self) -> Result<Balance, Error> {
        self.read(&["balance"], &[]).await
    }

    /// `GET /idempotency-keys/{key}`: did the request sent under `key` go through?
    pub async fn key(
        &self,
        key: &str,
        operation: KeyOperation,
    ) -> Result<IdempotencyKeyRecord, Error> {
        let query = [("operation", operation.as_str())];
        self.read(&["idempotency-keys", key], &query).await
    }

    /// `GET /idempotency-keys/{key}`, read with the service's clock when it answered (its
    /// `Date`); `None` when the service holds no such key (`404`).
    pub(crate) async fn inspect(
        &self,
        key: &str,
        operation: KeyOperation,
    ) -> Result<Option<(IdempotencyKeyRecord, SystemTime)>, Error> {
        let mut url = self.url(&["idempotency-keys", key]);
        url.query_pairs_mut()
            .append_pair("operation", operation.as_str());
        let received = self.send(Method::GET, url, None, None).await?;
        if received.status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let service_now = received.date().unwrap_or_else(SystemTime::now);
        Ok(Some((answer(received, None)?.value, service_now)))
    }

    /// `GET /events`: a page of events, oldest first, after the event `starting_after`.
    pub async fn events(
        &self,
        starting_after: Option<&str>,
        limit: Option<u32>,
    ) -> Result<EventList, Error> {
        let limit = limit.map(|limit| limit.to_string());
        let mut query = Vec::new();
        if let Some(after) = starting_after {
            query.push(("starting_after", after));
        }
        if let Some(limit) = &limit {
            query.push(("limit", limit.as_str()));
        }
        self.read(&["events"], &query).await
    }

    async fn read<T: DeserializeOwned>(
        &self,
        path: &[&str],
        query: &[(&str, &str)],
    ) -> Result<T, Error> {
        let mut url = self.url(path);
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let received = self.send(Method::GET, url, None, None).await?;
        Ok(answer(received, None)?.value)
    }

    pub(crate) fn url(&self, path: &[&str]) -> Url {
        let mut url = self.base_url.clone();
        url.path_segments_mut()
            .expect("checked in new: the base URL takes a path")
            .pop_if_empty()
            .extend(path);
        url
    }

    /// Sends the request until its answer is final, the policy's deadline passes, or a wait
    /// would end after it. A write sends under its key only while the service surely holds it
    /// (`held`): its sends end then, if the deadline has not ended them before.
    pub(crate) async fn send(
        &self,
        method: Method,
        url: Url,
        body: Option<&[u8]>,
        key: Option<(&str, Held)>,
    ) -> Result<Received, Error> {
        let started = Instant::now();
        let policy = &self.policy;
        let deadline = key.map_or(policy.deadline, |(_, held)| {
            held.window(SystemTime::now(), policy.deadline)
        });
        let mut attempts = 0;
        loop {
            attempts += 1;
            let remaining = deadline.saturating_sub(started.elapsed());
            let mut request = self
                .http
                .request(method.clone(), url.clone())
                .bearer_auth(&self.api_key)
                .timeout(policy.attempt_timeout.min(remaining));
            if let Some((key, _)) = key {
                request = request.header(IDEMPOTENCY_KEY, key);
            }
            if let Some(body) = body {
                request = request
                    .header(CONTENT_TYPE, "application/json")
                    .body(body.to_vec());
            }
            if let Some(wait) = policy.prefer_wait_secs {
                request = request.header("prefer", format!("wait={wait}"));
            }
            let (last, after) = match attempt(request, attempts).await {
                Ok(received) if received.status.is_redirection() => {
                    let location = received.headers.get(reqwest::header::LOCATION);
                    let location = location.and_then(|value| value.to_str().ok());
                    return Err(Error::Redirected {
                        status: received.status.as_u16(),
                        location: location.map_or_else(|| "nowhere".to_owned(), without_user_info),
                    });
                }
                Ok(received) => {
                    // A success is never a problem: only an error's body is read for its code.
                    let code = (!received.status.is_success())
                        .then(|| problem(&received.body).map(|problem| problem.code))
                        .flatten();
                    match verdict(received.status, code.as_deref()) {
                        Verdict::Final => return Ok(received),
                        Verdict::Retry => {
                            let after = retry_after(&received.headers, SystemTime::now());
                            let code = code.unwrap_or_default();
                            (format!("{} {code}", received.status), after)
                        }
                    }
                }
                Err(error) => (describe(&error), None),
            };
            let wait = policy.backoff(attempts, after, rand::random::<f64>());
            if started.elapsed() + wait >= deadline {
                // A resend that starts later would outlast the key, as far as the client knows.
                let now = SystemTime::now();
                let resend_before = key
                    .and_then(|(_, held)| held.resend_before(policy.deadline))
                    .filter(|before| *before > now);
                return Err(Error::OutcomeUnknown {
                    key: key.map(|(key, _)| key.to_owned()),
                    attempts,
                    last,
                    resend_before,
                });
            }
            tokio::time::sleep(wait).await;
        }
    }
}

/// Attempt number `attempts` of a request, to the last byte of its answer.
async fn attempt(
    request: reqwest::RequestBuilder,
    attempts: u32,
) -> Result<Received, reqwest::Error> {
    let response = request.send().await?;
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.bytes().await?.to_vec();
    Ok(Received {
        status,
        headers,
        body,
        attempts,
    })
}

/// A transport failure in one line, with its causes.
fn describe(error: &reqwest::Error) -> String {
    let what = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "could not connect"
    } else {
        "connection failed"
    };
    let mut line = what.to_owned();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        line.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    line
}

/// `url` without its user-info, to be shown: a URL's user-info is a credential. What does not
/// parse as a URL loses whatever precedes an `@` in what would be its authority.
pub(crate) fn without_user_info(url: &str) -> String {
    // Only a URL with a host has user-info to set.
    if let Ok(mut parsed) = Url::parse(url)
        && parsed.has_host()
    {
        let _ = parsed.set_username("");
        let _ = parsed.set_password(None);
        return parsed.into();
    }
    let (scheme, rest) = url.split_once("://").map_or(("", url), |(s, r)| (s, r));
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    match authority.rfind('@') {
        Some(at) if scheme.is_empty() => rest[at + 1..].to_owned(),
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_shown_without_its_user_info() {
        let shown = without_user_info("https://user:secret@pay.example/v1?x=1");
        assert_eq!(shown, "https://pay.example/v1?x=1");
        assert_eq!(without_user_info("http://secret@host:80"), "http://host/");
        // Not a URL (a bad port), yet the user-info goes.
        assert_eq!(
            without_user_info("http://user:secret@host:99999/x"),
            "http://host:99999/x"
        );
        assert_eq!(without_user_info("user:secret@host"), "host");
        assert_eq!(without_user_info("http://host/a@b"), "http://host/a@b");
        assert_eq!(without_user_info("not a url"), "not a url");
    }

    #[test]
    fn a_base_url_with_user_info_is_refused_without_showing_it() {
        let error = Client::new("http://user:secret@127.0.0.1:8080", "sk").expect_err("user-info");
        let shown = error.to_string();
        assert!(shown.contains("user-info"), "{shown}");
        assert!(!shown.contains("secret"), "{shown}");
        let error = Client::new("ftp://user:secret@host", "sk").expect_err("not http");
        assert!(!error.to_string().contains("secret"), "{error}");
    }
}
