//! What intake refuses and within which configured bounds: [`IntakeLimits`] (part of the API's
//! configuration) and [`Rejection`] (a refused request, carried by [`crate::error::Error`]).
//!
//! A leaf: it imports nothing of this crate but [`crate::codes`], so the foundation (`config`,
//! `error`) names these types without importing the ETL job that applies them (`etl::request`).
//!
//! Invariants this module keeps:
//! - A rejection carries a stable [`Code`] and a JSON pointer built only from names the request
//!   schema defines and array indices, never the offending value (`etl::request` builds them).

use crate::codes::Code;

/// Default largest number of records in one request.
pub const MAX_RECORDS_DEFAULT: usize = 10_000;
/// Default largest request body, in bytes.
pub const MAX_BYTES_DEFAULT: usize = 1024 * 1024;
/// Largest records limit the API's configuration accepts.
pub const MAX_RECORDS_MAX: usize = 1_000_000;
/// Largest body limit the API's configuration accepts (1 GiB): a body is held in memory whole.
pub const MAX_BYTES_MAX: usize = 1 << 30;

/// Size limits of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntakeLimits {
    /// Largest number of records. Defaults to [`MAX_RECORDS_DEFAULT`].
    pub max_records: usize,
    /// Largest body in bytes. Defaults to [`MAX_BYTES_DEFAULT`].
    pub max_bytes: usize,
}

impl Default for IntakeLimits {
    fn default() -> Self {
        IntakeLimits {
            max_records: MAX_RECORDS_DEFAULT,
            max_bytes: MAX_BYTES_DEFAULT,
        }
    }
}

/// Why a request was refused at intake: a stable code and where, as a JSON pointer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("request rejected: {code} at {pointer:?}")]
pub struct Rejection {
    /// The stable code.
    pub code: Code,
    /// The JSON pointer (RFC 6901) of the offending member; empty for the whole document.
    pub pointer: String,
    /// A fixed sentence saying more than the code, if one helps (never a request value).
    pub detail: Option<&'static str>,
}

impl Rejection {
    /// A rejection with `code` at `pointer`.
    pub fn new(code: Code, pointer: impl Into<String>) -> Rejection {
        Rejection {
            code,
            pointer: pointer.into(),
            detail: None,
        }
    }

    /// This rejection, saying `detail` too.
    pub fn because(self, detail: &'static str) -> Rejection {
        Rejection {
            detail: Some(detail),
            ..self
        }
    }
}
