//! The client's types and calls agree with the service's contract, `openapi.yaml`, so that the
//! two cannot drift apart: a property added, renamed, retyped or made optional on one side and
//! not the other fails here.
//!
//! For each schema, values are made from the schema itself: one with every property, one with
//! only the required ones (and `null` wherever null is allowed), and one for each value of each
//! enum. Each must read into the client's type and write back unchanged: a property the client
//! lacks is dropped, one it has that the schema lacks appears, one it requires that the schema
//! does not fails to read, and a type that differs fails either way.

use std::fmt::Debug;

use payments_client::types::{
    Balance, BalanceAmount, CancelRequest, CaptureRequest, Charge, ChargeRequest, Event, EventList,
    IdempotencyKeyRecord, Payout, PayoutRequest, Problem, Refund, RefundRequest,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

/// The contract, as JSON.
fn contract() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../openapi.yaml");
    let text = std::fs::read_to_string(path).expect("openapi.yaml at the repository's root");
    let documents = yaml_rust2::YamlLoader::load_from_str(&text).expect("openapi.yaml is YAML");
    json_of(&documents[0])
}

fn json_of(yaml: &yaml_rust2::Yaml) -> Value {
    use yaml_rust2::Yaml;
    match yaml {
        Yaml::Real(real) => json!(real.parse::<f64>().expect("a YAML real")),
        Yaml::Integer(integer) => json!(integer),
        Yaml::String(string) => json!(string),
        Yaml::Boolean(boolean) => json!(boolean),
        Yaml::Array(items) => Value::Array(items.iter().map(json_of).collect()),
        Yaml::Hash(hash) => Value::Object(
            hash.iter()
                .map(|(key, value)| {
                    let key = match key {
                        Yaml::String(key) => key.clone(),
                        Yaml::Integer(key) => key.to_string(),
                        other => panic!("a key that is not a string: {other:?}"),
                    };
                    (key, json_of(value))
                })
                .collect(),
        ),
        Yaml::Null => Value::Null,
        other => panic!("unexpected YAML: {other:?}"),
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Fill {
    /// Every property, and a value wherever `null` is also allowed.
    Every,
    /// Only the required properties, and `null` wherever it is allowed.
    Required,
}

struct Sampler<'a> {
    contract: &'a Value,
    fill: Fill,
    /// Which value of each enum: the `variant`-th, wrapping around.
    variant: usize,
}

impl Sampler<'_> {
    fn schema(&self, name: &str) -> &Value {
        let schema = &self.contract["components"]["schemas"][name];
        assert!(schema.is_object(), "openapi.yaml has no schema {name}");
        schema
    }

    fn sample(&self, schema: &Value) -> Value {
        if let Some(reference) = schema["$ref"].as_str() {
            let name = reference
                .strip_prefix("#/components/schemas/")
                .expect("a schema reference");
            return self.sample(self.schema(name));
        }
        if let Some(constant) = schema.get("const") {
            return constant.clone();
        }
        if let Some(values) = schema["enum"].as_array() {
            return values[self.variant % values.len()].clone();
        }
        if let Some(parts) = schema["allOf"].as_array() {
            // The first part is the schema; the contract's later parts only narrow its bounds.
            return self.sample(&parts[0]);
        }
        if let Some(options) = schema["oneOf"].as_array() {
            let is_null = |option: &&Value| option["type"] == "null";
            if self.fill == Fill::Required && options.iter().any(|o| is_null(&o)) {
                return Value::Null;
            }
            let option = options.iter().find(|o| !is_null(o)).expect("an option");
            return self.sample(option);
        }
        let types: Vec<&str> = match &schema["type"] {
            Value::String(single) => vec![single.as_str()],
            Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
            _ if schema.get("properties").is_some() => vec!["object"],
            other => panic!("a schema without a type: {other} in {schema}"),
        };
        if types.contains(&"null") && self.fill == Fill::Required {
            return Value::Null;
        }
        match types.iter().find(|kind| **kind != "null").copied() {
            Some("object") => self.object(schema),
            Some("array") => json!([self.sample(&schema["items"])]),
            Some("integer") => json!(schema["minimum"].as_i64().unwrap_or(1).max(1)),
            Some("boolean") => json!(self.variant.is_multiple_of(2)),
            Some("string") if schema["format"] == "date-time" => {
                json!("2026-12-01T12:00:00.000000Z")
            }
            Some("string") => schema["examples"][0].clone().as_str().map_or_else(
                || json!(format!("text-{}", self.variant)),
                |example| json!(example),
            ),
            other => panic!("no sample for type {other:?} in {schema}"),
        }
    }

    fn object(&self, schema: &Value) -> Value {
        let required: Vec<&str> = schema["required"]
            .as_array()
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut object = Map::new();
        if let Some(properties) = schema["properties"].as_object() {
            for (name, property) in properties {
                if self.fill == Fill::Every || required.contains(&name.as_str()) {
                    object.insert(name.clone(), self.sample(property));
                }
            }
        }
        Value::Object(object)
    }
}

/// Every sample of the schema `name` reads into `T` and writes back unchanged.
fn agrees<T: DeserializeOwned + Serialize + Debug>(contract: &Value, name: &str) {
    let schema = &contract["components"]["schemas"][name];
    assert!(schema.is_object(), "openapi.yaml has no schema {name}");
    agrees_with::<T>(contract, schema, name);
}

/// Every sample of `schema` (called `name`) reads into `T` and writes back unchanged.
fn agrees_with<T: DeserializeOwned + Serialize + Debug>(
    contract: &Value,
    schema: &Value,
    name: &str,
) {
    for fill in [Fill::Every, Fill::Required] {
        for variant in 0..40 {
            let sampler = Sampler {
                contract,
                fill,
                variant,
            };
            let sample = sampler.sample(schema);
            let value: T = serde_json::from_value(sample.clone()).unwrap_or_else(|error| {
                panic!("the client's {name} cannot read the contract's {sample}: {error}")
            });
            let written = serde_json::to_value(&value).expect("serialises");
            assert_eq!(
                written, sample,
                "the client's {name} does not write back what the contract's {name} holds"
            );
        }
    }
}

#[test]
fn every_type_the_client_reads_or_sends_is_its_schema_in_the_contract() {
    let contract = contract();
    agrees::<ChargeRequest>(&contract, "ChargeRequest");
    agrees::<Charge>(&contract, "Charge");
    agrees::<RefundRequest>(&contract, "RefundRequest");
    agrees::<Refund>(&contract, "Refund");
    agrees::<PayoutRequest>(&contract, "PayoutRequest");
    agrees::<Payout>(&contract, "Payout");
    agrees::<BalanceAmount>(&contract, "BalanceAmount");
    agrees::<Balance>(&contract, "Balance");
    agrees::<IdempotencyKeyRecord>(&contract, "IdempotencyKeyRecord");
    agrees::<Event>(&contract, "Event");
    agrees::<EventList>(&contract, "EventList");
    agrees::<Problem>(&contract, "Problem");
    // A capture's and a cancel's bodies are the contract's own, not named schemas.
    let body = |path: &str| {
        let body = &contract["paths"][path]["post"]["requestBody"];
        body["content"]["application/json"]["schema"].clone()
    };
    let capture = body("/charges/{id}/capture");
    agrees_with::<CaptureRequest>(&contract, &capture, "the capture's body");
    let cancel = body("/charges/{id}/cancel");
    agrees_with::<CancelRequest>(&contract, &cancel, "the cancel's body");
}

#[test]
fn every_call_the_client_makes_is_in_the_contract_with_its_types() {
    let contract = contract();
    // (method, path, request schema, success status, answer schema), as `src/client.rs` calls;
    // a body that is no named schema is checked in the test above.
    let calls = [
        ("post", "/charges", Some("ChargeRequest"), "201", "Charge"),
        (
            "post",
            "/charges/{id}/refunds",
            Some("RefundRequest"),
            "201",
            "Refund",
        ),
        ("post", "/charges/{id}/capture", None, "200", "Charge"),
        ("post", "/charges/{id}/cancel", None, "200", "Charge"),
        ("post", "/payouts", Some("PayoutRequest"), "201", "Payout"),
        ("get", "/charges/{id}", None, "200", "Charge"),
        ("get", "/balance", None, "200", "Balance"),
        (
            "get",
            "/idempotency-keys/{key}",
            None,
            "200",
            "IdempotencyKeyRecord",
        ),
        ("get", "/events", None, "200", "EventList"),
    ];
    let resolve = |value: &Value| match value["$ref"].as_str() {
        Some(reference) => {
            let name = reference.rsplit('/').next().expect("a reference");
            contract["components"]["responses"][name].clone()
        }
        None => value.clone(),
    };
    let schema_of = |content: &Value| {
        resolve(content)["content"]["application/json"]["schema"]["$ref"]
            .as_str()
            .and_then(|reference| reference.rsplit('/').next())
            .map(str::to_owned)
    };
    for (method, path, request, status, answer) in calls {
        let call = &contract["paths"][path][method];
        assert!(call.is_object(), "{method} {path} is not in the contract");
        assert_eq!(
            schema_of(&call["requestBody"]).as_deref(),
            request,
            "{method} {path}'s body"
        );
        assert_eq!(
            schema_of(&call["responses"][status]).as_deref(),
            Some(answer),
            "{method} {path}'s {status}"
        );
    }
}
