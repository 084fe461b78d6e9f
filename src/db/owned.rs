//! Throw-away databases that a tool (`demo`, `bench`, the examples) creates, recreates and drops.
//!
//! Invariants this module keeps:
//! - A tool drops only a database it created: each one it creates carries its marker as the
//!   database's comment ([`marker`]), and one without the tool's marker is never dropped
//!   ([`Taken::NotCreated`]).
//! - A tool never drops a database in use: a marked database that another session is connected
//!   to is left alone ([`Taken::InUse`]), and the drop that recreates one never forces sessions
//!   out. Only [`drop_created`], which drops the very database ([`CreatedDatabase::oid`]) its
//!   caller created, disconnects sessions.
//! - Two runs on one name never drop each other's database: the check, the drop, the creation
//!   and the tool's first session into the new database happen under one advisory lock per name
//!   (taken in the server's `postgres` database, which every run's maintenance session uses), so
//!   a second run finds the first's database marked and in use, and refuses.

use super::{connect, dbname};
use crate::config::DatabaseConfig;
use crate::error::{Error, Taken};
use dbname::quote_ident;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

/// The first key of the advisory lock a tool takes on a database name (`dura`, as ASCII); the
/// second is the name's hash.
const NAME_LOCK_CLASS: i32 = 0x6475_7261;

/// The comment a tool writes on a database it creates, and checks before it drops one.
pub fn marker(tool: &str) -> String {
    format!("created by durable-etl {tool}, which may drop and recreate it")
}

/// A database a tool just created.
pub struct CreatedDatabase {
    /// The base configuration pointed at the new database.
    pub config: DatabaseConfig,
    /// The tool's first session in it: opened before any other run may look at the name.
    pub session: Client,
    /// The database's identity: [`super::drop_created`] drops it only if the name still has it.
    pub oid: u32,
}

/// Creates, through `admin` (a session on the maintenance database), database `name` for `tool` on the server of `base`, marked as the tool's, and opens
/// the tool's first session in it (application name `durable-etl/<role>`). A database of that
/// name that the tool created before and that no session uses is dropped first.
///
/// # Errors
/// [`Error::DatabaseTaken`] when a database of that name exists that `tool` did not create, or
/// that a session uses (another run of the tool, say): nothing is dropped. [`Error::Config`] for
/// a bad URL; [`Error::Unavailable`] when no server answers; [`Error::Database`] from the server.
pub(super) async fn recreate_on(
    admin: Client,
    base: &DatabaseConfig,
    name: &str,
    tool: &'static str,
    role: &str,
) -> Result<CreatedDatabase, Error> {
    let config = DatabaseConfig {
        url: dbname::with_dbname(&base.url, name)?,
        ..base.clone()
    };
    let taken = |reason| Error::DatabaseTaken {
        name: name.to_owned(),
        tool,
        reason,
    };
    lock_name(&admin, name)
        .await
        .map_err(|e| in_use_or(e, taken(Taken::InUse)))?;
    let name_sql = quote_ident(name);
    if let Some(found) = look_up(&admin, name).await? {
        if found.comment.as_deref() != Some(marker(tool).as_str()) {
            return Err(taken(Taken::NotCreated));
        }
        if found.sessions > 0 {
            return Err(taken(Taken::InUse));
        }
        // Without FORCE: a session that connected since the look-up makes it fail, not go.
        admin
            .batch_execute(&format!("DROP DATABASE {name_sql}"))
            .await
            .map_err(|e| in_use_or(Error::from(e), taken(Taken::InUse)))?;
    }
    match admin
        .batch_execute(&format!("CREATE DATABASE {name_sql}"))
        .await
    {
        // Created meanwhile by something that does not take the lock: not ours.
        Err(e) if e.code() == Some(&SqlState::DUPLICATE_DATABASE) => {
            return Err(taken(Taken::NotCreated))
        }
        created => created?,
    }
    let comment = marker(tool).replace('\'', "''");
    admin
        .batch_execute(&format!("COMMENT ON DATABASE {name_sql} IS '{comment}'"))
        .await?;
    let oid = look_up(&admin, name)
        .await?
        .map(|found| found.oid)
        .ok_or(Error::Internal)?;
    let session = connect(&config, role).await?;
    // Closing the maintenance session releases the name's lock, now that the tool is in.
    drop(admin);
    Ok(CreatedDatabase {
        config,
        session,
        oid,
    })
}

/// Drops, through `admin` (a session on the maintenance database), database `name` (disconnecting its sessions) if it is still
/// the one of identity `oid` that [`recreate_on`] created; returns whether it dropped it.
///
/// # Errors
/// As [`recreate_on`].
pub(super) async fn drop_created_on(admin: Client, name: &str, oid: u32) -> Result<bool, Error> {
    lock_name(&admin, name).await?;
    match look_up(&admin, name).await? {
        Some(found) if found.oid == oid => {
            admin
                .batch_execute(&format!(
                    "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                    quote_ident(name)
                ))
                .await?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// A database as the maintenance session sees it.
struct Found {
    /// Its identity.
    oid: u32,
    /// Its comment.
    comment: Option<String>,
    /// The client sessions connected to it (background workers such as autovacuum's, which a
    /// drop ends, are not counted).
    sessions: i64,
}

/// Database `name`, if it exists. Locks: none.
async fn look_up(admin: &Client, name: &str) -> Result<Option<Found>, Error> {
    let row = admin
        .query_typed_opt(
            "SELECT d.oid, shobj_description(d.oid, 'pg_database'),
                    (SELECT count(*) FROM pg_stat_activity a
                      WHERE a.datid = d.oid AND a.backend_type = 'client backend')
               FROM pg_database d WHERE d.datname = $1",
            &[(&name, Type::TEXT)],
        )
        .await?;
    Ok(row.map(|row| Found {
        oid: row.get(0),
        comment: row.get(1),
        sessions: row.get(2),
    }))
}

/// Takes the session-level advisory lock on `name` (in the maintenance database), waiting at
/// most the session's `lock_timeout`. Released when the session closes.
async fn lock_name(admin: &Client, name: &str) -> Result<(), Error> {
    admin
        .query_typed(
            "SELECT pg_advisory_lock($1, hashtext($2))",
            &[(&NAME_LOCK_CLASS, Type::INT4), (&name, Type::TEXT)],
        )
        .await?;
    Ok(())
}

/// `taken` when `e` says a lock or the database was held by others (another run); else `e`.
fn in_use_or(e: Error, taken: Error) -> Error {
    let code = e.db_code();
    if code == Some(&SqlState::LOCK_NOT_AVAILABLE) || code == Some(&SqlState::OBJECT_IN_USE) {
        taken
    } else {
        e
    }
}
