//! The diagnosis as stored and read ([`Diagnosis`]), and the parts it names: the phase, the
//! decision, the links of an error's chain and their bounds.
//!
//! Invariants this module keeps: a diagnosis serializes to the same JSON document it reads back,
//! its absent parts left out; a type name is never longer than [`MAX_TYPE_NAME`] bytes.

use super::detail::Detail;
use serde::{Deserialize, Serialize};

/// The most links of an error's source chain a diagnosis names (the error itself included).
pub const MAX_CHAIN: usize = 8;

/// The longest type name a link keeps, in bytes; a longer one is cut at a character boundary
/// and ends with `…`.
pub const MAX_TYPE_NAME: usize = 160;

/// What a link of an error's source chain is named when its type is not one this module knows
/// (Rust cannot name the concrete type behind a `dyn Error`).
pub const UNKNOWN_TYPE: &str = "<unknown>";

/// Where in its attempt a job failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "service", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The handler's compute phase (`Handler::prepare`, a kind's `Perform::compute`).
    Compute,
    /// The kind's effects (`Effects::apply`, a kind's `Apply::apply`), in the fenced transaction.
    Effects,
    /// The fenced commit itself (the batch's own statements or its COMMIT), the effects done.
    Commit,
    /// Recovery took the job back: its lease expired or its replica was judged dead.
    Recovery,
}

impl Phase {
    /// The phase as stored and logged.
    pub const fn as_str(self) -> &'static str {
        match self {
            Phase::Compute => "compute",
            Phase::Effects => "effects",
            Phase::Commit => "commit",
            Phase::Recovery => "recovery",
        }
    }
}

/// What the worker decided after the failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "service", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// The job goes back to `pending`, due after the diagnosis's `delay_ms`.
    Retry,
    /// The job ended `failed`.
    Fail,
}

/// One link of an error's source chain: its type's name and what this crate could read off it
/// without its text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "service", derive(utoipa::ToSchema))]
pub struct ErrorLink {
    /// The Rust type's name (`std::io::error::Error`), or [`UNKNOWN_TYPE`].
    #[serde(rename = "type")]
    pub type_name: String,
    /// For a `std::io::Error`: its `ErrorKind`'s name (`ConnectionRefused`; `Uncategorized` for
    /// a kind this release does not list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_kind: Option<String>,
    /// For a database error: its SQLSTATE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sqlstate: Option<String>,
    /// For an error of this crate ([`crate::Error`]): its stable code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// For a `serde_json::Error`: its category (`io`, `syntax`, `data` or `eof`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<String>,
}

impl ErrorLink {
    /// A link that names only its type, cut to [`MAX_TYPE_NAME`].
    pub(super) fn named(type_name: &str) -> ErrorLink {
        ErrorLink {
            type_name: bounded_name(type_name),
            io_kind: None,
            sqlstate: None,
            code: None,
            json: None,
        }
    }
}

/// `name`, cut at a character boundary to at most [`MAX_TYPE_NAME`] bytes, ending with `…` when
/// cut.
pub(super) fn bounded_name(name: &str) -> String {
    if name.len() <= MAX_TYPE_NAME {
        return name.to_owned();
    }
    let mut end = MAX_TYPE_NAME - '…'.len_utf8();
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &name[..end])
}

/// An error's type and source chain, as a diagnosis names them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chain {
    /// The links, the error itself first, at most [`MAX_CHAIN`].
    pub links: Vec<ErrorLink>,
    /// Whether the chain had more links than it keeps.
    pub cut: bool,
}

/// The diagnosis of one attempt that failed: what an operator needs, and nothing sensitive
/// (see the invariants of `job::diagnosis`). Stored as JSON, its absent parts left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "service", derive(utoipa::ToSchema))]
pub struct Diagnosis {
    /// Where the attempt failed.
    pub phase: Phase,
    /// What came of it.
    pub decision: Decision,
    /// For a retry: in how many milliseconds the job was due again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<i64>,
    /// How long the attempt ran, in milliseconds, from its claim to its failure.
    pub duration_ms: i64,
    /// The error's type and its sources' types, outermost first (empty when the failure carried
    /// no error: a timeout, a panic, an unknown kind, a recovery).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chain: Vec<ErrorLink>,
    /// Whether the chain was longer than the [`MAX_CHAIN`] links it keeps.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub chain_cut: bool,
    /// The structured detail the kind declared ([`Detail`]), by field name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "service", schema(value_type = Option<Object>))]
    pub detail: Option<serde_json::Map<String, serde_json::Value>>,
    /// How many fields of the declared detail were dropped (over a bound, or not well formed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail_dropped: Option<u32>,
    /// For a recovery: whether the attempt's lease had expired (else its replica was judged
    /// dead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_expired: Option<bool>,
}

impl Diagnosis {
    /// A diagnosis of a failure in `phase` after `duration_ms`, decided `decision` (with
    /// `delay_ms` for a retry), carrying no error or detail yet.
    pub fn new(phase: Phase, decision: Decision, delay_ms: Option<i64>, duration_ms: i64) -> Self {
        Diagnosis {
            phase,
            decision,
            delay_ms: delay_ms.filter(|_| decision == Decision::Retry),
            duration_ms,
            chain: Vec::new(),
            chain_cut: false,
            detail: None,
            detail_dropped: None,
            lease_expired: None,
        }
    }

    /// This diagnosis naming `chain`.
    pub fn with_chain(mut self, chain: Chain) -> Self {
        self.chain = chain.links;
        self.chain_cut = chain.cut;
        self
    }

    /// This diagnosis carrying `detail`, bounded (see [`Detail`]).
    pub fn with_detail(mut self, detail: &Detail) -> Self {
        let (fields, dropped) = detail.bounded();
        self.detail = (!fields.is_empty()).then_some(fields);
        self.detail_dropped = (dropped > 0).then_some(dropped);
        self
    }

    /// The diagnosis as the JSON document stored.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// A stored diagnosis read back; `None` for a document this release cannot read (written by
    /// a newer one), which is then shown as absent rather than failing the read.
    pub fn from_json(value: serde_json::Value) -> Option<Diagnosis> {
        serde_json::from_value(value).ok()
    }
}
