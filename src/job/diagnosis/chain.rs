//! An error's chain as a diagnosis names it: the transparent wrapper that keeps a source's type
//! name where it enters a `JobError` ([`Described`]), and the probe that names every later link
//! by downcasting it to a type this crate knows.
//!
//! Invariants this module keeps:
//! - No error's `Display` or `Debug` is read here: the wrapper only forwards them to the error
//!   it wraps, for the handler's own use, and the probe reads types, enumerated kinds, SQLSTATEs
//!   and stable codes.
//! - The wrapper's `source` is the error it wraps, so a walk of a `JobError`'s chain that
//!   downcasts each link finds the handler's error as before; the chain a diagnosis names counts
//!   the wrapper and its error as one link.
//! - A chain has at most [`MAX_CHAIN`] links, each name at most [`super::record::MAX_TYPE_NAME`] bytes.

use super::detail::Detail;
use super::record::{Chain, ErrorLink, MAX_CHAIN, UNKNOWN_TYPE};
use std::error::Error as StdError;
use std::fmt;

/// A boxed error, as a `JobError` keeps its source.
type BoxError = Box<dyn StdError + Send + Sync>;

/// A `JobError`'s source as its constructors keep it: the error the handler gave (`Display` and
/// `Debug` forwarded to it, so it reads as that error, and that error its `source`), the name of
/// its type taken where it was given, and the detail the kind declared with it.
pub(crate) struct Described {
    /// The name of the source's type (`std::any::type_name`), when a constructor saw it.
    type_name: Option<&'static str>,
    /// The error the handler gave, if any (a detail may come without one).
    inner: Option<BoxError>,
    /// The detail the kind declared ([`crate::JobError::with_detail`]).
    detail: Option<Detail>,
}

impl Described {
    /// `source`, with the name of its type.
    pub(crate) fn of<E: Into<BoxError>>(source: E) -> Described {
        Described {
            type_name: Some(std::any::type_name::<E>()),
            inner: Some(source.into()),
            detail: None,
        }
    }

    /// No error: only a detail to carry.
    pub(crate) fn detail_only(detail: Detail) -> Described {
        Described {
            type_name: None,
            inner: None,
            detail: Some(detail),
        }
    }

    /// `boxed` (a `JobError`'s source) as a `Described` one: it is one already, or it is an error
    /// given to a variant directly, whose type no constructor saw.
    pub(crate) fn from_box(boxed: BoxError) -> Described {
        match boxed.downcast::<Described>() {
            Ok(described) => *described,
            Err(other) => Described {
                type_name: None,
                inner: Some(other),
                detail: None,
            },
        }
    }

    /// This source, carrying `detail` (replacing any before).
    pub(crate) fn with_detail(mut self, detail: Detail) -> Described {
        self.detail = Some(detail);
        self
    }

    /// The detail the kind declared with it.
    pub(crate) fn detail(&self) -> Option<&Detail> {
        self.detail.as_ref()
    }

    /// The error the handler gave.
    pub(crate) fn inner(&self) -> Option<&(dyn StdError + Send + Sync + 'static)> {
        self.inner.as_deref()
    }

    /// The chain of the error the handler gave: its type's name as given (or as probed, when the
    /// probe knows it better than a boxed `dyn Error`), then its sources, probed.
    pub(crate) fn chain(&self) -> Chain {
        match &self.inner {
            Some(inner) => chain_of(self.type_name, inner.as_ref()),
            None => Chain::default(),
        }
    }
}

impl fmt::Display for Described {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Some(inner) => fmt::Display::fmt(inner, f),
            None => f.write_str("no error given"),
        }
    }
}

impl fmt::Debug for Described {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Some(inner) => fmt::Debug::fmt(inner, f),
            None => f.write_str("NoErrorGiven"),
        }
    }
}

impl StdError for Described {
    /// The error the handler gave itself (not its source), so a walk of a `JobError`'s chain
    /// that downcasts each link (the group commit's search for a database error) still finds it.
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.inner
            .as_deref()
            .map(|inner| inner as &(dyn StdError + 'static))
    }
}

/// The chain of `error` (named `given` when its type's name was seen where it was given, unless
/// the probe knows it), then of its sources, at most [`MAX_CHAIN`] links.
pub(crate) fn chain_of(given: Option<&'static str>, error: &(dyn StdError + 'static)) -> Chain {
    let first = probe(error).unwrap_or_else(|| ErrorLink::named(given.unwrap_or(UNKNOWN_TYPE)));
    let mut links = vec![first];
    let mut next = error.source();
    while let Some(link) = next {
        if links.len() == MAX_CHAIN {
            return Chain { links, cut: true };
        }
        // A `JobError`'s source inside another error's chain stands for the error it wraps: one
        // link, named as its constructor saw it.
        let (named, after) = match link.downcast_ref::<Described>() {
            Some(described) => {
                let Some(inner) = described.inner() else {
                    break;
                };
                let inner: &(dyn StdError + 'static) = inner;
                let given = described.type_name.unwrap_or(UNKNOWN_TYPE);
                let named = probe(inner).unwrap_or_else(|| ErrorLink::named(given));
                (named, inner.source())
            }
            None => {
                let named = probe(link).unwrap_or_else(|| ErrorLink::named(UNKNOWN_TYPE));
                (named, link.source())
            }
        };
        links.push(named);
        next = after;
    }
    Chain { links, cut: false }
}

/// The link `error` is, if its type is one this crate knows: its name and its enumerated facts.
fn probe(error: &(dyn StdError + 'static)) -> Option<ErrorLink> {
    /// The name of `T`, if `error` is one.
    fn is<T: StdError + 'static>(error: &(dyn StdError + 'static)) -> Option<ErrorLink> {
        error
            .is::<T>()
            .then(|| ErrorLink::named(std::any::type_name::<T>()))
    }
    if let Some(e) = error.downcast_ref::<std::io::Error>() {
        let mut link = ErrorLink::named(std::any::type_name::<std::io::Error>());
        link.io_kind = Some(io_kind(e.kind()).to_owned());
        return Some(link);
    }
    if let Some(e) = error.downcast_ref::<tokio_postgres::Error>() {
        let mut link = ErrorLink::named(std::any::type_name::<tokio_postgres::Error>());
        link.sqlstate = e.code().map(|c| c.code().to_owned());
        return Some(link);
    }
    if let Some(e) = error.downcast_ref::<tokio_postgres::error::DbError>() {
        let mut link = ErrorLink::named(std::any::type_name::<tokio_postgres::error::DbError>());
        link.sqlstate = Some(e.code().code().to_owned());
        return Some(link);
    }
    if let Some(e) = error.downcast_ref::<crate::error::Error>() {
        let mut link = ErrorLink::named(std::any::type_name::<crate::error::Error>());
        link.code = Some(e.code().as_str().to_owned());
        return Some(link);
    }
    if let Some(e) = error.downcast_ref::<serde_json::Error>() {
        let mut link = ErrorLink::named(std::any::type_name::<serde_json::Error>());
        link.json = Some(json_category(e.classify()).to_owned());
        return Some(link);
    }
    is::<std::num::ParseIntError>(error)
        .or_else(|| is::<std::num::ParseFloatError>(error))
        .or_else(|| is::<std::num::TryFromIntError>(error))
        .or_else(|| is::<std::str::Utf8Error>(error))
        .or_else(|| is::<std::string::FromUtf8Error>(error))
        .or_else(|| is::<std::str::ParseBoolError>(error))
        .or_else(|| is::<std::fmt::Error>(error))
        .or_else(|| is::<tokio::time::error::Elapsed>(error))
        .or_else(|| is::<uuid::Error>(error))
        .or_else(|| is::<chrono::ParseError>(error))
}

/// The name of an I/O error's kind, from the kinds this release lists (its `Debug` name, spelled
/// out here so that no formatting is involved); `Uncategorized` for any other.
fn io_kind(kind: std::io::ErrorKind) -> &'static str {
    use std::io::ErrorKind as K;
    match kind {
        K::NotFound => "NotFound",
        K::PermissionDenied => "PermissionDenied",
        K::ConnectionRefused => "ConnectionRefused",
        K::ConnectionReset => "ConnectionReset",
        K::ConnectionAborted => "ConnectionAborted",
        K::NotConnected => "NotConnected",
        K::AddrInUse => "AddrInUse",
        K::AddrNotAvailable => "AddrNotAvailable",
        K::BrokenPipe => "BrokenPipe",
        K::AlreadyExists => "AlreadyExists",
        K::WouldBlock => "WouldBlock",
        K::InvalidInput => "InvalidInput",
        K::InvalidData => "InvalidData",
        K::TimedOut => "TimedOut",
        K::WriteZero => "WriteZero",
        K::Interrupted => "Interrupted",
        K::Unsupported => "Unsupported",
        K::UnexpectedEof => "UnexpectedEof",
        K::OutOfMemory => "OutOfMemory",
        K::Other => "Other",
        _ => "Uncategorized",
    }
}

/// The name of a JSON error's category.
fn json_category(category: serde_json::error::Category) -> &'static str {
    use serde_json::error::Category;
    match category {
        Category::Io => "io",
        Category::Syntax => "syntax",
        Category::Data => "data",
        Category::Eof => "eof",
    }
}

/// The chain of a database error known only by its SQLSTATE (the group commit's own statement
/// failed, for a whole batch): one `tokio_postgres::Error` link.
pub(crate) fn database_chain(sqlstate: Option<&tokio_postgres::error::SqlState>) -> Chain {
    let mut link = ErrorLink::named(std::any::type_name::<tokio_postgres::Error>());
    link.sqlstate = sqlstate.map(|s| s.code().to_owned());
    Chain {
        links: vec![link],
        cut: false,
    }
}
