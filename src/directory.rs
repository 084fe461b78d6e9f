//! The directory of cells: which cells there are, on which server each lives, and which cell
//! each owner's jobs live in. It is a schema of its own (`durable_etl_directory`) in one
//! database the whole fleet shares (any PostgreSQL database, or a Citus coordinator, where it
//! stays local to the coordinator), apart from every cell.
//!
//! A cell is listed by name with its server: a host and port, or none for the directory's own
//! server (or, on Citus, the worker that holds the cell, which every command finds itself). The
//! database name, role and password are the connecting process's own: the directory holds no
//! secret. Processes started with `--directory` find their cell's server here.
//!
//! An owner is placed in a cell the first time it is asked for ([`place`]): by its owner key
//! (a keyed digest, so evenly spread), among the cells open to new owners at that moment; the
//! placement is then written down, so opening or adding cells later never moves an owner whose
//! jobs live somewhere already.
//!
//! An API key made for a routed API (`api-keys create --directory`) is recorded here by its id
//! and keyed digest with its owner, so one API serving every cell finds a request's cell
//! ([`key_cell`]); the key itself, and whether it is live, stay the cell's.
//!
//! Invariants this module keeps:
//! - An owner is in at most one cell, and once placed stays there until a move ([`moving`])
//!   switches it, once the new cell holds all its rows: nothing else rewrites an owner's entry
//!   (two first asks racing agree on the one that was written first).
//! - A key of an owner being moved routes nowhere ([`Error::OwnerMoved`]) until the move
//!   switches it.
//! - A cell with owners is never removed; only its openness to new owners changes.
//! - Nothing stored names a principal or holds a key: owners and keys are their 32-byte keyed
//!   digests.
//! - A key routes only to its owner's cell: a key is recorded only for a placed owner (a foreign
//!   key), once.

use crate::config::{cell_name_ok, ConfigError, DatabaseConfig};
use crate::error::Error;
use tokio_postgres::types::Type;
use tokio_postgres::GenericClient;

pub mod moving;
#[cfg(test)]
mod tests;

/// Builds the directory if it does not exist, under an advisory lock (two processes may build it
/// at once): one simple query, so one implicit transaction, which it neither opens nor ends (on
/// a session already in a transaction it joins that one). On a Citus coordinator the schema is
/// kept local to it (not a distributed schema): it is read at start-up and placement, never on a
/// job's path; elsewhere the Citus setting is not touched (Citus reserves its prefix).
///
/// Locks: a transaction-level advisory lock; the catalog rows of what it creates.
pub const INIT_SQL: &str = "
SELECT set_config('citus.enable_schema_based_sharding', 'off', true)
 WHERE current_setting('citus.enable_schema_based_sharding', true) IS NOT NULL;
SELECT pg_advisory_xact_lock(hashtext('durable_etl_directory'));
CREATE SCHEMA IF NOT EXISTS durable_etl_directory;
CREATE TABLE IF NOT EXISTS durable_etl_directory.cells (
    name text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9_]{0,39}$' AND name !~ '^pg_'),
    host text CHECK (host <> ''),
    port integer CHECK (port BETWEEN 1 AND 65535),
    open boolean NOT NULL DEFAULT true,
    added_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((host IS NULL) = (port IS NULL))
);
CREATE TABLE IF NOT EXISTS durable_etl_directory.owners (
    owner_key bytea PRIMARY KEY CHECK (octet_length(owner_key) = 32),
    cell text NOT NULL REFERENCES durable_etl_directory.cells (name),
    placed_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS durable_etl_directory_owners_cell_idx
    ON durable_etl_directory.owners (cell);
CREATE TABLE IF NOT EXISTS durable_etl_directory.api_keys (
    id uuid PRIMARY KEY,
    key_digest bytea NOT NULL UNIQUE CHECK (octet_length(key_digest) = 32),
    owner_key bytea NOT NULL REFERENCES durable_etl_directory.owners (owner_key),
    added_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS durable_etl_directory_api_keys_owner_idx
    ON durable_etl_directory.api_keys (owner_key);
CREATE TABLE IF NOT EXISTS durable_etl_directory.moves (
    owner_key bytea PRIMARY KEY REFERENCES durable_etl_directory.owners (owner_key),
    id uuid NOT NULL UNIQUE,
    from_cell text NOT NULL REFERENCES durable_etl_directory.cells (name),
    to_cell text NOT NULL REFERENCES durable_etl_directory.cells (name),
    step text NOT NULL CHECK (step IN ('fence', 'drain', 'copy', 'switch', 'clean')),
    started_at timestamptz NOT NULL DEFAULT now(),
    CHECK (from_cell <> to_cell)
);";

/// Lists cell `$1`, on host `$2` and port `$3` (both null: the directory's server); returns
/// nothing when a cell of that name is listed already.
///
/// Locks: the new row's primary key entry.
pub const ADD_SQL: &str = "
INSERT INTO durable_etl_directory.cells (name, host, port) VALUES ($1, $2, $3)
    ON CONFLICT (name) DO NOTHING
RETURNING name";

/// Opens (`$2` true) or closes cell `$1` to new owners; returns it if it is listed.
///
/// Locks: the cell's row.
pub const SET_OPEN_SQL: &str = "
UPDATE durable_etl_directory.cells SET open = $2 WHERE name = $1 RETURNING name";

/// Every cell, by name: its server, whether it is open to new owners, and its owners' count.
///
/// Locks: none.
pub const LIST_SQL: &str = "
SELECT c.name, c.host, c.port, c.open,
       (SELECT count(*) FROM durable_etl_directory.owners o WHERE o.cell = c.name)
  FROM durable_etl_directory.cells c
 ORDER BY c.name";

/// Cell `$1`'s server, if it is listed.
///
/// Locks: none.
pub const CELL_SQL: &str = "
SELECT name, host, port, open, 0::int8 FROM durable_etl_directory.cells WHERE name = $1";

/// The cell of owner key `$1`, placing the owner first if it has none: the open cell whose
/// position among the open cells (by name) is `$2` (the key's first four bytes) modulo their
/// number. Returns nothing when the owner has no cell and none is open, or when another first ask
/// placed it while this statement ran (its snapshot does not see that row: ask again).
///
/// Locks: the new owner row's primary key entry (an ask racing it waits for its outcome).
pub const PLACE_SQL: &str = "
WITH open AS (
    SELECT name, row_number() OVER (ORDER BY name) - 1 AS i, count(*) OVER () AS n
      FROM durable_etl_directory.cells WHERE open
), placed AS (
    INSERT INTO durable_etl_directory.owners (owner_key, cell)
    SELECT $1, name FROM open WHERE i = $2 % n
        ON CONFLICT (owner_key) DO NOTHING
    RETURNING cell
)
SELECT cell FROM placed
UNION ALL
SELECT cell FROM durable_etl_directory.owners WHERE owner_key = $1
LIMIT 1";

/// Whether the directory is built, its API keys included: one row of each table at most, never
/// a count.
///
/// Locks: none.
pub const CHECK_SQL: &str = "
SELECT (SELECT 1 FROM durable_etl_directory.cells LIMIT 1),
       (SELECT 1 FROM durable_etl_directory.api_keys LIMIT 1),
       (SELECT 1 FROM durable_etl_directory.moves LIMIT 1)";

/// The cell of owner key `$1`, if it has one.
///
/// Locks: none.
pub const FIND_SQL: &str = "SELECT cell FROM durable_etl_directory.owners WHERE owner_key = $1";

/// Records API key `$1` (its id), whose keyed digest is `$2`, of owner `$3` (placed already):
/// the key's requests are then routed to the owner's cell.
///
/// Locks: the new row's key entries; the owner's row, in share mode (its foreign key).
pub const ADD_KEY_SQL: &str = "
INSERT INTO durable_etl_directory.api_keys (id, key_digest, owner_key) VALUES ($1, $2, $3)";

/// The cell of the owner of the API key whose keyed digest is `$1`, and whether the owner is
/// moving (a move that has not switched it yet).
///
/// Locks: none.
pub const KEY_CELL_SQL: &str = "
SELECT o.cell, EXISTS (SELECT 1 FROM durable_etl_directory.moves m
                        WHERE m.owner_key = o.owner_key AND m.step <> 'clean')
  FROM durable_etl_directory.api_keys k
  JOIN durable_etl_directory.owners o USING (owner_key)
 WHERE k.key_digest = $1";

/// [`KEY_CELL_SQL`] for the API key whose id is `$1`.
///
/// Locks: none.
pub const KEY_ID_CELL_SQL: &str = "
SELECT o.cell, EXISTS (SELECT 1 FROM durable_etl_directory.moves m
                        WHERE m.owner_key = o.owner_key AND m.step <> 'clean')
  FROM durable_etl_directory.api_keys k
  JOIN durable_etl_directory.owners o USING (owner_key)
 WHERE k.id = $1";

/// Whether owner `$1` is moving (a move that has not switched it yet).
///
/// Locks: none.
pub const MOVING_SQL: &str = "
SELECT 1 FROM durable_etl_directory.moves WHERE owner_key = $1 AND step <> 'clean'";

/// An API key as the directory routes it: by its keyed digest (a request's bearer key) or by
/// its id (a console session, or a revocation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRef<'a> {
    /// The keyed digest of the key itself.
    Digest(&'a [u8; 32]),
    /// The key's id.
    Id(uuid::Uuid),
}

/// A cell as the directory lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cell {
    /// Its name: the schema that holds its tables.
    pub name: String,
    /// Its server's host and port; `None` for the directory's own server.
    pub server: Option<(String, u16)>,
    /// Whether new owners are placed in it.
    pub open: bool,
    /// How many owners it holds.
    pub owners: i64,
}

impl Cell {
    /// The cell of a listing row (`name, host, port, open, owners`).
    fn of(row: &tokio_postgres::Row) -> Cell {
        let host: Option<String> = row.get(1);
        let port: Option<i32> = row.get(2);
        Cell {
            name: row.get(0),
            server: host.zip(port.and_then(|p| u16::try_from(p).ok())),
            open: row.get(3),
            owners: row.get(4),
        }
    }

    /// `base` (the directory's connection settings) pointed at this cell: its server, and the
    /// cell on every session's `search_path`.
    ///
    /// # Errors
    /// [`ConfigError::NodeUrl`] when the cell lives on another server and `base`'s URL cannot be
    /// pointed at it (see [`crate::db::with_node`]).
    pub fn config(&self, base: &DatabaseConfig) -> Result<DatabaseConfig, Error> {
        let url = match &self.server {
            Some((host, port)) => crate::db::with_node(&base.url, host, *port)?,
            None => base.url.clone(),
        };
        Ok(DatabaseConfig {
            url,
            cell: Some(self.name.clone()),
            ..base.clone()
        })
    }
}

/// Builds the directory in `client`'s database if it does not exist ([`INIT_SQL`]).
///
/// # Errors
/// Database errors.
pub async fn init(client: &impl GenericClient) -> Result<(), Error> {
    client.batch_execute(INIT_SQL).await?;
    Ok(())
}

/// Lists cell `name` on `server` (`None`: the directory's own server), open to new owners.
///
/// # Errors
/// [`ConfigError::CellName`] for a name no cell can have, [`ConfigError::CellListed`] when a
/// cell of that name is listed already, [`ConfigError::NoDirectory`] when the database has no
/// directory; database errors.
pub async fn add(
    client: &impl GenericClient,
    name: &str,
    server: Option<(&str, u16)>,
) -> Result<(), Error> {
    if !cell_name_ok(name) {
        return Err(ConfigError::CellName.into());
    }
    if server.is_some_and(|(host, _)| host.is_empty()) {
        return Err(ConfigError::CellServer.into());
    }
    let (host, port) = (server.map(|s| s.0), server.map(|s| i32::from(s.1)));
    let added = client
        .query_typed_opt(
            ADD_SQL,
            &[
                (&name, Type::TEXT),
                (&host, Type::TEXT),
                (&port, Type::INT4),
            ],
        )
        .await
        .map_err(missing)?;
    match added {
        Some(_) => Ok(()),
        None => Err(ConfigError::CellListed.into()),
    }
}

/// Opens (`open`) or closes cell `name` to new owners; its owners stay.
///
/// # Errors
/// [`ConfigError::UnknownCell`] when no such cell is listed; as [`add`] otherwise.
pub async fn set_open(client: &impl GenericClient, name: &str, open: bool) -> Result<(), Error> {
    let set = client
        .query_typed_opt(SET_OPEN_SQL, &[(&name, Type::TEXT), (&open, Type::BOOL)])
        .await
        .map_err(missing)?;
    set.map(drop).ok_or(ConfigError::UnknownCell.into())
}

/// Checks that the directory is built, API keys included ([`CHECK_SQL`]): what a routed API
/// checks at start-up and for readiness (a directory built by an older release lacks the keys'
/// table until `cells init` runs again).
///
/// # Errors
/// As [`add`].
pub async fn check(client: &impl GenericClient) -> Result<(), Error> {
    client.query_typed(CHECK_SQL, &[]).await.map_err(missing)?;
    Ok(())
}

/// Every cell the directory lists, by name.
///
/// # Errors
/// As [`add`].
pub async fn cells(client: &impl GenericClient) -> Result<Vec<Cell>, Error> {
    let rows = client.query_typed(LIST_SQL, &[]).await.map_err(missing)?;
    Ok(rows.iter().map(Cell::of).collect())
}

/// Cell `name` as the directory lists it.
///
/// # Errors
/// [`ConfigError::UnknownCell`] when no such cell is listed; as [`add`] otherwise.
pub async fn cell(client: &impl GenericClient, name: &str) -> Result<Cell, Error> {
    let row = client
        .query_typed_opt(CELL_SQL, &[(&name, Type::TEXT)])
        .await
        .map_err(missing)?;
    row.as_ref()
        .map(Cell::of)
        .ok_or(ConfigError::UnknownCell.into())
}

/// The cell of the owner whose key is `owner_key` (see [`crate::Jobs::owner_key`]), placing it
/// first if the directory has none for it ([`PLACE_SQL`]).
///
/// # Errors
/// [`ConfigError::NoOpenCell`] when the owner has no cell and no cell is open to new owners; as
/// [`add`] otherwise.
pub async fn place(client: &impl GenericClient, owner_key: &[u8; 32]) -> Result<String, Error> {
    let spread = i64::from(u32::from_be_bytes([
        owner_key[0],
        owner_key[1],
        owner_key[2],
        owner_key[3],
    ]));
    let key = &owner_key[..];
    let placed = client
        .query_typed_opt(PLACE_SQL, &[(&key, Type::BYTEA), (&spread, Type::INT8)])
        .await
        .map_err(missing)?;
    match placed {
        Some(row) => Ok(row.get(0)),
        // Placed by a first ask racing this one, or no open cell.
        None => find(client, owner_key)
            .await?
            .ok_or(ConfigError::NoOpenCell.into()),
    }
}

/// The cell of the owner whose key is `owner_key`, if it was placed.
///
/// # Errors
/// As [`add`].
pub async fn find(
    client: &impl GenericClient,
    owner_key: &[u8; 32],
) -> Result<Option<String>, Error> {
    let key = &owner_key[..];
    let row = client
        .query_typed_opt(FIND_SQL, &[(&key, Type::BYTEA)])
        .await
        .map_err(missing)?;
    Ok(row.map(|r| r.get(0)))
}

/// Records API key `id`, whose keyed digest is `key_digest`, of the owner whose key is
/// `owner_key` ([`ADD_KEY_SQL`]); the owner must be placed ([`place`]) first.
///
/// # Errors
/// As [`add`]; a foreign-key violation for an owner with no cell.
pub async fn add_key(
    client: &impl GenericClient,
    id: uuid::Uuid,
    key_digest: &[u8; 32],
    owner_key: &[u8; 32],
) -> Result<(), Error> {
    let (digest, owner) = (&key_digest[..], &owner_key[..]);
    client
        .execute_typed(
            ADD_KEY_SQL,
            &[
                (&id, Type::UUID),
                (&digest, Type::BYTEA),
                (&owner, Type::BYTEA),
            ],
        )
        .await
        .map_err(missing)?;
    Ok(())
}

/// The cell of the owner of API key `key`, if the directory records the key.
///
/// # Errors
/// [`Error::OwnerMoved`] while the key's owner is moving ([`moving`]); as [`add`].
pub async fn key_cell(
    client: &impl GenericClient,
    key: KeyRef<'_>,
) -> Result<Option<String>, Error> {
    let row = match key {
        KeyRef::Digest(digest) => {
            let digest = &digest[..];
            client
                .query_typed_opt(KEY_CELL_SQL, &[(&digest, Type::BYTEA)])
                .await
        }
        KeyRef::Id(id) => {
            client
                .query_typed_opt(KEY_ID_CELL_SQL, &[(&id, Type::UUID)])
                .await
        }
    };
    match row.map_err(missing)? {
        Some(row) if row.get::<_, bool>(1) => Err(Error::OwnerMoved),
        row => Ok(row.map(|r| r.get(0))),
    }
}

/// Checks that the owner whose key is `owner_key` is not moving: what a command that writes an
/// owner's rows in its cell outside the job path (an API key, a schedule) checks before it
/// writes, and again after, since a move that began meanwhile may have copied the cell before
/// the write.
///
/// # Errors
/// [`Error::OwnerMoved`] while a move of the owner has not switched it yet; as [`add`].
pub async fn settled(client: &impl GenericClient, owner_key: &[u8; 32]) -> Result<(), Error> {
    let key = &owner_key[..];
    let moving = client
        .query_typed_opt(MOVING_SQL, &[(&key, Type::BYTEA)])
        .await
        .map_err(missing)?;
    match moving {
        Some(_) => Err(Error::OwnerMoved),
        None => Ok(()),
    }
}

/// `cfg` (whose URL names the directory's database) pointed at the server of the cell it names,
/// found in the directory: what a process started with `--directory` runs on.
///
/// # Errors
/// [`ConfigError::DirectoryCell`] when `cfg` names no cell; as [`cell`] and [`Cell::config`]
/// otherwise, and connection errors.
pub async fn cell_config(cfg: &DatabaseConfig) -> Result<DatabaseConfig, Error> {
    let name = cfg.cell.as_deref().ok_or(ConfigError::DirectoryCell)?;
    // The directory's session: no cell on its search path (the directory's names are whole).
    let directory = DatabaseConfig {
        cell: None,
        ..cfg.clone()
    };
    let client = crate::db::connect(&directory, "directory").await?;
    cell(&client, name).await?.config(cfg)
}

/// A database error that says the directory's tables do not exist becomes
/// [`ConfigError::NoDirectory`]; any other stays what it is.
fn missing(e: tokio_postgres::Error) -> Error {
    let no_directory = e.as_db_error().is_some_and(|d| {
        d.code() == &tokio_postgres::error::SqlState::UNDEFINED_TABLE
            && d.message().contains("durable_etl_directory.")
    });
    if no_directory {
        ConfigError::NoDirectory.into()
    } else {
        e.into()
    }
}
