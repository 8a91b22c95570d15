//! Request ids: a client may send its own `X-Request-Id` to correlate its logs with ours, but
//! only a UUID is kept. Anything else is replaced by one the service makes, and the client's
//! text is logged in a field of its own, escaped, so no client can write into a log line.
//! Neither that text nor the path (whose ids may be anything a client typed) reaches the log
//! with a card number in it: its digits are masked.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use std::borrow::Cow;

use payments_domain::{contains_card_number, mask_card_numbers};
use percent_encoding::percent_decode_str;
use tracing::Span;

use super::REQUEST_ID;

/// The longest part of a refused client request id that is logged.
const LOGGED_CHARS: usize = 64;

/// What a client sent as its request id when it was not a UUID.
#[derive(Debug, Clone)]
pub(super) struct ClientRequestId(String);

/// Removes a client's request id unless it is a hyphenated UUID, keeping the refused text
/// (shortened) for the log.
pub(super) async fn vet(mut request: Request, next: Next) -> Response {
    let refused = request
        .headers()
        .get(REQUEST_ID)
        .filter(|value| !is_uuid(value.as_bytes()))
        .map(|value| {
            let text = String::from_utf8_lossy(value.as_bytes());
            // Masked whole, then shortened: a number cut in two by the cut is still masked.
            ClientRequestId(
                mask_card_numbers(&text)
                    .chars()
                    .take(LOGGED_CHARS)
                    .collect(),
            )
        });
    if let Some(refused) = refused {
        request.headers_mut().remove(REQUEST_ID);
        request.extensions_mut().insert(refused);
    }
    next.run(request).await
}

/// The span every request is traced in: its id (a UUID, by now) and, if the client sent
/// something else, that text as a `Debug` string (quoted, control characters escaped).
pub(super) fn span(request: &Request) -> Span {
    let request_id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let span = tracing::info_span!(
        "request",
        http.method = %request.method(),
        http.path = %loggable_path(request.uri().path()),
        request.id = %request_id,
        request.client_id = tracing::field::Empty,
    );
    if let Some(ClientRequestId(sent)) = request.extensions().get() {
        span.record("request.client_id", tracing::field::debug(sent));
    }
    span
}

/// The path as the log shows it: with the digits of any card number masked, whether the
/// client wrote the number plainly or percent-encoded its separators (`4242%204242…`). An
/// encoded one cannot be masked digit by digit in the raw path, so there every digit is.
fn loggable_path(path: &str) -> Cow<'_, str> {
    let masked = mask_card_numbers(path);
    if contains_card_number(&percent_decode_str(&masked).decode_utf8_lossy()) {
        return Cow::Owned(masked.replace(|c: char| c.is_ascii_digit(), "*"));
    }
    masked
}

/// A UUID in its hyphenated form (`6f1c2e4a-0d1b-4c3e-9f7a-2b5d8e6c1a90`), any case. The
/// braced and URN forms the parser also takes are refused: a request id has one form.
fn is_uuid(value: &[u8]) -> bool {
    value.len() == 36 && uuid::Uuid::try_parse_ascii(value).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_card_number_in_the_path_is_masked_however_it_is_encoded() {
        assert_eq!(loggable_path("/charges/ch_123"), "/charges/ch_123");
        assert_eq!(
            loggable_path("/charges/4000056655665556"),
            "/charges/****************"
        );
        assert_eq!(
            loggable_path("/charges/4242.4242.4242.4242/refunds"),
            "/charges/****.****.****.****/refunds"
        );
        let encoded = loggable_path("/charges/4242%204242%204242%204242");
        assert!(!encoded.contains("4242"), "{encoded}");
        let full_width = loggable_path(
            "/charges/%EF%BC%94%EF%BC%92%EF%BC%94%EF%BC%92%EF%BC%94%EF%BC%92%EF%BC%94%EF%BC%92%EF%BC%94%EF%BC%92%EF%BC%94%EF%BC%92%EF%BC%94%EF%BC%92%EF%BC%94%EF%BC%92",
        );
        assert!(
            !contains_card_number(&percent_decode_str(&full_width).decode_utf8_lossy()),
            "{full_width}"
        );
    }

    #[test]
    fn only_a_hyphenated_uuid_is_a_request_id() {
        assert!(is_uuid(b"6f1c2e4a-0d1b-4c3e-9f7a-2b5d8e6c1a90"));
        assert!(is_uuid(b"6F1C2E4A-0D1B-4C3E-9F7A-2B5D8E6C1A90"));
        for refused in [
            &b"6f1c2e4a0d1b4c3e9f7a2b5d8e6c1a90"[..],
            b"{6f1c2e4a-0d1b-4c3e-9f7a-2b5d8e6c1a90}",
            b"urn:uuid:6f1c2e4a-0d1b-4c3e-9f7a-2b5d8e6c1a90",
            b"abc} charge created charge.id=ch_1",
            b"",
        ] {
            assert!(!is_uuid(refused), "{refused:?}");
        }
    }
}
