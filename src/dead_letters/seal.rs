//! Sealing of retained payloads: XChaCha20-Poly1305 (an AEAD) under a key derived from the
//! deployment's secret and a key id.
//!
//! Invariants this module keeps:
//! - A payload leaves this module only sealed: a fresh random 24-byte nonce, then the
//!   ciphertext and its tag. The associated data binds it to its job's id and the key id, so a
//!   sealed payload copied onto another job, or presented under another key id, does not open.
//! - A key is HMAC-SHA-256 of its key id under the secret, in a domain of its own
//!   ([`DigestKind::PayloadKey`]): the secret and the id together make it, and neither is stored
//!   beside the payload but the id. Another secret, or another current key id, opens nothing that
//!   was sealed before ([`PayloadKey::open`] answers `None`): rotating or destroying the key makes
//!   every retained payload unreadable.
//! - A key's `Debug` is redacted; nothing here logs.

use crate::digest::{DigestKind, Secret};
pub use crate::names::{is_key_id, KEY_ID_MAX};
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use std::fmt;
use uuid::Uuid;

/// The length of a nonce, the first bytes of a sealed payload.
const NONCE_LEN: usize = 24;

/// The key retained payloads are sealed under: derived from the deployment's secret and its
/// id, which is stored with each payload it seals.
#[derive(Clone)]
pub struct PayloadKey {
    /// The key's id (`[A-Za-z0-9._-]`, 1 to [`KEY_ID_MAX`] bytes).
    id: String,
    /// The AEAD under the derived key.
    aead: XChaCha20Poly1305,
}

impl fmt::Debug for PayloadKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PayloadKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl PayloadKey {
    /// The key `id` of `secret`, or `None` for an id [`is_key_id`] refuses.
    pub fn derive(secret: &Secret, id: &str) -> Option<PayloadKey> {
        if !is_key_id(id) {
            return None;
        }
        let key = secret.digest(DigestKind::PayloadKey, id.as_bytes());
        Some(PayloadKey {
            id: id.to_owned(),
            aead: XChaCha20Poly1305::new(&key.into()),
        })
    }

    /// The key's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The associated data of `job`'s payload under this key: the job's id and the key id.
    fn associated(&self, job: Uuid) -> Vec<u8> {
        let mut aad = job.as_bytes().to_vec();
        aad.extend_from_slice(self.id.as_bytes());
        aad
    }

    /// `payload` of `job`, sealed: nonce, then ciphertext and tag.
    pub fn seal(&self, job: Uuid, payload: &serde_json::Value) -> Vec<u8> {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let plain = payload.to_string();
        let aad = self.associated(job);
        // Encryption fails only for a message beyond the cipher's limit (256 GiB), which no
        // payload reaches: the intake bounds them far below it.
        let sealed = self
            .aead
            .encrypt(
                &nonce,
                Payload {
                    msg: plain.as_bytes(),
                    aad: &aad,
                },
            )
            .unwrap_or_default();
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        out
    }

    /// The payload of `job` that `sealed` holds, sealed under the key `key_id`; `None` when
    /// that is not this key, or the bytes do not open under it (another secret, another job,
    /// tampered bytes).
    pub fn open(&self, job: Uuid, key_id: &str, sealed: &[u8]) -> Option<serde_json::Value> {
        if key_id != self.id || sealed.len() <= NONCE_LEN {
            return None;
        }
        let (nonce, body) = sealed.split_at(NONCE_LEN);
        let aad = self.associated(job);
        let plain = self
            .aead
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: body,
                    aad: &aad,
                },
            )
            .ok()?;
        serde_json::from_slice(&plain).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(s: &str) -> Secret {
        Secret::new(s).unwrap()
    }

    #[test]
    fn a_sealed_payload_opens_only_under_its_key_and_job() {
        let key = PayloadKey::derive(&secret("0123456789abcdef"), "k1").unwrap();
        let job = Uuid::now_v7();
        let payload = serde_json::json!({"canary": "CANARY-seal-1", "n": 1});
        let sealed = key.seal(job, &payload);
        assert!(!String::from_utf8_lossy(&sealed).contains("CANARY"));
        assert_eq!(key.open(job, "k1", &sealed), Some(payload.clone()));
        // Another job, another key id, another secret, tampered bytes: nothing opens.
        assert_eq!(key.open(Uuid::now_v7(), "k1", &sealed), None);
        assert_eq!(key.open(job, "k2", &sealed), None);
        let rotated = PayloadKey::derive(&secret("0123456789abcdef"), "k2").unwrap();
        assert_eq!(rotated.open(job, "k1", &sealed), None);
        let other = PayloadKey::derive(&secret("fedcba9876543210"), "k1").unwrap();
        assert_eq!(other.open(job, "k1", &sealed), None);
        let mut bad = sealed.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert_eq!(key.open(job, "k1", &bad), None);
        assert_eq!(key.open(job, "k1", &sealed[..NONCE_LEN]), None);
        // Two seals of one payload differ (fresh nonces).
        assert_ne!(key.seal(job, &payload), sealed);
    }

    #[test]
    fn key_ids_are_checked_and_debug_shows_only_the_id() {
        let s = secret("0123456789abcdef");
        assert!(PayloadKey::derive(&s, "").is_none());
        assert!(PayloadKey::derive(&s, "has space").is_none());
        assert!(PayloadKey::derive(&s, &"a".repeat(KEY_ID_MAX + 1)).is_none());
        let key = PayloadKey::derive(&s, "2026-12.a_b").unwrap();
        assert_eq!(key.id(), "2026-12.a_b");
        assert_eq!(format!("{key:?}"), "PayloadKey { id: \"2026-12.a_b\", .. }");
    }
}
