//! Turning a stored answer back into HTTP: the first answer and every replay are built from
//! the same stored bytes, so a replay is byte-identical by construction.

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Datelike, Timelike, Utc};
use payments_idempotency::REPLAYED_HEADERS;
use payments_idempotency::engine::Answer;

use crate::Problem;

/// The header that tells a client it received a stored response, not a new execution.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The header that tells a client until when its key replays this response: the end of the
/// key's retention, counted from the record's completion, as an HTTP date (RFC 9110).
pub const IDEMPOTENCY_KEY_EXPIRES: HeaderName = HeaderName::from_static("idempotency-key-expires");

/// The header that names the schema version of the operation that wrote the answer: in a
/// fleet mid-deploy, a retry answered by another version says whose answer it carries.
pub const IDEMPOTENT_SCHEMA_VERSION: HeaderName =
    HeaderName::from_static("idempotent-schema-version");

/// An HTTP date (IMF-fixdate), the format of `Date`, `Expires` and `Retry-After` dates. Its
/// names are English whatever the locale; written out here byte by byte, not through a format
/// string, because every answer carries one (formatted, it cost a replay from memory 3,000
/// instructions). The format's year has four digits, which an expiry stays within.
pub fn http_date(at: DateTime<Utc>) -> String {
    const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let year = at.year().clamp(0, 9999).unsigned_abs();
    let mut date = String::with_capacity(29);
    date.push_str(DAYS[at.weekday().num_days_from_monday() as usize]);
    date.push_str(", ");
    push_two_digits(&mut date, at.day());
    date.push(' ');
    date.push_str(MONTHS[at.month0() as usize]);
    date.push(' ');
    push_two_digits(&mut date, year / 100);
    push_two_digits(&mut date, year % 100);
    date.push(' ');
    push_two_digits(&mut date, at.hour());
    date.push(':');
    push_two_digits(&mut date, at.minute());
    date.push(':');
    push_two_digits(&mut date, at.second());
    date.push_str(" GMT");
    date
}

/// The last two digits of `value`, `07` for 7.
fn push_two_digits(out: &mut String, value: u32) {
    for digit in [value / 10 % 10, value % 10] {
        out.push(char::from(b'0' + digit as u8));
    }
}

/// Sends a stored answer. The replay marker, the schema version and the key's expiry belong to
/// each exchange and are added here, never stored.
///
/// Whatever the stored response came from, only a status of `stored_statuses` (the statuses the
/// service stores as final answers) and only the [`REPLAYED_HEADERS`] are sent: a stored
/// `Set-Cookie`, `Content-Length` or status 101 could otherwise speak for the service.
pub fn respond(answer: Answer, stored_statuses: &[u16]) -> Response {
    let Answer {
        response: stored,
        replayed,
        written_by,
        expires_at,
    } = answer;
    let status = stored_statuses
        .contains(&stored.status)
        .then(|| StatusCode::from_u16(stored.status).ok())
        .flatten();
    let Some(status) = status else {
        tracing::error!(
            status = stored.status,
            "a stored answer's status is not one this service stores"
        );
        return Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "Internal error.",
        )
        .into_response();
    };
    let mut response = Response::new(Body::from(stored.body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    let replayable = stored.headers.iter().filter(|(name, _)| {
        REPLAYED_HEADERS
            .iter()
            .any(|replayed| replayed.eq_ignore_ascii_case(name))
    });
    for (name, value) in replayable {
        let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) else {
            continue;
        };
        headers.insert(name, value);
    }
    if replayed {
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    headers.insert(
        IDEMPOTENT_SCHEMA_VERSION,
        HeaderValue::from(written_by.get()),
    );
    if let Ok(value) = HeaderValue::try_from(http_date(expires_at)) {
        headers.insert(IDEMPOTENCY_KEY_EXPIRES, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use payments_idempotency::{SchemaVersion, StoredResponse};

    use super::*;

    fn replayed(response: StoredResponse) -> Answer {
        Answer {
            written_by: response.schema_version,
            response,
            replayed: true,
            expires_at: Utc::now(),
        }
    }

    #[test]
    fn only_allow_listed_headers_and_stored_statuses_are_sent() {
        let forged = StoredResponse {
            schema_version: SchemaVersion::new(3),
            status: 201,
            headers: vec![
                ("content-type".into(), "application/json".into()),
                ("set-cookie".into(), "a=b".into()),
                ("content-length".into(), "2".into()),
                ("Access-Control-Allow-Origin".into(), "*".into()),
            ],
            body: b"{}".to_vec(),
        };
        let response = respond(replayed(forged), &[201]);
        let names: Vec<&str> = response.headers().keys().map(|n| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "content-type",
                "idempotent-replayed",
                "idempotent-schema-version",
                "idempotency-key-expires"
            ]
        );
        assert_eq!(response.headers()["idempotent-schema-version"], "3");
        for status in [101, 204, 302, 500, 999] {
            let stored = StoredResponse::new(SchemaVersion::new(1), status, [], Vec::new());
            assert_eq!(
                respond(replayed(stored), &[201]).status(),
                StatusCode::INTERNAL_SERVER_ERROR,
                "status {status}"
            );
        }
    }

    #[test]
    fn an_http_date_is_an_imf_fixdate() {
        let at = Utc
            .with_ymd_and_hms(2026, 12, 1, 9, 5, 7)
            .single()
            .unwrap_or_default();
        assert_eq!(http_date(at), "Tue, 01 Dec 2026 09:05:07 GMT");
        let at = Utc
            .with_ymd_and_hms(2027, 1, 31, 23, 59, 59)
            .single()
            .unwrap_or_default();
        assert_eq!(http_date(at), "Sun, 31 Jan 2027 23:59:59 GMT");
        let at = Utc
            .with_ymd_and_hms(987, 3, 9, 0, 0, 0)
            .single()
            .unwrap_or_default();
        assert_eq!(http_date(at), "Fri, 09 Mar 0987 00:00:00 GMT");
    }
}
