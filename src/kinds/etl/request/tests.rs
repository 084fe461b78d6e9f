//! Unit tests of request parsing, normalization and intake limits.

use super::*;
use serde_json::json;

/// The code and pointer `value` is rejected with.
fn rejected(value: Value) -> (Code, String) {
    let r = parse(&value, IntakeLimits::default()).unwrap_err();
    (r.code, r.pointer)
}

/// A minimal valid request with `extra` members merged in.
fn request(extra: Value) -> Value {
    let mut base = json!({"dataset": "orders", "key": "id", "records": [{"id": 1}]});
    for (k, v) in extra.as_object().unwrap() {
        base[k] = v.clone();
    }
    base
}

#[test]
fn a_minimal_request_parses() {
    let parsed = parse(&request(json!({})), IntakeLimits::default()).unwrap();
    assert_eq!(parsed.dataset, "orders");
    assert_eq!(parsed.records.len(), 1);
    assert_eq!(parsed.run_at, None);
    assert_eq!(parsed.transform, Transform::default());
}

#[test]
fn every_intake_code_names_its_pointer_not_its_value() {
    let cases = [
        (json!([1, 2]), Code::RequestInvalid, ""),
        (
            request(json!({"extra": "canary"})),
            Code::RequestInvalid,
            "",
        ),
        (
            request(json!({"dataset": "Orders"})),
            Code::DatasetInvalid,
            "/dataset",
        ),
        (
            request(json!({"dataset": "9orders"})),
            Code::DatasetInvalid,
            "/dataset",
        ),
        // A kind's name may have a `.`; a dataset's name may not.
        (
            request(json!({"dataset": "orders.v2"})),
            Code::DatasetInvalid,
            "/dataset",
        ),
        (
            request(json!({"dataset": "a".repeat(64)})),
            Code::DatasetInvalid,
            "/dataset",
        ),
        (
            request(json!({"dataset": 5})),
            Code::DatasetInvalid,
            "/dataset",
        ),
        (request(json!({"key": ""})), Code::KeyInvalid, "/key"),
        (
            request(json!({"key": "k".repeat(129)})),
            Code::KeyInvalid,
            "/key",
        ),
        (
            request(json!({"records": {}})),
            Code::RecordsInvalid,
            "/records",
        ),
        (
            request(json!({"records": [{}, 3]})),
            Code::RecordsInvalid,
            "/records/1",
        ),
        (
            request(json!({"transform": []})),
            Code::TransformInvalid,
            "/transform",
        ),
        (
            request(json!({"transform": {"explode": 1}})),
            Code::TransformInvalid,
            "/transform",
        ),
        (
            request(json!({"transform": {"select": "a"}})),
            Code::TransformInvalid,
            "/transform/select",
        ),
        (
            request(json!({"transform": {"required": [1]}})),
            Code::TransformInvalid,
            "/transform/required",
        ),
        (
            request(json!({"transform": {"rename": {"a": 1}}})),
            Code::TransformInvalid,
            "/transform/rename",
        ),
        (
            request(json!({"transform": {"cast": {"a": "money"}}})),
            Code::TransformInvalid,
            "/transform/cast",
        ),
        (
            request(json!({"transform": {"cast": []}})),
            Code::TransformInvalid,
            "/transform/cast",
        ),
        (
            request(json!({"transform": {"defaults": 1}})),
            Code::TransformInvalid,
            "/transform/defaults",
        ),
        (
            request(json!({"run_at": "tomorrow"})),
            Code::RunAtInvalid,
            "/run_at",
        ),
        (
            request(json!({"run_at": 1700000000})),
            Code::RunAtInvalid,
            "/run_at",
        ),
    ];
    for (value, code, ptr) in cases {
        assert_eq!(rejected(value.clone()), (code, ptr.to_owned()), "{value}");
    }
}

#[test]
fn size_limits_are_enforced_before_and_after_parsing() {
    let limits = IntakeLimits {
        max_records: 2,
        max_bytes: 64,
    };
    let three =
        serde_json::to_vec(&json!({"dataset": "d", "key": "k", "records": [{}, {}, {}]})).unwrap();
    assert_eq!(
        parse_bytes(&three, limits).unwrap_err().code,
        Code::TooManyRecords
    );
    let big = vec![b' '; 65];
    assert_eq!(
        parse_bytes(&big, limits).unwrap_err().code,
        Code::RequestTooLarge
    );
    assert_eq!(
        parse_bytes(b"{not json", limits).unwrap_err().code,
        Code::RequestMalformed
    );
    let two =
        serde_json::to_vec(&json!({"dataset": "d", "key": "k", "records": [{}, {}]})).unwrap();
    assert!(parse_bytes(&two, limits).is_ok());
}

#[test]
fn run_at_is_normalized_to_canonical_utc() {
    let parsed = parse(
        &request(json!({"run_at": "2026-03-01T10:00:00.5+02:00", "transform": null})),
        IntakeLimits::default(),
    )
    .unwrap();
    let doc = parsed.to_value();
    assert_eq!(doc["run_at"], "2026-03-01T08:00:00.500Z");
    assert_eq!(
        canonical_utc(parsed.run_at.unwrap()),
        "2026-03-01T08:00:00.500Z"
    );
    let whole = parse(
        &request(json!({"run_at": "2026-03-01T10:00:00-01:00"})),
        IntakeLimits::default(),
    )
    .unwrap();
    assert_eq!(whole.to_value()["run_at"], "2026-03-01T11:00:00Z");
}

#[test]
fn a_full_transform_round_trips_through_the_normalized_document() {
    let spec = json!({
        "select": ["id", "total"], "required": ["id"], "rename": {"amount": "total"},
        "cast": {"total": "decimal"}, "defaults": {"total": "0"}
    });
    let parsed = parse(
        &request(json!({"transform": spec})),
        IntakeLimits::default(),
    )
    .unwrap();
    let again = parse(&parsed.to_value(), IntakeLimits::default()).unwrap();
    assert_eq!(again, parsed);
}

/// `n` records, each `{"id": i}`.
fn numbered(n: usize) -> Value {
    Value::Array((0..n).map(|i| json!({ "id": i })).collect())
}

/// A `defaults` object of `n` short fields.
fn defaults(n: usize) -> Value {
    Value::Object(
        (0..n)
            .map(|i| (format!("f{i}"), json!("0123456789")))
            .collect(),
    )
}

#[test]
fn the_transform_spec_and_its_output_are_bounded() {
    let amplifier =
        request(json!({"records": numbered(2_000), "transform": {"defaults": defaults(1_000)}}));
    assert_eq!(
        rejected(amplifier),
        (Code::TransformTooLarge, "/transform/defaults".to_owned())
    );
    let wide =
        request(json!({"records": numbered(2_000), "transform": {"defaults": defaults(200)}}));
    assert_eq!(
        rejected(wide),
        (Code::OutputTooLarge, "/records".to_owned())
    );
    let long_select: Vec<String> = (0..1_000).map(|i| format!("f{i}")).collect();
    assert_eq!(
        rejected(request(json!({"transform": {"select": long_select}}))),
        (Code::TransformTooLarge, "/transform/select".to_owned())
    );
    // Dropped again by `select`, a large default still costs a copy per record.
    let dropped = request(json!({"records": numbered(1_200), "transform": {
        "defaults": {"pad": "x".repeat(60_000)}, "select": ["id"]}}));
    assert_eq!(
        rejected(dropped),
        (Code::OutputTooLarge, "/records".to_owned())
    );
    let fits =
        request(json!({"records": numbered(2_000), "transform": {"defaults": defaults(50)}}));
    assert!(parse(&fits, IntakeLimits::default()).is_ok());
}

#[test]
fn numbers_are_kept_as_postgresql_stores_them_or_refused() {
    let doc: Value = serde_json::from_str(
        r#"{"dataset": "d", "key": "id", "records": [{"id": 1, "a": 1e2, "b": 1.50, "c": 12345678901234567.89}],
            "transform": {"defaults": {"z": 1e-2}}}"#,
    )
    .unwrap();
    let normalized = parse(&doc, IntakeLimits::default())
        .unwrap()
        .to_value()
        .to_string();
    assert!(
        normalized.contains(r#"{"a":100,"b":1.50,"c":12345678901234567.89,"id":1}"#),
        "{normalized}"
    );
    assert!(
        normalized.contains(r#""defaults":{"z":0.01}"#),
        "{normalized}"
    );
    let huge: Value = serde_json::from_str(
        r#"{"dataset": "d", "key": "id", "records": [{"id": 1}, {"id": [1e131071]}]}"#,
    )
    .unwrap();
    assert_eq!(
        rejected(huge),
        (Code::NumberOutOfRange, "/records/1".to_owned())
    );
    let huge_default: Value = serde_json::from_str(
        r#"{"dataset": "d", "key": "id", "records": [], "transform": {"defaults": {"z": 1e-999}}}"#,
    )
    .unwrap();
    assert_eq!(
        rejected(huge_default),
        (Code::NumberOutOfRange, "/transform/defaults".to_owned())
    );
}
