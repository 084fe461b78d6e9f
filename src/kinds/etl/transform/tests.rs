//! Unit tests of the transform specification and its application to records.

use super::*;
use serde_json::json;

/// The record `value` as a map.
fn record(value: Value) -> Map<String, Value> {
    value.as_object().unwrap().clone()
}

#[test]
fn string_casts() {
    assert_eq!(Cast::String.apply(&json!("a")), Some(json!("a")));
    assert_eq!(Cast::String.apply(&json!(12)), Some(json!("12")));
    assert_eq!(Cast::String.apply(&json!(1.5)), Some(json!("1.5")));
    assert_eq!(Cast::String.apply(&json!(true)), Some(json!("true")));
    assert_eq!(Cast::String.apply(&json!([1])), None);
    assert_eq!(Cast::String.apply(&json!(null)), Some(json!(null)));
}

#[test]
fn integer_casts() {
    assert_eq!(Cast::Integer.apply(&json!(7)), Some(json!(7)));
    assert_eq!(Cast::Integer.apply(&json!(" -42 ")), Some(json!(-42)));
    assert_eq!(Cast::Integer.apply(&json!(1.5)), None);
    assert_eq!(Cast::Integer.apply(&json!("1.5")), None);
    assert_eq!(Cast::Integer.apply(&json!(true)), None);
}

#[test]
fn decimal_casts_keep_canonical_text() {
    assert_eq!(
        Cast::Decimal.apply(&json!("-0012.50")),
        Some(json!("-12.50"))
    );
    assert_eq!(Cast::Decimal.apply(&json!(3)), Some(json!("3")));
    assert_eq!(Cast::Decimal.apply(&json!(2.25)), Some(json!("2.25")));
    assert_eq!(Cast::Decimal.apply(&json!("-0.00")), Some(json!("0.00")));
    assert_eq!(Cast::Decimal.apply(&json!("000")), Some(json!("0")));
    for bad in [
        json!("1e5"),
        json!("1."),
        json!(".5"),
        json!("+1"),
        json!("abc"),
        json!(false),
    ] {
        assert_eq!(Cast::Decimal.apply(&bad), None, "{bad}");
    }
}

#[test]
fn boolean_casts() {
    assert_eq!(Cast::Boolean.apply(&json!(true)), Some(json!(true)));
    assert_eq!(Cast::Boolean.apply(&json!("TRUE")), Some(json!(true)));
    assert_eq!(Cast::Boolean.apply(&json!("false")), Some(json!(false)));
    assert_eq!(Cast::Boolean.apply(&json!(0)), Some(json!(false)));
    assert_eq!(Cast::Boolean.apply(&json!(1)), Some(json!(true)));
    assert_eq!(Cast::Boolean.apply(&json!(2)), None);
    assert_eq!(Cast::Boolean.apply(&json!("yes")), None);
    assert_eq!(Cast::Boolean.apply(&json!({})), None);
}

#[test]
fn timestamp_casts_normalize_to_utc() {
    assert_eq!(
        Cast::Timestamp.apply(&json!("2026-05-01T12:00:00+02:00")),
        Some(json!("2026-05-01T10:00:00Z"))
    );
    assert_eq!(Cast::Timestamp.apply(&json!("2026-05-01")), None);
    assert_eq!(Cast::Timestamp.apply(&json!(5)), None);
}

#[test]
fn cast_names_round_trip() {
    for cast in [
        Cast::String,
        Cast::Integer,
        Cast::Decimal,
        Cast::Boolean,
        Cast::Timestamp,
    ] {
        assert_eq!(Cast::parse(cast.name()), Some(cast));
    }
    assert_eq!(Cast::parse("money"), None);
}

#[test]
fn the_steps_apply_in_order() {
    let transform = Transform {
        defaults: [("qty".to_owned(), json!("1"))].into(),
        rename: [
            ("amount".to_owned(), "total".to_owned()),
            ("gone".to_owned(), "x".to_owned()),
        ]
        .into(),
        cast: [
            ("total".to_owned(), Cast::Decimal),
            ("qty".to_owned(), Cast::Integer),
        ]
        .into(),
        required: ["id".to_owned(), "total".to_owned()].into(),
        select: Some(["id".to_owned(), "total".to_owned(), "qty".to_owned()].into()),
    };
    let out = transform
        .apply(&record(json!({"id": "a", "amount": "010.5", "noise": 1})))
        .unwrap();
    assert_eq!(
        Value::Object(out),
        json!({"id": "a", "total": "10.5", "qty": 1})
    );
    assert_eq!(
        transform.apply(&record(json!({"id": "a"}))),
        None,
        "required total missing"
    );
    assert_eq!(
        transform.apply(&record(json!({"id": "a", "amount": "x"}))),
        None,
        "bad cast"
    );
    assert_eq!(
        transform.apply(&record(json!({"id": null, "amount": "1"}))),
        None,
        "required but null"
    );
    assert_eq!(
        Transform::default().apply(&record(json!({"a": 1}))),
        Some(record(json!({"a": 1})))
    );
}

/// A number exactly as JSON text gives it (not through `json!`, which goes through `f64`).
fn number(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

#[test]
fn numbers_cast_exactly() {
    let cases = [
        (
            "12345678901234567.89",
            Cast::Decimal,
            Some(json!("12345678901234567.89")),
        ),
        ("1e21", Cast::Decimal, Some(json!("1000000000000000000000"))),
        ("1e-7", Cast::Decimal, Some(json!("0.0000001"))),
        ("1.50", Cast::Decimal, Some(json!("1.50"))),
        ("1.0", Cast::Integer, Some(json!(1))),
        ("1e2", Cast::Integer, Some(json!(100))),
        ("1.5e1", Cast::Integer, Some(json!(15))),
        ("1.5", Cast::Integer, None),
        ("1e19", Cast::Integer, None),
        ("1e400", Cast::Decimal, None),
        (
            "123456789012345678901234567890",
            Cast::String,
            Some(json!("123456789012345678901234567890")),
        ),
    ];
    for (text, cast, expected) in cases {
        assert_eq!(
            cast.apply(&number(text)),
            expected,
            "{text} as {}",
            cast.name()
        );
    }
}

/// A transform that only renames, by `(from, to)` pairs.
fn renaming(pairs: &[(&str, &str)]) -> Transform {
    Transform {
        rename: pairs
            .iter()
            .map(|(from, to)| ((*from).to_owned(), (*to).to_owned()))
            .collect(),
        ..Transform::default()
    }
}

#[test]
fn rename_moves_every_field_at_once() {
    assert_eq!(
        renaming(&[("a", "b"), ("b", "a")]).apply(&record(json!({"a": 1, "b": 2}))),
        Some(record(json!({"a": 2, "b": 1})))
    );
    assert_eq!(
        renaming(&[("a", "b"), ("b", "c")]).apply(&record(json!({"a": 1, "b": 2}))),
        Some(record(json!({"b": 1, "c": 2})))
    );
    let onto_kept = renaming(&[("a", "b")]);
    assert_eq!(
        onto_kept.apply(&record(json!({"a": 1, "b": 2}))),
        None,
        "a rename onto a field the record keeps would lose it"
    );
    assert_eq!(
        onto_kept.apply(&record(json!({"a": 1}))),
        Some(record(json!({"b": 1})))
    );
    let coalesce = renaming(&[("amount", "total"), ("amt", "total")]);
    assert_eq!(
        coalesce.apply(&record(json!({"amt": 1}))),
        Some(record(json!({"total": 1})))
    );
    assert_eq!(
        coalesce.apply(&record(json!({"amount": 1, "amt": 2}))),
        None,
        "two fields renamed onto one name would lose one of them"
    );
    let onto_default = Transform {
        defaults: [("b".to_owned(), json!(0))].into(),
        ..onto_kept
    };
    assert_eq!(
        onto_default.apply(&record(json!({"a": 1}))),
        Some(record(json!({"b": 1}))),
        "the renamed value replaces the default"
    );
    assert_eq!(
        onto_default.apply(&record(json!({}))),
        Some(record(json!({"b": 0})))
    );
}
