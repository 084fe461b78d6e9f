//! The ETL request (v1) and its intake validation.
//!
//! Invariants this module keeps:
//! - A request that passes [`parse`] is structurally valid: every later failure is about a record's
//!   data (found at execution, reported as `record_invalid` with the record's index).
//! - A rejection carries a stable [`Code`] and the JSON pointer of the offending member, never
//!   the offending value. Pointers are built only from names the schema defines and array
//!   indices: a member the client named (an unknown member, a field in `cast`) is pointed at
//!   through its parent, so no client-chosen text is ever echoed.
//! - `run_at` is normalized to canonical UTC and every number to the form PostgreSQL stores it in
//!   (`1e2` is `100`, never a float); the normalized request is what is stored and what the
//!   request fingerprint is computed over.
//! - Intake ([`parse`]) applies the configured [`IntakeLimits`] and the fixed bounds of the
//!   transform module (spec size, output size, number length); execution ([`parse_stored`])
//!   applies only the fixed bounds, so a request a replica's intake accepted under larger limits
//!   is never refused by another replica's execution.

use crate::codes::Code;
use crate::etl::transform::{
    self, Cast, OutputBudget, Transform, MAX_DEFAULTS_BYTES, MAX_SPEC_FIELDS,
};
use crate::intake::{IntakeLimits, Rejection};
use crate::time::canonical_utc;
use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};

/// A structurally valid ETL request.
#[derive(Debug, Clone, PartialEq)]
pub struct EtlRequest {
    /// The target dataset.
    pub dataset: String,
    /// The field whose value keys each record.
    pub key: String,
    /// The records to load.
    pub records: Vec<Map<String, Value>>,
    /// The transform applied to every record.
    pub transform: Transform,
    /// When the job becomes due (UTC); `None`, or an instant already past when it is enqueued,
    /// means now.
    pub run_at: Option<DateTime<Utc>>,
    /// The job this one replaces (cancelled atomically when this one is accepted).
    pub replaces: Option<uuid::Uuid>,
}

/// The members a v1 request may have.
const FIELDS: &[&str] = &[
    "dataset",
    "key",
    "records",
    "transform",
    "run_at",
    "replaces",
];

/// Parses and validates a request body.
///
/// # Errors
/// A [`Rejection`] naming the first problem found.
pub fn parse_bytes(body: &[u8], limits: IntakeLimits) -> Result<EtlRequest, Rejection> {
    if body.len() > limits.max_bytes {
        return Err(Rejection::new(Code::RequestTooLarge, ""));
    }
    let value: Value =
        serde_json::from_slice(body).map_err(|_| Rejection::new(Code::RequestMalformed, ""))?;
    parse(&value, limits)
}

/// Validates a request document at intake: its structure, the configured `limits`, and the
/// fixed bounds (numbers that cannot be kept exactly, a transform spec or output too large).
/// Numbers are normalized as PostgreSQL stores them.
///
/// # Errors
/// A [`Rejection`] naming the first problem found.
pub fn parse(value: &Value, limits: IntakeLimits) -> Result<EtlRequest, Rejection> {
    let mut request = parse_document(value, Some(limits))?;
    for (i, record) in request.records.iter_mut().enumerate() {
        for field in record.values_mut() {
            if !transform::canonicalize_numbers(field) {
                return Err(Rejection::new(
                    Code::NumberOutOfRange,
                    format!("/records/{i}"),
                ));
            }
        }
    }
    for value in request.transform.defaults.values_mut() {
        if !transform::canonicalize_numbers(value) {
            return Err(Rejection::new(
                Code::NumberOutOfRange,
                "/transform/defaults",
            ));
        }
    }
    // The same charge, record by record, as execution makes: a request accepted here never
    // exceeds the budget there. Records after the first that fails its transform are never
    // transformed at execution, so they are not charged here either.
    let mut budget = OutputBudget::default();
    for record in &request.records {
        match request.transform.apply_within(record, &mut budget) {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(_) => return Err(Rejection::new(Code::OutputTooLarge, "/records")),
        }
    }
    Ok(request)
}

/// Validates a stored request (a job's payload) at execution: its structure and the fixed spec
/// bounds, but none of the intake limits, which another replica may have configured larger.
///
/// # Errors
/// A [`Rejection`] naming the first problem found.
pub fn parse_stored(value: &Value) -> Result<EtlRequest, Rejection> {
    parse_document(value, None)
}

/// Validates a request document's structure, and its record count against `limits` if given.
fn parse_document(value: &Value, limits: Option<IntakeLimits>) -> Result<EtlRequest, Rejection> {
    let doc = value
        .as_object()
        .ok_or_else(|| Rejection::new(Code::RequestInvalid, ""))?;
    if doc.keys().any(|k| !FIELDS.contains(&k.as_str())) {
        return Err(Rejection::new(Code::RequestInvalid, ""));
    }
    let dataset = doc
        .get("dataset")
        .and_then(Value::as_str)
        .filter(|d| valid_dataset(d))
        .ok_or_else(|| Rejection::new(Code::DatasetInvalid, "/dataset"))?;
    let key = doc
        .get("key")
        .and_then(Value::as_str)
        .filter(|k| valid_field(k))
        .ok_or_else(|| Rejection::new(Code::KeyInvalid, "/key"))?;
    let raw_records = doc
        .get("records")
        .and_then(Value::as_array)
        .ok_or_else(|| Rejection::new(Code::RecordsInvalid, "/records"))?;
    if limits.is_some_and(|l| raw_records.len() > l.max_records) {
        return Err(Rejection::new(Code::TooManyRecords, "/records"));
    }
    let records = raw_records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            r.as_object()
                .filter(|_| !has_nul(r))
                .cloned()
                .ok_or_else(|| Rejection::new(Code::RecordsInvalid, format!("/records/{i}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if has_nul(value) {
        return Err(Rejection::new(Code::RequestInvalid, ""));
    }
    let transform = match doc.get("transform") {
        None | Some(Value::Null) => Transform::default(),
        Some(spec) => parse_transform(spec)?,
    };
    let run_at = match doc.get("run_at") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_str()
                .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
                .map(|t| t.with_timezone(&Utc))
                .ok_or_else(|| Rejection::new(Code::RunAtInvalid, "/run_at"))?,
        ),
    };
    let replaces = match doc.get("replaces") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_str()
                .and_then(|s| uuid::Uuid::parse_str(s).ok())
                .ok_or_else(|| Rejection::new(Code::ReplacesInvalid, "/replaces"))?,
        ),
    };
    Ok(EtlRequest {
        dataset: dataset.to_owned(),
        key: key.to_owned(),
        records,
        transform,
        run_at,
        replaces,
    })
}

/// Whether any string or member name in `value` contains U+0000, which PostgreSQL's `jsonb`
/// cannot store.
fn has_nul(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(has_nul),
        Value::Object(members) => members.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

/// Whether `name` is a dataset name: `[a-z][a-z0-9_]{0,62}`.
pub fn valid_dataset(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('a'..='z'))
        && name.len() <= 63
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
}

/// Whether `name` is a usable field name: 1 to 128 characters.
fn valid_field(name: &str) -> bool {
    (1..=128).contains(&name.chars().count())
}

/// A JSON pointer from reference tokens (schema-defined names only, which need no escaping).
fn pointer(tokens: &[&str]) -> String {
    tokens.iter().map(|t| format!("/{t}")).collect()
}

/// The members a transform spec may have.
const FIELDS_OF_TRANSFORM: &[&str] = &["select", "required", "rename", "cast", "defaults"];

/// Parses the `transform` member.
fn parse_transform(spec: &Value) -> Result<Transform, Rejection> {
    let invalid = |tokens: &[&str]| {
        let mut all = vec!["transform"];
        all.extend_from_slice(tokens);
        Rejection::new(Code::TransformInvalid, pointer(&all))
    };
    let spec = spec.as_object().ok_or_else(|| invalid(&[]))?;
    let mut transform = Transform::default();
    for (member, value) in spec {
        let named = match value {
            Value::Array(items) => items.len(),
            Value::Object(members) => members.len(),
            _ => 0,
        };
        let too_large = named > MAX_SPEC_FIELDS
            || (member == "defaults" && transform::json_len(value) > MAX_DEFAULTS_BYTES);
        if too_large && FIELDS_OF_TRANSFORM.contains(&member.as_str()) {
            return Err(Rejection::new(
                Code::TransformTooLarge,
                pointer(&["transform", member]),
            ));
        }
        match member.as_str() {
            "select" | "required" => {
                let names = value
                    .as_array()
                    .ok_or_else(|| invalid(&[member]))?
                    .iter()
                    .map(|n| n.as_str().filter(|n| valid_field(n)).map(str::to_owned))
                    .collect::<Option<BTreeSet<_>>>()
                    .ok_or_else(|| invalid(&[member]))?;
                if member == "select" {
                    transform.select = Some(names);
                } else {
                    transform.required = names;
                }
            }
            "rename" => transform.rename = string_map(value).ok_or_else(|| invalid(&[member]))?,
            "cast" => {
                let casts = string_map(value).ok_or_else(|| invalid(&[member]))?;
                for (field, kind) in casts {
                    let cast = Cast::parse(&kind).ok_or_else(|| invalid(&[member]))?;
                    transform.cast.insert(field, cast);
                }
            }
            "defaults" => {
                let defaults = value.as_object().ok_or_else(|| invalid(&[member]))?;
                transform.defaults = defaults
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
            }
            _ => return Err(invalid(&[])),
        }
    }
    Ok(transform)
}

/// A JSON object whose values are all strings, as a sorted map; `None` otherwise.
fn string_map(value: &Value) -> Option<BTreeMap<String, String>> {
    value
        .as_object()?
        .iter()
        .map(|(k, v)| Some((k.clone(), v.as_str().filter(|s| valid_field(s))?.to_owned())))
        .collect()
}

impl EtlRequest {
    /// The normalized request document: what is stored as the job's payload and fingerprinted.
    /// `run_at` is rendered in canonical UTC (`…Z`); object keys are sorted.
    pub fn to_value(&self) -> Value {
        let mut doc = Map::new();
        doc.insert("dataset".into(), Value::String(self.dataset.clone()));
        doc.insert("key".into(), Value::String(self.key.clone()));
        doc.insert(
            "records".into(),
            Value::Array(self.records.iter().cloned().map(Value::Object).collect()),
        );
        doc.insert("transform".into(), self.transform.to_value());
        if let Some(run_at) = self.run_at {
            doc.insert("run_at".into(), Value::String(canonical_utc(run_at)));
        }
        if let Some(replaces) = self.replaces {
            doc.insert("replaces".into(), Value::String(replaces.to_string()));
        }
        Value::Object(doc)
    }
}

#[cfg(test)]
mod tests {
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
            serde_json::to_vec(&json!({"dataset": "d", "key": "k", "records": [{}, {}, {}]}))
                .unwrap();
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
        let amplifier = request(
            json!({"records": numbered(2_000), "transform": {"defaults": defaults(1_000)}}),
        );
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
}
