//! The `Idempotency-Key` header value.

use std::fmt;

/// A validated idempotency key: 1 to 255 visible ASCII characters.
///
/// The header may carry the key as an RFC 8941 structured-field string (`"abc"`), as the IETF
/// idempotency-key draft specifies, or as a bare token (`abc`) as most clients send it; both
/// denote the same key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The longest key accepted, in characters (all ASCII, so also bytes).
    pub const MAX_LEN: usize = 255;

    /// Parses a header value, unquoting a structured-field string first.
    pub fn parse(raw: &str) -> Result<Self, KeyError> {
        let key = match raw.strip_prefix('"') {
            Some(quoted) => unquote(quoted)?,
            None => raw.to_owned(),
        };
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > Self::MAX_LEN {
            return Err(KeyError::TooLong(key.len()));
        }
        // Visible ASCII only (0x21..=0x7E): no spaces, controls or non-ASCII bytes, so a key
        // can never smuggle a newline into a log line or differ from itself after normalisation.
        if !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(KeyError::NotVisibleAscii);
        }
        Ok(Self(key))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Reads the rest of a structured-field string after its opening quote (RFC 8941 §4.2.5):
/// `\"` and `\\` are the only escapes, and the closing quote must end the value.
fn unquote(rest: &str) -> Result<String, KeyError> {
    let mut out = String::with_capacity(rest.len());
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped @ ('"' | '\\')) => out.push(escaped),
                _ => return Err(KeyError::BadQuoting),
            },
            '"' if chars.as_str().is_empty() => return Ok(out),
            '"' => return Err(KeyError::BadQuoting),
            c => out.push(c),
        }
    }
    Err(KeyError::BadQuoting)
}

/// Why a header value is not a key. Each variant is a 400 with a message the client can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the Idempotency-Key is empty")]
    Empty,
    #[error("the Idempotency-Key is {0} characters long; at most 255 are allowed")]
    TooLong(usize),
    #[error(
        "the Idempotency-Key may contain only visible ASCII characters (no spaces or control characters)"
    )]
    NotVisibleAscii,
    #[error("the Idempotency-Key starts with a quote but is not a valid structured-field string")]
    BadQuoting,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_token_is_a_key() {
        assert_eq!(
            IdempotencyKey::parse("order-42").map(|k| k.0),
            Ok("order-42".into())
        );
    }

    #[test]
    fn a_structured_field_string_is_unquoted() {
        assert_eq!(
            IdempotencyKey::parse("\"order-42\"").map(|k| k.0),
            Ok("order-42".into())
        );
        assert_eq!(
            IdempotencyKey::parse(r#""a\"b""#).map(|k| k.0),
            Ok("a\"b".into())
        );
        assert_eq!(
            IdempotencyKey::parse(r#""a\\b""#).map(|k| k.0),
            Ok("a\\b".into())
        );
    }

    #[test]
    fn quoted_and_bare_forms_are_the_same_key() {
        assert_eq!(IdempotencyKey::parse("\"k1\""), IdempotencyKey::parse("k1"));
    }

    #[test]
    fn empty_keys_are_rejected_quoted_or_not() {
        assert_eq!(IdempotencyKey::parse(""), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse("\"\""), Err(KeyError::Empty));
    }

    #[test]
    fn length_is_limited_to_255() {
        assert!(IdempotencyKey::parse(&"k".repeat(255)).is_ok());
        assert_eq!(
            IdempotencyKey::parse(&"k".repeat(256)),
            Err(KeyError::TooLong(256))
        );
        let quoted = format!("\"{}\"", "k".repeat(256));
        assert_eq!(IdempotencyKey::parse(&quoted), Err(KeyError::TooLong(256)));
    }

    #[test]
    fn spaces_controls_and_non_ascii_are_rejected() {
        for raw in ["   ", "a b", "a\tb", "a\nb", "a\u{7f}b", "clé", "\"a b\""] {
            assert_eq!(
                IdempotencyKey::parse(raw),
                Err(KeyError::NotVisibleAscii),
                "{raw:?}"
            );
        }
    }

    #[test]
    fn broken_quoting_is_rejected() {
        for raw in ["\"abc", "\"a\"b\"", r#""a\nb""#, "\""] {
            assert_eq!(
                IdempotencyKey::parse(raw),
                Err(KeyError::BadQuoting),
                "{raw:?}"
            );
        }
    }

    #[test]
    fn a_quote_inside_a_bare_token_is_just_a_character() {
        assert_eq!(
            IdempotencyKey::parse("a\"b").map(|k| k.0),
            Ok("a\"b".into())
        );
    }
}
