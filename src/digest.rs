//! Keyed digests of principals, idempotency keys and API keys.
//!
//! Invariants this module keeps:
//! - Raw principals, idempotency keys and API keys never reach the database: only
//!   HMAC-SHA-256 digests under the deployment's secret (`DURABLE_ETL_SECRET`) do, so a database
//!   dump reveals none of them and cannot be matched against a dictionary without the secret.
//! - Each kind of value is digested under its own domain label, so the digest of a principal can
//!   never equal the digest of an API key with the same text.
//! - The secret is never printed: [`Secret`]'s `Debug` is redacted.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::fmt;

/// The shortest secret accepted, in bytes.
pub const SECRET_MIN_LEN: usize = 16;

/// The deployment's digest key. Its `Debug` output is redacted.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// What a digest is of; each kind has its own domain label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DigestKind {
    /// An owner principal (the name an API key maps to).
    Principal,
    /// A client's `Idempotency-Key`.
    IdempotencyKey,
    /// An API key.
    ApiKey,
    /// A normalized request document (the request fingerprint).
    Request,
    /// A console session cookie's signed part.
    ConsoleSession,
    /// A console form's anti-forgery token.
    ConsoleCsrf,
    /// A payload key's id: the key that seals retained payloads
    /// ([`crate::dead_letters::PayloadKey`]).
    PayloadKey,
}

impl DigestKind {
    /// The domain label mixed into the digest.
    const fn label(self) -> &'static [u8] {
        match self {
            DigestKind::Principal => b"durable-etl/principal/v1\0",
            DigestKind::IdempotencyKey => b"durable-etl/idempotency-key/v1\0",
            DigestKind::ApiKey => b"durable-etl/api-key/v1\0",
            DigestKind::Request => b"durable-etl/request/v1\0",
            DigestKind::ConsoleSession => b"durable-etl/console-session/v1\0",
            DigestKind::ConsoleCsrf => b"durable-etl/console-csrf/v1\0",
            DigestKind::PayloadKey => b"durable-etl/payload-key/v1\0",
        }
    }
}

impl Secret {
    /// Wraps a secret, refusing one shorter than [`SECRET_MIN_LEN`] bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Option<Secret> {
        let bytes = bytes.into();
        (bytes.len() >= SECRET_MIN_LEN).then_some(Secret(bytes))
    }

    /// The secret in the environment variable `DURABLE_ETL_SECRET` (what the binary reads).
    ///
    /// # Errors
    /// [`crate::ConfigError::Secret`] when it is unset, not UTF-8 or shorter than
    /// [`SECRET_MIN_LEN`] bytes.
    pub fn from_env() -> Result<Secret, crate::ConfigError> {
        std::env::var("DURABLE_ETL_SECRET")
            .ok()
            .and_then(Secret::new)
            .ok_or(crate::ConfigError::Secret)
    }

    /// The 32-byte HMAC-SHA-256 of `value` under this secret and `kind`'s domain label.
    pub fn digest(&self, kind: DigestKind, value: &[u8]) -> [u8; 32] {
        // HMAC accepts keys of any length, so `new_from_slice` cannot fail here.
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(kind.label());
        mac.update(value);
        mac.finalize().into_bytes().into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_secrets_are_refused_and_debug_is_redacted() {
        assert!(Secret::new("too short").is_none());
        let secret = Secret::new("0123456789abcdef-canary").unwrap();
        assert_eq!(format!("{secret:?}"), "Secret(<redacted>)");
    }

    #[test]
    fn digests_depend_on_secret_kind_and_value() {
        let a = Secret::new("0123456789abcdef").unwrap();
        let b = Secret::new("fedcba9876543210").unwrap();
        let d = a.digest(DigestKind::Principal, b"alice");
        assert_eq!(d, a.digest(DigestKind::Principal, b"alice"));
        assert_ne!(d, b.digest(DigestKind::Principal, b"alice"));
        assert_ne!(d, a.digest(DigestKind::ApiKey, b"alice"));
        assert_ne!(d, a.digest(DigestKind::IdempotencyKey, b"alice"));
        assert_ne!(d, a.digest(DigestKind::Principal, b"bob"));
    }
}
