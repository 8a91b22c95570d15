//! [`Received`]: an answer as it came off the wire, and what it means for the caller: its
//! value or its error, and what the journal keeps of it.

use std::time::SystemTime;

use reqwest::StatusCode;
use reqwest::header::{DATE, HeaderMap};
use serde::de::DeserializeOwned;

use crate::error::Error;
use crate::journal::RecordedAnswer;
use crate::operation::{Answer, Origin};
use crate::types::Problem;

const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// Carried by every answer the service stores under the key, and only by those.
const IDEMPOTENCY_KEY_EXPIRES: &str = "idempotency-key-expires";
const IDEMPOTENCY_KEY_REUSED: &str = "idempotency_key_reused";

/// An answer as it came off the wire, after the retries.
pub(crate) struct Received {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Vec<u8>,
    pub(crate) attempts: u32,
}

impl Received {
    /// The service's clock when it answered (its `Date`), if it said.
    pub(crate) fn date(&self) -> Option<SystemTime> {
        httpdate::parse_http_date(&header(&self.headers, DATE.as_str())?).ok()
    }
}

pub(crate) fn problem(body: &[u8]) -> Option<Problem> {
    serde_json::from_slice(body).ok()
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    Some(headers.get(name)?.to_str().ok()?.to_owned())
}

/// The answer to record in the journal: one the service stores under the key.
pub(crate) fn recorded_answer(received: &Received) -> Option<RecordedAnswer> {
    Some(RecordedAnswer {
        status: received.status.as_u16(),
        key_expires: header(&received.headers, IDEMPOTENCY_KEY_EXPIRES)?,
        body: serde_json::from_slice(&received.body).ok()?,
    })
}

/// The caller's value, or the error the final answer is.
pub(crate) fn answer<T: DeserializeOwned>(
    received: Received,
    key: Option<&str>,
) -> Result<Answer<T>, Error> {
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

pub(crate) fn answer_from_journal<T: DeserializeOwned>(
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
