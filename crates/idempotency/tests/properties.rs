//! Properties of the pure protocol, checked on generated inputs (a bounded number of cases,
//! so they run in every test run): key parsing never panics and is stable, canonical JSON is a
//! fixed point, and the fingerprint ignores key order and whitespace but nothing else.

use payments_idempotency::{Fingerprint, IdempotencyKey, canonical_json};
use proptest::prelude::*;
use serde_json::{Map, Value};

/// Arbitrary JSON, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-1.0e12f64..1.0e12).prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Writes JSON with object members in reverse order and generous whitespace: the same value,
/// other bytes.
fn scrambled(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let members: Vec<String> = map
                .iter()
                .rev()
                .map(|(k, v)| format!("\n  {} :  {}", Value::String(k.clone()), scrambled(v)))
                .collect();
            format!("{{ {} }}", members.join(" ,"))
        }
        Value::Array(items) => format!(
            "[ {} ]",
            items.iter().map(scrambled).collect::<Vec<_>>().join(" , ")
        ),
        other => other.to_string(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn key_parsing_never_panics_and_accepts_only_visible_ascii(raw in ".{0,300}") {
        if let Ok(key) = IdempotencyKey::parse(&raw) {
            let text = key.as_str();
            prop_assert!((1..=255).contains(&text.len()));
            prop_assert!(text.bytes().all(|b| b.is_ascii_graphic()));
        }
    }

    #[test]
    fn a_valid_key_parses_to_itself_bare_and_quoted(key in "[!#-\\[\\]-~]{1,255}") {
        // (The class is visible ASCII without `"` and `\`, which would need escaping.)
        let parsed = IdempotencyKey::parse(&key);
        prop_assert_eq!(parsed.as_ref().map(IdempotencyKey::as_str), Ok(key.as_str()));
        prop_assert_eq!(IdempotencyKey::parse(&format!("\"{key}\"")), parsed);
    }

    #[test]
    fn canonical_json_is_a_fixed_point(value in json_value()) {
        let once = canonical_json(&value);
        let reparsed: Value = serde_json::from_str(&once).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(canonical_json(&reparsed), once);
    }

    #[test]
    fn the_fingerprint_ignores_member_order_and_whitespace(value in json_value()) {
        let other: Value = serde_json::from_str(&scrambled(&value)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(
            Fingerprint::of_json_request("POST", "/charges", &value),
            Fingerprint::of_json_request("POST", "/charges", &other)
        );
    }

    #[test]
    fn different_values_have_different_fingerprints(a in json_value(), b in json_value()) {
        prop_assume!(a != b);
        prop_assert_ne!(
            Fingerprint::of_json_request("POST", "/charges", &a),
            Fingerprint::of_json_request("POST", "/charges", &b)
        );
    }
}
