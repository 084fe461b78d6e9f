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
use crate::intake::{IntakeLimits, Rejection};
use crate::kinds::etl::transform::{
    self, Cast, OutputBudget, Transform, MAX_DEFAULTS_BYTES, MAX_SPEC_FIELDS,
};
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

/// What a request with a member v1 does not define is told (the member itself is not named: a
/// response never echoes what the client sent).
const UNKNOWN_MEMBER: &str = "The request has a member v1 does not define; it may have only \
     dataset, key, records, transform, run_at and replaces";

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
        // The member's name is the client's and is never echoed: the pointer is the document.
        return Err(Rejection::new(Code::RequestInvalid, "").because(UNKNOWN_MEMBER));
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
    crate::names::is_identifier(name, &[])
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
mod tests;
