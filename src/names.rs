//! The names the schema stores: a job kind's, a queue's, a kind's own failure code's. A leaf:
//! it imports nothing of the crate, so configuration and validation anywhere can use it.
//!
//! Invariant this module keeps: every such name is checked by [`is_identifier`] alone, the
//! schema's own rule (`[a-z][a-z0-9_…]*`, at most 63 characters).

/// The longest kind name or kind code the schema stores: PostgreSQL's identifier length.
const IDENTIFIER_MAX: usize = 63;

/// Whether `s` is a lower-case identifier as the schema stores them: a letter `a-z`, then
/// letters `a-z`, digits, `_` or one of `also`, at most 63 characters (bytes: every admitted
/// character is ASCII). The one check behind [`is_kind_name`], a kind's codes and the ETL
/// kind's dataset names.
pub(crate) fn is_identifier(s: &str, also: &[char]) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || also.contains(&c))
        && s.len() <= IDENTIFIER_MAX
}

/// Whether `name` may be a job kind's name: what the schema stores (`[a-z][a-z0-9_.]*`, at most
/// 63 characters).
pub fn is_kind_name(name: &str) -> bool {
    is_identifier(name, &['.'])
}

/// The longest payload key id, in bytes.
pub const KEY_ID_MAX: usize = 64;

/// Whether `id` may name a payload key ([`crate::dead_letters::PayloadKey`]): 1 to
/// [`KEY_ID_MAX`] ASCII letters, digits, `.`, `_` or `-`.
pub fn is_key_id(id: &str) -> bool {
    (1..=KEY_ID_MAX).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}
