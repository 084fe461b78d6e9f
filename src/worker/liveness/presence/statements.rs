//! The presence statements: the SQL each presence change runs on `etl_waiting_replicas` (an
//! UNLOGGED table: no WAL), and how a claim session sends them, pipelined before its claim.
//!
//! Invariants this module keeps:
//! - No statement here ever waits for an enqueue transaction: the registration skips a row
//!   another transaction holds (and says it wrote nothing), and the barrier is only tried, never
//!   waited for.
//! - Each statement runs in its own implicit transaction, so the registration's row is committed
//!   before the try of the barrier that follows it, and the claim after the try reads a snapshot
//!   taken after it.
//! - A claim session prepares the registration and the try once; behind a transaction-mode pooler
//!   nothing is prepared and each is sent unnamed.

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Statement};

/// Records owner `$1` as waiting for work of the queues `$2` and kinds `$3`, to be woken by a
/// NOTIFY of its wake token `$4`, or refreshes its row (parked or not). The enqueue trigger takes
/// the row of a waiting replica that serves an enqueued due job's queue and runs its kind, parks
/// it, and notifies its token (migrations 0024 and 0027).
///
/// A row an open enqueue has taken is left alone (`SKIP LOCKED`, and no insert while the row is
/// visible): that enqueue's NOTIFY, at its commit, wakes the replica, which registers again then.
/// So the statement never waits for an enqueue transaction, however long it stays open (an
/// upsert would, and with it the claim pipelined behind it).
///
/// Answers how many rows it wrote (0 or 1). It writes none when another transaction holds the
/// row: an enqueue taking it (whose NOTIFY then wakes the replica), recovery deleting it as
/// stale, or any other writer that will never notify. So an unwritten registration is not a
/// registration: the replica tries again, as after a held barrier (a replica that counted itself
/// waiting behind a row it did not write could be deaf until its poll).
///
/// Locks: the row's lock, if no other transaction holds it, to the end of its own implicit
/// transaction; an enqueue that would take the row meanwhile skips it. The table is UNLOGGED: no
/// WAL.
pub(crate) const REGISTER_SQL: &str = "
WITH held AS (
    SELECT w.owner_id FROM etl_waiting_replicas w WHERE w.owner_id = $1 FOR UPDATE SKIP LOCKED
), refreshed AS (
    UPDATE etl_waiting_replicas w
       SET refreshed_at = now(), queues = $2, kinds = $3, wake_token = $4
      FROM held h
     WHERE w.owner_id = h.owner_id
    RETURNING 1
), inserted AS (
    INSERT INTO etl_waiting_replicas (owner_id, queues, kinds, wake_token)
    SELECT $1, $2, $3, $4
     WHERE NOT EXISTS (SELECT 1 FROM etl_waiting_replicas w WHERE w.owner_id = $1)
        ON CONFLICT (owner_id) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM refreshed) + (SELECT count(*) FROM inserted)";

/// Tries the enqueue barrier ('detl', 1) in exclusive mode, and releases it at once (its implicit
/// transaction ends with the statement): true when no enqueue transaction holds it.
///
/// Locks: none held after the statement; the try never waits, so it never queues an enqueue.
pub(crate) const SETTLE_SQL: &str = "SELECT pg_try_advisory_xact_lock(1684370540, 1)";

/// Parks owner `$1`'s row, unless it is parked already: the replica no longer waits, and its
/// next registration updates the same row (migration 0027).
///
/// Locks: the row's lock, to the end of its own implicit transaction (waiting for an enqueue that
/// is taking it, as a delete would). The table is UNLOGGED: no WAL.
pub(crate) const PARK_SQL: &str = "
UPDATE etl_waiting_replicas SET queues = '{}', kinds = '{}'
 WHERE owner_id = $1 AND queues IS DISTINCT FROM '{}'";

/// Deletes owner `$1`'s row: the replica stops.
///
/// Locks: the row's lock, to the end of its own implicit transaction.
pub(crate) const LEAVE_SQL: &str = "DELETE FROM etl_waiting_replicas WHERE owner_id = $1";

/// Deletes the rows nobody refreshed for `$1` milliseconds (the presence module's `STALE_AFTER`): replicas that died
/// while waiting.
///
/// Locks: the lock of each deleted row; a row its replica refreshes meanwhile is re-checked
/// against its new `refreshed_at` and kept.
pub(crate) const FORGET_STALE_SQL: &str = "
DELETE FROM etl_waiting_replicas WHERE refreshed_at < now() - $1 * interval '1 millisecond'";

/// What a registration answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Registered {
    /// The registration wrote the row (no other transaction held it); a [`Change::Settle`]
    /// answers true (the registration it settles wrote the row).
    pub(crate) written: bool,
    /// The try of the enqueue barrier succeeded (no enqueue transaction held it).
    pub(crate) free: bool,
}

/// A presence change, sent before a claim on the claim's connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Upsert the row, then try the barrier.
    Register,
    /// Try the barrier again, the row being written already (a retry after a held barrier): a
    /// retry sends it alone, and claims only once it succeeds.
    Settle,
    /// Park the row ([`PARK_SQL`]).
    Park,
}

/// The presence statements a claim session prepares once ([`REGISTER_SQL`], [`SETTLE_SQL`]):
/// a wake's registration then costs no parse or plan. Behind a transaction-mode pooler nothing
/// is prepared ([`Statements::unnamed`]) and each is sent unnamed.
#[derive(Debug)]
pub(crate) struct Statements {
    /// [`REGISTER_SQL`] and [`SETTLE_SQL`] prepared, or `None` to send them unnamed.
    prepared: Option<(Statement, Statement)>,
}

/// The types of [`REGISTER_SQL`]'s parameters.
const REGISTER_PARAMS: [Type; 4] = [Type::TEXT, Type::TEXT_ARRAY, Type::TEXT_ARRAY, Type::INT8];

impl Statements {
    /// Prepares them on `client`.
    ///
    /// # Errors
    /// The database error of a statement.
    pub(crate) async fn prepare(client: &Client) -> Result<Statements, tokio_postgres::Error> {
        let register = client.prepare_typed(REGISTER_SQL, &REGISTER_PARAMS).await?;
        let settle = client.prepare_typed(SETTLE_SQL, &[]).await?;
        Ok(Statements {
            prepared: Some((register, settle)),
        })
    }

    /// None prepared: each is sent unnamed (behind a transaction-mode pooler).
    pub(crate) fn unnamed() -> Statements {
        Statements { prepared: None }
    }
}

/// Sends `change` for `owner_id` on `client` (whose session prepared `statements`), to be
/// pipelined before a claim on the same client: every statement is queued when this future is
/// first polled, so poll it before the claim.
///
/// # Errors
/// The database error of a statement.
pub(crate) async fn send(
    client: &Client,
    statements: &Statements,
    change: Change,
    owner_id: &str,
    (queues, kinds): (&[&str], &[&str]),
    wake_token: i64,
) -> Result<Registered, tokio_postgres::Error> {
    match change {
        Change::Register => {
            let params: [&(dyn ToSql + Sync); 4] = [&owner_id, &queues, &kinds, &wake_token];
            let (registered, settled) = match &statements.prepared {
                Some((register, settle)) => {
                    futures::join!(client.query(register, &params), client.query(settle, &[]))
                }
                None => {
                    let typed: Vec<_> = params.into_iter().zip(REGISTER_PARAMS).collect();
                    futures::join!(
                        client.query_typed(REGISTER_SQL, &typed),
                        client.query_typed(SETTLE_SQL, &[])
                    )
                }
            };
            let written = first_column(&registered?)?.is_some_and(|rows: i64| rows > 0);
            let free = first_column(&settled?)?.unwrap_or(false);
            Ok(Registered { written, free })
        }
        Change::Settle => {
            let settled = match &statements.prepared {
                Some((_, settle)) => client.query(settle, &[]).await,
                None => client.query_typed(SETTLE_SQL, &[]).await,
            };
            let free = first_column(&settled?)?.unwrap_or(false);
            Ok(Registered {
                written: true,
                free,
            })
        }
        Change::Park => {
            client
                .execute_typed(PARK_SQL, &[(&owner_id, Type::TEXT)])
                .await?;
            Ok(Registered {
                written: true,
                free: true,
            })
        }
    }
}

/// The first column of the first of `rows`, if there is one.
///
/// # Errors
/// The column's value does not convert to `T`.
fn first_column<'a, T: tokio_postgres::types::FromSql<'a>>(
    rows: &'a [tokio_postgres::Row],
) -> Result<Option<T>, tokio_postgres::Error> {
    rows.first().map(|row| row.try_get(0)).transpose()
}

/// Deletes `owner_id`'s waiting row on `client` ([`LEAVE_SQL`]): the replica stops.
///
/// # Errors
/// The database error of the statement.
pub(crate) async fn leave(client: &Client, owner_id: &str) -> Result<(), tokio_postgres::Error> {
    client
        .execute_typed(LEAVE_SQL, &[(&owner_id, Type::TEXT)])
        .await
        .map(drop)
}
