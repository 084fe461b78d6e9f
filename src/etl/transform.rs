//! The declarative record transform: defaults, rename, cast, required, select, in that order.
//!
//! Invariants this module keeps:
//! - A transform is pure: the same record and spec always give the same output, so re-running a
//!   job loads the same data (and the same checksum).
//! - A failure names nothing but the fact: the caller reports the record's index, never a value.
//! - Decimals are carried as canonical strings, never floats, so no precision is lost; timestamps
//!   are normalized to canonical UTC.

use crate::etl::request::canonical_utc;
use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// A cast target type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cast {
    /// A JSON string (numbers and booleans are rendered as text).
    String,
    /// A 64-bit integer (from an integral number or its decimal text).
    Integer,
    /// A decimal, kept as canonical text (`-12.50` stays `-12.50`; `007` becomes `7`).
    Decimal,
    /// A boolean (from `true`/`false` in any case, or 0/1).
    Boolean,
    /// An RFC 3339 instant, normalized to canonical UTC text.
    Timestamp,
}

impl Cast {
    /// The cast named `name`, if any.
    pub fn parse(name: &str) -> Option<Cast> {
        Some(match name {
            "string" => Cast::String,
            "integer" => Cast::Integer,
            "decimal" => Cast::Decimal,
            "boolean" => Cast::Boolean,
            "timestamp" => Cast::Timestamp,
            _ => return None,
        })
    }

    /// The name of this cast.
    pub fn name(self) -> &'static str {
        match self {
            Cast::String => "string",
            Cast::Integer => "integer",
            Cast::Decimal => "decimal",
            Cast::Boolean => "boolean",
            Cast::Timestamp => "timestamp",
        }
    }

    /// Casts `value`; `None` if it cannot be. `null` stays `null` (absence is `required`'s job).
    pub fn apply(self, value: &Value) -> Option<Value> {
        if value.is_null() {
            return Some(Value::Null);
        }
        match self {
            Cast::String => match value {
                Value::String(s) => Some(Value::String(s.clone())),
                Value::Number(n) => Some(Value::String(n.to_string())),
                Value::Bool(b) => Some(Value::String(b.to_string())),
                _ => None,
            },
            Cast::Integer => match value {
                Value::Number(n) => n.as_i64().map(Value::from),
                Value::String(s) => s.trim().parse::<i64>().ok().map(Value::from),
                _ => None,
            },
            Cast::Decimal => {
                let text = match value {
                    Value::Number(n) => n.to_string(),
                    Value::String(s) => s.trim().to_owned(),
                    _ => return None,
                };
                canonical_decimal(&text).map(Value::String)
            }
            Cast::Boolean => match value {
                Value::Bool(b) => Some(Value::Bool(*b)),
                Value::String(s) if s.eq_ignore_ascii_case("true") => Some(Value::Bool(true)),
                Value::String(s) if s.eq_ignore_ascii_case("false") => Some(Value::Bool(false)),
                Value::Number(n) => match n.as_i64() {
                    Some(0) => Some(Value::Bool(false)),
                    Some(1) => Some(Value::Bool(true)),
                    _ => None,
                },
                _ => None,
            },
            Cast::Timestamp => value
                .as_str()
                .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
                .map(|t| Value::String(canonical_utc(t.with_timezone(&Utc)))),
        }
    }
}

/// `text` as a canonical decimal (`[-]digits[.digits]`, no leading zeros, no `+`), if it is one.
fn canonical_decimal(text: &str) -> Option<String> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, fraction) = match digits.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (digits, None),
    };
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(whole) || fraction.is_some_and(|f| !all_digits(f)) {
        return None;
    }
    let whole = whole.trim_start_matches('0');
    let whole = if whole.is_empty() { "0" } else { whole };
    let mut out = String::new();
    let zero = whole == "0" && fraction.is_none_or(|f| f.bytes().all(|b| b == b'0'));
    if negative && !zero {
        out.push('-');
    }
    out.push_str(whole);
    if let Some(f) = fraction {
        out.push('.');
        out.push_str(f);
    }
    Some(out)
}

/// A validated transform spec.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Transform {
    /// Keep only these fields (after rename), if set.
    pub select: Option<Vec<String>>,
    /// Rename fields: old name → new name.
    pub rename: BTreeMap<String, String>,
    /// Cast fields (by their name after rename).
    pub cast: BTreeMap<String, Cast>,
    /// Fields that must be present and not null (after rename and cast).
    pub required: Vec<String>,
    /// Values for fields that are absent (applied first, by original name).
    pub defaults: BTreeMap<String, Value>,
}

impl Transform {
    /// Applies the transform to one record; `None` if a cast fails or a required field is missing.
    pub fn apply(&self, record: &Map<String, Value>) -> Option<Map<String, Value>> {
        let mut out = record.clone();
        for (field, value) in &self.defaults {
            out.entry(field.clone()).or_insert_with(|| value.clone());
        }
        for (from, to) in &self.rename {
            if let Some(value) = out.remove(from) {
                out.insert(to.clone(), value);
            }
        }
        for (field, cast) in &self.cast {
            if let Some(value) = out.get_mut(field) {
                *value = cast.apply(value)?;
            }
        }
        if self
            .required
            .iter()
            .any(|f| out.get(f).is_none_or(Value::is_null))
        {
            return None;
        }
        if let Some(keep) = &self.select {
            out.retain(|field, _| keep.contains(field));
        }
        Some(out)
    }

    /// The spec as a JSON document (the normalized form stored with the job).
    pub fn to_value(&self) -> Value {
        let mut doc = Map::new();
        if let Some(select) = &self.select {
            doc.insert("select".into(), Value::from(select.clone()));
        }
        if !self.rename.is_empty() {
            let rename = self
                .rename
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())));
            doc.insert("rename".into(), Value::Object(rename.collect()));
        }
        if !self.cast.is_empty() {
            let cast = self
                .cast
                .iter()
                .map(|(k, c)| (k.clone(), Value::String(c.name().to_owned())));
            doc.insert("cast".into(), Value::Object(cast.collect()));
        }
        if !self.required.is_empty() {
            doc.insert("required".into(), Value::from(self.required.clone()));
        }
        if !self.defaults.is_empty() {
            let defaults = self.defaults.iter().map(|(k, v)| (k.clone(), v.clone()));
            doc.insert("defaults".into(), Value::Object(defaults.collect()));
        }
        Value::Object(doc)
    }
}

#[cfg(test)]
mod tests {
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
            required: vec!["id".into(), "total".into()],
            select: Some(vec!["id".into(), "total".into(), "qty".into()]),
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
}
