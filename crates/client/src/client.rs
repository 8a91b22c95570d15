//! [`Client`]: the API's calls, each sent under the retry policy, the writes each under one key
//! per logical operation.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use reqwest::header::{CONTENT_TYPE, HeaderMap};
use reqwest::{Method, StatusCode, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use crate::error::Error;
use crate::journal::{Journal, JournalEntry, RecordedAnswer};
use crate::operation::{Answer, Operation, Origin};
use crate::retry::{RetryPolicy, Verdict, retry_after, verdict};
use crate::types::{
    Balance, Charge, ChargeRequest, EventList, IdempotencyKeyRecord, KeyOperation, Payout,
    PayoutRequest, Problem, Refund, RefundRequest,
};

const IDEMPOTENCY_KEY: &str = "idempotency-key";
const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// Carried by every answer the service stores under the key, and only by those.
const IDEMPOTENCY_KEY_EXPIRES: &str = "idempotency-key-expires";
const IDEMPOTENCY_KEY_REUSED: &str = "idempotency_key_reused";

/// A client of the payments API for one tenant's API key.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base_url: Url,
    api_key: String,
    policy: RetryPolicy,
    journal: Option<Arc<dyn Journal>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The API key is a secret: it is never printed.
        f.debug_struct("Client")
            .field("base_url", &self.base_url.as_str())
            .field("policy", &self.policy)
            .field("journal", &self.journal)
            .finish_non_exhaustive()
    }
}

/// An answer as it came off the wire, after the retries.
struct Received {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
    attempts: u32,
}

impl Client {
    /// A client of the service at `base_url` (such as `http://127.0.0.1:8080`), calling with
    /// `api_key`, under the default [`RetryPolicy`] and no journal.
    pub fn new(base_url: &str, api_key: &str) -> Result<Self, Error> {
        let invalid = || Error::InvalidBaseUrl {
            url: base_url.to_owned(),
        };
        let base_url = Url::parse(base_url).map_err(|_| invalid())?;
        if !matches!(base_url.scheme(), "http" | "https") || base_url.cannot_be_a_base() {
            return Err(invalid());
        }
        let http = reqwest::Client::builder().build().map_err(Error::Build)?;
        Ok(Self {
            http,
            base_url,
            api_key: api_key.to_owned(),
            policy: RetryPolicy::default(),
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

    /// The same client, recording its journaled operations in `journal`.
    pub fn with_journal(mut self, journal: Arc<dyn Journal>) -> Self {
        self.journal = Some(journal);
        self
    }

    /// `POST /charges`: charges a card, once however often it is retried.
    pub async fn create_charge(
        &self,
        request: &ChargeRequest,
        operation: &Operation,
    ) -> Result<Answer<Charge>, Error> {
        self.create(&["charges"], request, operation).await
    }

    /// `POST /charges/{id}/refunds`: gives back part or all of a charge, once.
    pub async fn create_refund(
        &self,
        charge: &str,
        request: &RefundRequest,
        operation: &Operation,
    ) -> Result<Answer<Refund>, Error> {
        self.create(&["charges", charge, "refunds"], request, operation)
            .await
    }

    /// `POST /payouts`: pays out of the balance to a bank account, once.
    pub async fn create_payout(
        &self,
        request: &PayoutRequest,
        operation: &Operation,
    ) -> Result<Answer<Payout>, Error> {
        self.create(&["payouts"], request, operation).await
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

    /// A write: one logical operation, under the operation's key (or the one its journal
    /// entry holds), recorded in the journal before the first send when it is named for one.
    async fn create<Request: Serialize, T: DeserializeOwned>(
        &self,
        path: &[&str],
        request: &Request,
        operation: &Operation,
    ) -> Result<Answer<T>, Error> {
        let url = self.url(path);
        let body = serde_json::to_vec(request).expect("a request body serialises");
        let Some(name) = operation.journal_name() else {
            let received = self.send(Method::POST, url, Some(&body), Some(operation.key()));
            return answer(received.await?, Some(operation.key()));
        };
        let journal = self.journal.as_ref().ok_or_else(|| Error::NoJournal {
            name: name.to_owned(),
        })?;
        let fingerprint = format!(
            "POST {} sha256:{}",
            url.path(),
            hex::encode(Sha256::digest(&body))
        );
        let entry = match journal.entry(name)? {
            Some(entry) if entry.request != fingerprint => {
                return Err(Error::JournalHoldsAnotherRequest {
                    name: name.to_owned(),
                    recorded: entry.request,
                });
            }
            Some(entry) if operation.key_given() && entry.key != operation.key() => {
                return Err(Error::JournalHoldsAnotherKey {
                    name: name.to_owned(),
                    recorded: entry.key,
                    given: operation.key().to_owned(),
                });
            }
            Some(entry) => entry,
            None => {
                let entry = JournalEntry {
                    name: name.to_owned(),
                    request: fingerprint,
                    key: operation.key().to_owned(),
                    answer: None,
                };
                // Recorded before the first send: a crash from here on resumes this key.
                journal.record(&entry)?;
                entry
            }
        };
        if let Some(recorded) = &entry.answer {
            return answer_from_journal(recorded, &entry.key);
        }
        let received = self
            .send(Method::POST, url, Some(&body), Some(&entry.key))
            .await?;
        if let Some(recorded) = recorded_answer(&received) {
            journal.record(&JournalEntry {
                answer: Some(recorded),
                ..entry.clone()
            })?;
        }
        answer(received, Some(&entry.key))
    }

    fn url(&self, path: &[&str]) -> Url {
        let mut url = self.base_url.clone();
        url.path_segments_mut()
            .expect("checked in new: the base URL takes a path")
            .pop_if_empty()
            .extend(path);
        url
    }

    /// Sends the request until its answer is final, the policy's deadline passes, or a wait
    /// would end after it.
    async fn send(
        &self,
        method: Method,
        url: Url,
        body: Option<&[u8]>,
        key: Option<&str>,
    ) -> Result<Received, Error> {
        let started = Instant::now();
        let policy = &self.policy;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let remaining = policy.deadline.saturating_sub(started.elapsed());
            let mut request = self
                .http
                .request(method.clone(), url.clone())
                .bearer_auth(&self.api_key)
                .timeout(policy.attempt_timeout.min(remaining));
            if let Some(key) = key {
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
            if started.elapsed() + wait >= policy.deadline {
                return Err(Error::OutcomeUnknown {
                    key: key.map(str::to_owned),
                    attempts,
                    last,
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

fn problem(body: &[u8]) -> Option<Problem> {
    serde_json::from_slice(body).ok()
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    Some(headers.get(name)?.to_str().ok()?.to_owned())
}

/// The answer to record in the journal: one the service stores under the key.
fn recorded_answer(received: &Received) -> Option<RecordedAnswer> {
    Some(RecordedAnswer {
        status: received.status.as_u16(),
        key_expires: header(&received.headers, IDEMPOTENCY_KEY_EXPIRES)?,
        body: serde_json::from_slice(&received.body).ok()?,
    })
}

/// The caller's value, or the error the final answer is.
fn answer<T: DeserializeOwned>(received: Received, key: Option<&str>) -> Result<Answer<T>, Error> {
    let excerpt = || {
        String::from_utf8_lossy(&received.body)
            .chars()
            .take(200)
            .collect()
    };
    if !received.status.is_success() {
        let problem = problem(&received.body).ok_or_else(|| Error::UnexpectedAnswer {
            status: received.status.as_u16(),
            expected: "a problem",
            excerpt: excerpt(),
        })?;
        return Err(match key {
            Some(key) if problem.code == IDEMPOTENCY_KEY_REUSED => Error::RequestChanged {
                key: key.to_owned(),
                problem: Box::new(problem),
            },
            _ => Error::Problem {
                problem: Box::new(problem),
            },
        });
    }
    let value = serde_json::from_slice(&received.body).map_err(|_| Error::UnexpectedAnswer {
        status: received.status.as_u16(),
        expected: std::any::type_name::<T>(),
        excerpt: excerpt(),
    })?;
    let replayed = header(&received.headers, IDEMPOTENT_REPLAYED).as_deref() == Some("true");
    Ok(Answer {
        value,
        status: received.status.as_u16(),
        key: key.map(str::to_owned),
        key_expires: header(&received.headers, IDEMPOTENCY_KEY_EXPIRES)
            .and_then(|date| httpdate::parse_http_date(&date).ok()),
        origin: if replayed {
            Origin::Replayed
        } else {
            Origin::Executed
        },
        attempts: received.attempts,
    })
}

fn answer_from_journal<T: DeserializeOwned>(
    recorded: &RecordedAnswer,
    key: &str,
) -> Result<Answer<T>, Error> {
    let status = StatusCode::from_u16(recorded.status).map_err(|_| Error::UnexpectedAnswer {
        status: recorded.status,
        expected: "a status",
        excerpt: String::new(),
    })?;
    let mut headers = HeaderMap::new();
    if let Ok(expires) = recorded.key_expires.parse() {
        headers.insert(IDEMPOTENCY_KEY_EXPIRES, expires);
    }
    let received = Received {
        status,
        headers,
        body: serde_json::to_vec(&recorded.body).expect("JSON serialises"),
        attempts: 0,
    };
    let answer = answer(received, Some(key))?;
    Ok(Answer {
        origin: Origin::Journal,
        ..answer
    })
}
