//! Micro-benchmarks of the pure protocol on the request path: parsing a key, and canonical
//! JSON plus SHA-256 for a 1 KiB and a 16 KiB body. `cargo bench -p payments-idempotency`.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use payments_idempotency::{Fingerprint, IdempotencyKey, canonical_json};
use serde_json::{Value, json};

/// A charge-like body padded with metadata to about `bytes` bytes of JSON.
fn body_of_about(bytes: usize) -> Value {
    let mut metadata = serde_json::Map::new();
    let mut i = 0;
    while serde_json::to_vec(&metadata).map_or(0, |v| v.len()) < bytes.saturating_sub(80) {
        metadata.insert(
            format!("field_{i:04}"),
            json!(format!("value number {i} of the padding")),
        );
        i += 1;
    }
    json!({ "amount": 1999, "currency": "usd", "source": "tok_visa", "metadata": metadata })
}

fn key_parsing(c: &mut Criterion) {
    c.bench_function("key/parse bare (36 chars)", |b| {
        b.iter(|| IdempotencyKey::parse(black_box("5f0c6a3e-8a43-4f63-9a2b-2f1ad0f0c2a1")))
    });
    c.bench_function("key/parse quoted (36 chars)", |b| {
        b.iter(|| IdempotencyKey::parse(black_box("\"5f0c6a3e-8a43-4f63-9a2b-2f1ad0f0c2a1\"")))
    });
}

fn fingerprints(c: &mut Criterion) {
    let mut group = c.benchmark_group("fingerprint");
    for (name, size) in [("1KiB", 1024), ("16KiB", 16 * 1024)] {
        let raw = serde_json::to_vec(&body_of_about(size)).unwrap_or_default();
        group.throughput(Throughput::Bytes(raw.len() as u64));
        // What the handler does: parse the bytes, canonicalise, hash.
        group.bench_function(format!("parse+canonical+sha256 {name}"), |b| {
            b.iter(|| {
                let value: Value = serde_json::from_slice(black_box(&raw)).unwrap_or(Value::Null);
                Fingerprint::of_json_request("POST", "/charges", &value)
            })
        });
        let value: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
        group.bench_function(format!("canonical only {name}"), |b| {
            b.iter(|| canonical_json(black_box(&value)))
        });
    }
    group.finish();
}

criterion_group!(benches, key_parsing, fingerprints);
criterion_main!(benches);
