//! The structured detail a kind declares with a failure ([`Detail`]): named fields whose values
//! can hold no free text.
//!
//! Invariants this module keeps:
//! - A field's name is a `&'static str`, and its value an integer, a boolean or a `&'static str`
//!   tag ([`DetailValue`] has no other constructor): a `String` built at run time from a payload
//!   or an error message cannot become a field, the compiler refuses it.
//! - What is stored is bounded and chosen the same way every time ([`Detail::bounded`]): fields
//!   in the order declared (a name declared again keeps its first place, with its last value),
//!   a field kept only while the detail stays within [`MAX_DETAIL_FIELDS`] fields and
//!   [`MAX_DETAIL_BYTES`] bytes; a field whose name is not a lower-case identifier or whose tag
//!   is not a short token is dropped; every dropped field is counted.

use crate::names::is_identifier;
use serde_json::{Map, Value};

/// The most fields a kind's [`Detail`] keeps.
pub const MAX_DETAIL_FIELDS: usize = 16;

/// The largest a kind's [`Detail`] may be, serialized as a JSON object, in bytes.
pub const MAX_DETAIL_BYTES: usize = 1024;

/// The longest tag a field keeps, in bytes.
const MAX_TAG: usize = 63;

/// Structured detail a kind declares with a failure, stored in the attempt's diagnosis: named
/// integers, booleans and `&'static str` tags, nothing else. Give it with
/// [`JobError::with_detail`](crate::JobError::with_detail).
///
/// Names are lower-case identifiers (`[a-z][a-z0-9_]*`, at most 63 bytes); tags are tokens of at
/// most 63 ASCII letters, digits, `_`, `-`, `.` or `:`. At most 16 fields and 1 KiB (as JSON)
/// are kept, in the order declared; the diagnosis counts what was dropped (`detail_dropped`).
///
/// ```
/// use durable_etl::job::Detail;
/// use durable_etl::JobError;
///
/// let busy = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "smtp busy");
/// let error = JobError::transient(busy).with_detail(
///     Detail::new()
///         .field("smtp_reply", 421)
///         .field("relay", "eu-west-1")
///         .field("tls", true),
/// );
/// # drop(error);
/// ```
///
/// A `String` is refused at compile time, so no text made at run time (a payload's value, an
/// error's message) can be stored:
///
/// ```compile_fail,E0277
/// use durable_etl::job::Detail;
///
/// let message = String::from("smtp busy for alice@example.com");
/// let detail = Detail::new().field("reason", message);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Detail {
    /// The fields, in the order declared.
    fields: Vec<(&'static str, DetailValue)>,
}

/// A value of a [`Detail`] field: an integer, a boolean or a `&'static str` tag. Made only
/// through its `From` conversions, so it can hold no text built at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DetailValue(Held);

/// What a [`DetailValue`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// A signed integer.
    Int(i64),
    /// An unsigned integer too large for `i64`.
    UInt(u64),
    /// A boolean.
    Bool(bool),
    /// A tag written in the source.
    Tag(&'static str),
}

/// `From` conversions of the signed integers into a [`DetailValue`].
macro_rules! signed {
    ($($t:ty),*) => {$(
        impl From<$t> for DetailValue {
            fn from(v: $t) -> DetailValue {
                DetailValue(Held::Int(i64::from(v)))
            }
        }
    )*};
}

/// `From` conversions of the unsigned integers into a [`DetailValue`].
macro_rules! unsigned {
    ($($t:ty),*) => {$(
        impl From<$t> for DetailValue {
            fn from(v: $t) -> DetailValue {
                let v = u64::from(v);
                DetailValue(i64::try_from(v).map_or(Held::UInt(v), Held::Int))
            }
        }
    )*};
}

signed!(i8, i16, i32, i64);
unsigned!(u8, u16, u32, u64);

impl From<usize> for DetailValue {
    fn from(v: usize) -> DetailValue {
        DetailValue::from(u64::try_from(v).unwrap_or(u64::MAX))
    }
}

impl From<isize> for DetailValue {
    fn from(v: isize) -> DetailValue {
        DetailValue(Held::Int(i64::try_from(v).unwrap_or(i64::MAX)))
    }
}

impl From<bool> for DetailValue {
    fn from(v: bool) -> DetailValue {
        DetailValue(Held::Bool(v))
    }
}

impl From<&'static str> for DetailValue {
    fn from(v: &'static str) -> DetailValue {
        DetailValue(Held::Tag(v))
    }
}

impl DetailValue {
    /// The value as JSON, if it is well formed (a tag must be a short token).
    fn to_json(self) -> Option<Value> {
        Some(match self.0 {
            Held::Int(v) => Value::from(v),
            Held::UInt(v) => Value::from(v),
            Held::Bool(v) => Value::Bool(v),
            Held::Tag(tag) if is_tag(tag) => Value::from(tag),
            Held::Tag(_) => return None,
        })
    }
}

/// Whether `tag` is a token a tag may be: 1 to [`MAX_TAG`] ASCII letters, digits, `_`, `-`, `.`
/// or `:` (no spaces, so no sentence).
fn is_tag(tag: &str) -> bool {
    !tag.is_empty()
        && tag.len() <= MAX_TAG
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}

impl Detail {
    /// An empty detail.
    pub fn new() -> Detail {
        Detail::default()
    }

    /// This detail with field `name` set to `value` (a name declared again keeps its first
    /// place and takes the new value).
    #[must_use]
    pub fn field(mut self, name: &'static str, value: impl Into<DetailValue>) -> Detail {
        let value = value.into();
        match self.fields.iter_mut().find(|(n, _)| *n == name) {
            Some(field) => field.1 = value,
            None => self.fields.push((name, value)),
        }
        self
    }

    /// Whether no field is declared.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// The fields kept, as a JSON object, and how many were dropped (see the module's
    /// invariants): the same fields for the same detail, every time.
    pub(crate) fn bounded(&self) -> (Map<String, Value>, u32) {
        let mut kept = Map::new();
        let mut dropped = 0u32;
        // `{}`, then per field `"name":value` and a comma between fields.
        let mut size = 2usize;
        for (name, value) in &self.fields {
            let json = value.to_json().filter(|_| is_identifier(name, &[]));
            let Some(json) = json else {
                dropped += 1;
                continue;
            };
            let field_size =
                name.len() + 3 + json.to_string().len() + usize::from(!kept.is_empty());
            if kept.len() == MAX_DETAIL_FIELDS || size + field_size > MAX_DETAIL_BYTES {
                dropped += 1;
                continue;
            }
            size += field_size;
            kept.insert((*name).to_owned(), json);
        }
        (kept, dropped)
    }
}
