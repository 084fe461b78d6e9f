//! API keys: created once, stored only as keyed digests, revocable.
//!
//! Invariants this module keeps:
//! - A new key is shown once, to whoever created it; the database holds only its keyed digest and
//!   the keyed digest of its owner, so neither can be read back from a dump.
//! - A revoked key stays revoked: revocation only sets `revoked_at` on a row that has none.

use crate::digest::{DigestKind, Secret};
use crate::error::Error;
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;
use uuid::Uuid;

/// The prefix of every API key, so a leaked key is recognisable to secret scanners.
pub const API_KEY_PREFIX: &str = "detl_";

/// A freshly created API key: its id, and the key itself (shown once, never stored).
#[derive(Debug)]
pub struct CreatedKey {
    /// The key's id, used to revoke it.
    pub id: Uuid,
    /// The key; the database keeps only its digest.
    pub key: String,
}

/// What a key may do beyond acting for its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Acts for its owner only.
    Owner,
    /// Acts for its owner, and reads the console's fleet-wide aggregates (migration 0010).
    Operator,
}

/// A live key: its id, its owner's digest and its role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyHolder {
    /// The key's id.
    pub id: Uuid,
    /// The keyed digest of its owner.
    pub owner_key: [u8; 32],
    /// What it may do.
    pub role: Role,
}

/// Creates an API key for `owner`, storing only digests.
///
/// # Errors
/// Database errors.
pub async fn create(
    client: &impl GenericClient,
    secret: &Secret,
    owner: &str,
) -> Result<CreatedKey, Error> {
    create_as(client, secret, owner, Role::Owner).await
}

/// Creates an API key for `owner` with `role`, storing only digests.
///
/// # Errors
/// Database errors.
pub async fn create_as(
    client: &impl GenericClient,
    secret: &Secret,
    owner: &str,
    role: Role,
) -> Result<CreatedKey, Error> {
    let created = CreatedKey::generate();
    let owner_key = secret.digest(DigestKind::Principal, owner.as_bytes());
    store(client, secret, &owner_key, role, &created).await?;
    Ok(created)
}

impl CreatedKey {
    /// A fresh key and id, stored nowhere yet (see [`store`]).
    #[must_use]
    pub fn generate() -> CreatedKey {
        CreatedKey {
            id: Uuid::now_v7(),
            key: format!(
                "{API_KEY_PREFIX}{}{}",
                Uuid::new_v4().simple(),
                Uuid::new_v4().simple()
            ),
        }
    }
}

/// The keyed digest of API key `key`: what is stored of it, and what a request's key is looked
/// up by.
#[must_use]
pub fn key_digest(secret: &Secret, key: &str) -> [u8; 32] {
    secret.digest(DigestKind::ApiKey, key.as_bytes())
}

/// Stores `created` as a live key of the owner whose keyed digest is `owner_key`, with `role`:
/// its id and the digests only.
///
/// # Errors
/// Database errors.
pub async fn store(
    client: &impl GenericClient,
    secret: &Secret,
    owner_key: &[u8; 32],
    role: Role,
    created: &CreatedKey,
) -> Result<(), Error> {
    let key_digest = key_digest(secret, &created.key);
    client
        .execute_typed(
            "INSERT INTO etl_api_clients (id, owner_key, key_digest, operator)
             VALUES ($1, $2, $3, $4)",
            &[
                (&created.id, Type::UUID),
                (&owner_key.as_slice(), Type::BYTEA),
                (&key_digest.as_slice(), Type::BYTEA),
                (&(role == Role::Operator), Type::BOOL),
            ],
        )
        .await?;
    Ok(())
}

/// Revokes the key with this id. Returns whether a live key was revoked.
///
/// # Errors
/// Database errors.
pub async fn revoke(client: &impl GenericClient, id: Uuid) -> Result<bool, Error> {
    let n = client
        .execute_typed(
            "UPDATE etl_api_clients SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL",
            &[(&id, Type::UUID)],
        )
        .await?;
    Ok(n == 1)
}

/// The owner digest of a live key, or `None` for an unknown or revoked key.
///
/// # Errors
/// Database errors.
pub async fn authenticate(
    client: &impl GenericClient,
    secret: &Secret,
    key: &str,
) -> Result<Option<[u8; 32]>, Error> {
    Ok(holder_of_key(client, secret, key)
        .await?
        .map(|holder| holder.owner_key))
}

/// The holder of the live key `key`, or `None` for an unknown or revoked key.
///
/// # Errors
/// Database errors.
pub async fn holder_of_key(
    client: &impl GenericClient,
    secret: &Secret,
    key: &str,
) -> Result<Option<KeyHolder>, Error> {
    let key_digest = key_digest(secret, key);
    let row = client
        .query_typed_opt(
            "SELECT id, owner_key, operator FROM etl_api_clients
              WHERE key_digest = $1 AND revoked_at IS NULL",
            &[(&key_digest.as_slice(), Type::BYTEA)],
        )
        .await?;
    Ok(row.as_ref().and_then(holder))
}

/// The holder of the live key with id `id`, or `None` once it is revoked (a console session
/// asks on every request, so revoking the key ends its sessions).
///
/// # Errors
/// Database errors.
pub async fn holder_of_id(
    client: &impl GenericClient,
    id: Uuid,
) -> Result<Option<KeyHolder>, Error> {
    let row = client
        .query_typed_opt(
            "SELECT id, owner_key, operator FROM etl_api_clients
              WHERE id = $1 AND revoked_at IS NULL",
            &[(&id, Type::UUID)],
        )
        .await?;
    Ok(row.as_ref().and_then(holder))
}

/// The holder of a row of `id, owner_key, operator`.
fn holder(row: &tokio_postgres::Row) -> Option<KeyHolder> {
    Some(KeyHolder {
        id: row.get(0),
        owner_key: row.get::<_, Vec<u8>>(1).try_into().ok()?,
        role: if row.get(2) {
            Role::Operator
        } else {
            Role::Owner
        },
    })
}
