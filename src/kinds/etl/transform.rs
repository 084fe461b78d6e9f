//! The declarative record transform: defaults, rename, cast, required, select, in that order.
//!
//! Invariants this module keeps:
//! - A transform is pure: the same record and spec always give the same output, so re-running a
//!   job loads the same data (and the same checksum).
//! - A failure names nothing but the fact: the caller reports the record's index, never a value.
//! - Numbers are kept as their text, never floats, so no precision is lost: decimals are carried
//!   as canonical strings, and a number is only ever rewritten into the form PostgreSQL's
//!   `numeric` stores (`1e2` is `100`); timestamps are normalized to canonical UTC.
//! - `rename` moves every field at once, and never onto a field the record keeps or onto a name
//!   another of the record's fields lands on: such a record fails, no value is ever dropped.
//! - What a transform may produce is bounded ([`OutputBudget`]): intake refuses a request whose
//!   records would exceed it, and execution stops a plan the moment it does, so no request can
//!   make a replica allocate without bound.

use crate::time::canonical_utc;
use chrono::{DateTime, Utc};
use serde_json::{Map, Number, Value};
use std::collections::{BTreeMap, BTreeSet};

/// The most fields each of `select`, `required`, `rename`, `cast` and `defaults` may name.
pub const MAX_SPEC_FIELDS: usize = 256;
/// The most bytes `defaults` may hold, as JSON text.
pub const MAX_DEFAULTS_BYTES: usize = 64 * 1024;
/// The most fields the transformed records of one request may hold, all records together.
pub const MAX_OUTPUT_FIELDS: usize = 250_000;
/// The most bytes the transformed records of one request may hold, as JSON text, all together.
pub const MAX_OUTPUT_BYTES: usize = 8 * 1024 * 1024;
/// The most fields the records of one request may hold before `select` drops some, all records
/// together (what `defaults` added included).
pub const MAX_HANDLED_FIELDS: usize = 1_000_000;
/// The most bytes the records of one request may hold before `select` drops some, as JSON text,
/// all records together (what `defaults` added included).
pub const MAX_HANDLED_BYTES: usize = 64 * 1024 * 1024;
/// The most characters a number may take once its exponent is written out (`1e21` takes 22),
/// unless its own text is longer (a number written out in full is kept as it is): enough for
/// every number a 64-bit float can write (`5e-324` takes 326), which earlier releases accepted.
pub const MAX_NUMBER_CHARS: usize = 400;

/// A cast target type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cast {
    /// A JSON string (numbers and booleans are rendered as text).
    String,
    /// A 64-bit integer (from a number with no fractional part, `1.0` and `1e2` included, or
    /// from integer text such as `" -42 "`).
    Integer,
    /// A decimal, kept as canonical text (`-12.50` stays `-12.50`; `007` becomes `7`): from any
    /// number, written out exactly (`1e21`, `1e-7`), or from plain decimal text (no exponent).
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
                Value::Number(n) => {
                    let text = canonical_number(&n.to_string())?;
                    let (whole, fraction) = text.split_once('.').unwrap_or((&text, ""));
                    if !fraction.bytes().all(|b| b == b'0') {
                        return None;
                    }
                    whole.parse::<i64>().ok().map(Value::from)
                }
                Value::String(s) => s.trim().parse::<i64>().ok().map(Value::from),
                _ => None,
            },
            Cast::Decimal => {
                let text = match value {
                    Value::Number(n) => canonical_number(&n.to_string())?,
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

/// `text`, a JSON number, as PostgreSQL's `numeric` (and so `jsonb`) stores it: written out in
/// full, with the scale its text implies (`1e2` is `100`, `1.50` stays `1.50`, `1e-7` is
/// `0.0000001`, `-0` is `0`). `None` if `text` is not a JSON number, or if writing it out would
/// take more than [`MAX_NUMBER_CHARS`] characters and more than `text` itself.
pub fn canonical_number(text: &str) -> Option<String> {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.strip_prefix('+').unwrap_or(e)),
        None => (unsigned, "0"),
    };
    // More than 18 exponent digits could overflow below; no such number can be written out.
    if exponent.trim_start_matches('-').len() > 18 {
        return None;
    }
    let exponent: i64 = exponent.parse().ok()?;
    let (whole, fraction) = match mantissa.split_once('.') {
        Some((w, f)) if !f.is_empty() => (w, f),
        Some(_) => return None,
        None => (mantissa, ""),
    };
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(fraction) {
        return None;
    }
    let all: Vec<u8> = whole.bytes().chain(fraction.bytes()).collect();
    let width = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    // Digits before the decimal point once the exponent is applied, and digits after it.
    let point = width(whole.len()).saturating_add(exponent);
    let scale = width(fraction.len()).saturating_sub(exponent).max(0);
    let written = point.max(1) + if scale > 0 { scale + 1 } else { 0 } + i64::from(negative);
    if written > width(text.len().max(MAX_NUMBER_CHARS)) {
        return None;
    }
    let digit_at = |i: i64| {
        usize::try_from(i)
            .ok()
            .and_then(|i| all.get(i).copied())
            .map_or('0', char::from)
    };
    let integral: String = (0..point).map(digit_at).collect();
    let integral = integral.trim_start_matches('0');
    let mut out = String::new();
    if negative && all.iter().any(|&b| b != b'0') {
        out.push('-');
    }
    out.push_str(if integral.is_empty() { "0" } else { integral });
    if scale > 0 {
        out.push('.');
        out.extend((point..point + scale).map(digit_at));
    }
    Some(out)
}

/// Rewrites every number in `value` as [`canonical_number`] writes it; `false` (leaving `value`
/// partly rewritten) if one cannot be.
pub fn canonicalize_numbers(value: &mut Value) -> bool {
    match value {
        Value::Number(n) => {
            let canonical = canonical_number(&n.to_string())
                .and_then(|text| serde_json::from_str::<Number>(&text).ok());
            canonical.map(|c| *n = c).is_some()
        }
        Value::Array(items) => items.iter_mut().all(canonicalize_numbers),
        Value::Object(members) => members.values_mut().all(canonicalize_numbers),
        _ => true,
    }
}

/// The transformed records of one request went over [`MAX_OUTPUT_FIELDS`] or
/// [`MAX_OUTPUT_BYTES`], or before `select` over [`MAX_HANDLED_FIELDS`] or [`MAX_HANDLED_BYTES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the transformed records exceed the output bound")]
pub struct OutputExceeded;

/// What the transformed records of one request may still take: charged record by record, in
/// order, the same way at intake and at execution, so a request intake accepted never exceeds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputBudget {
    /// Output fields and JSON bytes left. Start at [`MAX_OUTPUT_FIELDS`], [`MAX_OUTPUT_BYTES`].
    output: (usize, usize),
    /// Fields and JSON bytes before `select` left. Start at [`MAX_HANDLED_FIELDS`],
    /// [`MAX_HANDLED_BYTES`].
    handled: (usize, usize),
}

impl Default for OutputBudget {
    fn default() -> Self {
        OutputBudget {
            output: (MAX_OUTPUT_FIELDS, MAX_OUTPUT_BYTES),
            handled: (MAX_HANDLED_FIELDS, MAX_HANDLED_BYTES),
        }
    }
}

impl OutputBudget {
    /// Charges one transformed record.
    ///
    /// # Errors
    /// [`OutputExceeded`] once the records charged so far exceed the bound.
    pub fn charge(&mut self, record: &Map<String, Value>) -> Result<(), OutputExceeded> {
        take(&mut self.output, record)
    }

    /// Charges one record as it was before `select`.
    ///
    /// # Errors
    /// [`OutputExceeded`] once the records charged so far exceed the bound.
    pub fn charge_handled(&mut self, record: &Map<String, Value>) -> Result<(), OutputExceeded> {
        take(&mut self.handled, record)
    }

    /// The JSON bytes of the transformed records charged so far.
    pub fn output_bytes(&self) -> usize {
        MAX_OUTPUT_BYTES - self.output.1
    }
}

/// Takes `record`'s fields and JSON bytes from `left`.
fn take(left: &mut (usize, usize), record: &Map<String, Value>) -> Result<(), OutputExceeded> {
    left.0 = left.0.checked_sub(record.len()).ok_or(OutputExceeded)?;
    left.1 = left.1.checked_sub(json_len(record)).ok_or(OutputExceeded)?;
    Ok(())
}

/// Counts the bytes written to it.
struct ByteCount(usize);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 = self.0.saturating_add(buf.len());
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The length of `value` as compact JSON text, without building the text.
pub fn json_len<T: serde::Serialize + ?Sized>(value: &T) -> usize {
    let mut count = ByteCount(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

/// A validated transform spec.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Transform {
    /// Keep only these fields (after rename), if set.
    pub select: Option<BTreeSet<String>>,
    /// Rename fields, all at once: old name → new name. Two may share a new name (alternative
    /// source names); a record that has both fails.
    pub rename: BTreeMap<String, String>,
    /// Cast fields (by their name after rename).
    pub cast: BTreeMap<String, Cast>,
    /// Fields that must be present and not null (after rename and cast).
    pub required: BTreeSet<String>,
    /// Values for fields that are absent (applied first, by original name).
    pub defaults: BTreeMap<String, Value>,
}

impl Transform {
    /// Applies the transform to one record; `None` if a cast fails, a required field is missing,
    /// or a field would be renamed onto a field the record keeps.
    pub fn apply(&self, record: &Map<String, Value>) -> Option<Map<String, Value>> {
        let mut out = self.apply_before_select(record)?;
        if let Some(keep) = &self.select {
            out.retain(|field, _| keep.contains(field));
        }
        Some(out)
    }

    /// Applies the transform to one record, charging `budget` for it: `Ok(None)` where
    /// [`Transform::apply`] gives `None`.
    ///
    /// # Errors
    /// [`OutputExceeded`] once the records charged so far exceed the budget, before `select` or
    /// after it.
    pub fn apply_within(
        &self,
        record: &Map<String, Value>,
        budget: &mut OutputBudget,
    ) -> Result<Option<Map<String, Value>>, OutputExceeded> {
        let Some(mut out) = self.apply_before_select(record) else {
            return Ok(None);
        };
        if let Some(keep) = &self.select {
            budget.charge_handled(&out)?;
            out.retain(|field, _| keep.contains(field));
        }
        budget.charge(&out)?;
        Ok(Some(out))
    }

    /// Every step but `select`; `None` where [`Transform::apply`] gives `None`.
    fn apply_before_select(&self, record: &Map<String, Value>) -> Option<Map<String, Value>> {
        let mut out = record.clone();
        for (field, value) in &self.defaults {
            out.entry(field.clone()).or_insert_with(|| value.clone());
        }
        // Every source leaves before any target arrives: `a`→`b` with `b`→`a` swaps them.
        let moved: Vec<(&String, Value)> = self
            .rename
            .iter()
            .filter_map(|(from, to)| out.remove(from).map(|value| (to, value)))
            .collect();
        let mut landed = BTreeSet::new();
        for (to, value) in moved {
            // Onto a field the record itself keeps, or onto a name another of its fields was
            // renamed to, one value would be lost. A default for the target only stood in for an
            // absent field, and the renamed value replaces it.
            let kept = record.contains_key(to) && !self.rename.contains_key(to);
            if kept || !landed.insert(to) {
                return None;
            }
            out.insert(to.clone(), value);
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
        Some(out)
    }

    /// The spec as a JSON document (the normalized form stored with the job).
    pub fn to_value(&self) -> Value {
        let mut doc = Map::new();
        if let Some(select) = &self.select {
            doc.insert("select".into(), select.iter().cloned().collect());
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
            doc.insert("required".into(), self.required.iter().cloned().collect());
        }
        if !self.defaults.is_empty() {
            let defaults = self.defaults.iter().map(|(k, v)| (k.clone(), v.clone()));
            doc.insert("defaults".into(), Value::Object(defaults.collect()));
        }
        Value::Object(doc)
    }
}

#[cfg(test)]
mod tests;
