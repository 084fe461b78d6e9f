//! The replica's owner id: what a valid one is, and a fresh one for a replica that sets none.
//!
//! Invariants this module keeps:
//! - A generated owner id is always valid ([`valid_owner_id`]) and, by its random suffix,
//!   distinct from every other process's.

/// Whether `id` is a usable `lease_owner_id`: 1 to 128 characters of `[A-Za-z0-9._:-]`.
pub(super) fn valid_owner_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'))
}

/// A fresh owner id: the host name (from `HOSTNAME`, else `replica`) and 8 random hex digits.
///
/// Only characters valid in an owner id are kept from the host name.
pub fn generated_owner_id() -> String {
    let host: String = std::env::var("HOSTNAME")
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .take(100)
        .collect();
    let host = if host.is_empty() {
        "replica".to_owned()
    } else {
        host
    };
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}", &suffix[..8])
}
