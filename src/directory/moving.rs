//! Moving an owner from one plain PostgreSQL cell to another while its jobs run
//! (`durable-etl cells move-owner`): every row of the owner (its jobs, live and ended, their
//! history, outcomes and ledger, its dead letters, schedules, target rows and API keys) goes to
//! the new cell, and the directory then names that cell for the owner.
//!
//! The move is a sequence of steps the directory records (`durable_etl_directory.moves`), each
//! of which may be run again after the mover died in it; running the command again carries the
//! move on from its step:
//!
//! 1. **fence**: in one statement, the old cell lists the owner in `etl_moved_owners` (its
//!    intake and schedules refuse the owner's rows from then on: SQLSTATE 55M02,
//!    [`Error::OwnerMoved`]) and takes the owner's schedules out into `etl_moving_rows` (no
//!    replica fires them there again); the mover then waits for every transaction of the old
//!    cell's database that was open at that moment to end, so every job of the owner the old
//!    cell will ever hold has committed there.
//! 2. **drain**: the owner's pending jobs leave the live table for `etl_moving_rows` (one
//!    statement: no replica claims them there again, and none is lost if the mover dies); its
//!    running jobs end in the old cell (or are given back, and leave in turn), until the old
//!    cell holds no live job of the owner.
//! 3. **copy**: one transaction of the new cell brings every row of the owner, makes its moving
//!    jobs and schedules its own (its replicas are woken by the jobs), and records the move's
//!    arrival (`etl_owner_arrivals`): a move that finds its arrival brings nothing again.
//! 4. **switch**: the directory names the new cell for the owner.
//! 5. **clean**: the old cell deletes the owner's rows (it keeps the owner listed as moved, so a
//!    stale enqueue there is refused), and the directory forgets the move.
//!
//! Invariants this module keeps:
//! - A job of the owner is live in at most one cell at any time: it leaves the old cell's live
//!   table before the new cell has it, and the new cell has it once (its arrival).
//! - No job of the owner commits in the old cell after the drain: its intake refuses them from
//!   the fence on, and the mover waited out every transaction that could have missed the fence.
//! - Every effect of a job that ran in the old cell (target rows, outcome, ledger) is in the new
//!   cell before any moved job runs there: the copy and the activation are one transaction.
//! - The owner's requests through a routed API answer [`Error::OwnerMoved`] (`503`) from the
//!   move's start until the switch; they then reach the new cell.
//! - One mover of an owner runs at a time (a session lock of the directory's database), so the
//!   steps are run in order, each after the one before it ended.
//! - Only cells on plain PostgreSQL servers, at the same schema version, take part; the old
//!   cell's rows of the owner are deleted only after the new cell holds them and the directory
//!   names it.

use crate::config::{ConfigError, DatabaseConfig};
use crate::error::Error;
use futures::SinkExt;
use std::time::Duration;
use tokio_postgres::types::Type;
use tokio_postgres::Client;
use uuid::Uuid;

/// The steps of a move, in order, as the directory records them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// The old cell refuses the owner's enqueues (once this step is done).
    Fence,
    /// The owner's live jobs leave the old cell.
    Drain,
    /// The new cell takes every row of the owner.
    Copy,
    /// The directory names the new cell.
    Switch,
    /// The old cell's rows of the owner are deleted.
    Clean,
}

impl Step {
    /// The step's name in the directory.
    fn as_str(self) -> &'static str {
        match self {
            Step::Fence => "fence",
            Step::Drain => "drain",
            Step::Copy => "copy",
            Step::Switch => "switch",
            Step::Clean => "clean",
        }
    }

    /// The step a directory name stands for.
    fn of(name: &str) -> Result<Step, Error> {
        Ok(match name {
            "fence" => Step::Fence,
            "drain" => Step::Drain,
            "copy" => Step::Copy,
            "switch" => Step::Switch,
            "clean" => Step::Clean,
            _ => return Err(Error::Internal),
        })
    }
}

/// What a move tells as it goes, for a command to print: never an owner, only counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// The old cell refuses the owner's enqueues, and every transaction open then has ended.
    Fenced,
    /// The owner's pending jobs were taken out of the old cell's live table (this many, so
    /// far); `running` of its jobs still run there.
    Draining {
        /// Pending jobs taken out so far.
        moved: u64,
        /// Jobs of the owner still running in the old cell.
        running: i64,
    },
    /// The new cell holds every row of the owner: `jobs` live jobs, `rows` rows in all (none
    /// when a run before this one brought them).
    Copied {
        /// The jobs made live in the new cell.
        jobs: u64,
        /// Every row brought, the live jobs included.
        rows: u64,
    },
    /// The directory names the new cell.
    Switched,
    /// The old cell's rows of the owner are deleted; the move is over.
    Done,
}

/// A move as the directory records it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Move {
    /// The move's id (its arrival in the new cell).
    id: Uuid,
    /// The cell the owner leaves.
    from: String,
    /// The cell the owner goes to.
    to: String,
    /// The step it is at.
    step: Step,
}

/// Records a move of owner `$1`, its id `$2`, from cell `$4` to cell `$3`, unless the owner is
/// not in `$4` (any more) or a move of it is recorded.
///
/// Locks: the owner's row in share mode and the new row's key (foreign keys, primary key).
const BEGIN_SQL: &str = "
INSERT INTO durable_etl_directory.moves (owner_key, id, from_cell, to_cell, step)
SELECT o.owner_key, $2, o.cell, $3, 'fence'
  FROM durable_etl_directory.owners o
 WHERE o.owner_key = $1 AND o.cell = $4
    ON CONFLICT (owner_key) DO NOTHING";

/// Takes the lock only one mover of owner `$1` holds at a time, until it gives it back
/// ([`MOVER_UNLOCK_SQL`]) or its directory session ends (a mover that dies gives it back);
/// false when another mover holds it.
///
/// Locks: a session-level advisory lock of the directory's database.
const MOVER_LOCK_SQL: &str = "
SELECT pg_try_advisory_lock(hashtext('durable_etl_directory.moves'),
                            hashtext(encode($1::bytea, 'hex')))";

/// Gives back the lock [`MOVER_LOCK_SQL`] took.
///
/// Locks: releases that advisory lock.
const MOVER_UNLOCK_SQL: &str = "
SELECT pg_advisory_unlock(hashtext('durable_etl_directory.moves'),
                          hashtext(encode($1::bytea, 'hex')))";

/// The move of owner `$1`, if one is recorded.
///
/// Locks: none.
const MOVE_SQL: &str = "
SELECT id, from_cell, to_cell, step FROM durable_etl_directory.moves WHERE owner_key = $1";

/// Moves move `$1` to step `$2`.
///
/// Locks: the move's row.
const STEP_SQL: &str = "UPDATE durable_etl_directory.moves SET step = $2 WHERE id = $1";

/// The switch of move `$1`: the owner's entry names the new cell, and the move is at its clean
/// step, in one statement.
///
/// Locks: the move's row and the owner's row.
const SWITCH_SQL: &str = "
WITH m AS (
    UPDATE durable_etl_directory.moves SET step = 'clean'
     WHERE id = $1 AND step = 'switch'
    RETURNING owner_key, from_cell, to_cell
)
UPDATE durable_etl_directory.owners o SET cell = m.to_cell
  FROM m WHERE o.owner_key = m.owner_key AND o.cell = m.from_cell";

/// Forgets move `$1`.
///
/// Locks: the move's row.
const END_SQL: &str = "DELETE FROM durable_etl_directory.moves WHERE id = $1";

/// Lists owner `$1` as moved to cell `$2` in the old cell (its intake and schedules refuse the
/// owner's rows from the commit on) and takes its schedules out into `etl_moving_rows`, whole.
///
/// Locks: the owner's row of `etl_moved_owners`; its schedules' rows (it waits for a fire that
/// holds one, which commits its job first).
const FENCE_SQL: &str = "
WITH fenced AS (
    INSERT INTO etl_moved_owners (owner_key, moved_to) VALUES ($1, $2)
        ON CONFLICT (owner_key) DO UPDATE SET moved_to = EXCLUDED.moved_to, fenced_at = now()
), taken AS (
    DELETE FROM etl_schedules WHERE owner_key = $1 RETURNING *
)
INSERT INTO etl_moving_rows (owner_key, relation, row_data)
SELECT t.owner_key, 'etl_schedules', to_jsonb(t) FROM taken t";

/// Every transaction open in this database but the session's own and autovacuum's (which
/// enqueues nothing, and may run for long): its backend and when it began.
///
/// Locks: none.
const OPEN_SQL: &str = "
SELECT pid, xact_start FROM pg_stat_activity
 WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
   AND backend_type NOT LIKE 'autovacuum%'";

/// How many of the transactions `$1` (backends) / `$2` (their beginnings) are still open.
///
/// Locks: none.
const STILL_OPEN_SQL: &str = "
SELECT count(*) FROM pg_stat_activity a
  JOIN unnest($1::int4[], $2::timestamptz[]) AS t(pid, xact_start)
    ON a.pid = t.pid AND a.xact_start = t.xact_start
 WHERE a.datname = current_database()";

/// Whether the session may see every session's transaction (`pg_stat_activity` hides other
/// roles' from a role without `pg_read_all_stats`).
///
/// Locks: none.
const SEES_ALL_SQL: &str = "
SELECT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')
    OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)";

/// Takes owner `$1`'s pending jobs out of the live table into `etl_moving_rows`, whole.
///
/// Locks: the jobs' rows (it waits for a claim or commit that holds one, then skips a job that
/// is running by then).
const STAGE_SQL: &str = "
WITH taken AS (
    DELETE FROM etl_job_records WHERE owner_key = $1 AND status = 'pending' RETURNING *
)
INSERT INTO etl_moving_rows (owner_key, relation, row_data)
SELECT t.owner_key, 'etl_job_records', to_jsonb(t) FROM taken t";

/// How many live jobs owner `$1` still has (running ones, once its pending ones were taken).
///
/// Locks: none.
const LIVE_SQL: &str = "SELECT count(*) FROM etl_job_records WHERE owner_key = $1";

/// Records move `$1` of owner `$2` in the new cell; nothing when it was recorded (the move
/// brought its rows already).
///
/// Locks: the new row's key.
const ARRIVE_SQL: &str = "
INSERT INTO etl_owner_arrivals (move_id, owner_key) VALUES ($1, $2)
    ON CONFLICT (move_id) DO NOTHING RETURNING move_id";

/// The owner's tables, each with the rows of owner `{o}` (a bytea literal) it holds, in the
/// order they are brought (a job's intake row before any row naming the job). The moving rows
/// come last, on their own (the schedules' table has none of the owner's after the fence, but is
/// read all the same).
const TABLES: [(&str, &str); 10] = [
    ("etl_job_intake", "owner_key = {o}"),
    ("etl_job_outcomes", "owner_key = {o}"),
    (
        "etl_job_attempts",
        "job_id IN (SELECT id FROM etl_job_intake WHERE owner_key = {o})",
    ),
    (
        "etl_job_cancel_deferred",
        "job_id IN (SELECT id FROM etl_job_intake WHERE owner_key = {o})",
    ),
    (
        "etl_retained_payloads",
        "job_id IN (SELECT id FROM etl_job_intake WHERE owner_key = {o})",
    ),
    ("etl_dead_letters", "owner_key = {o}"),
    ("etl_schedules", "owner_key = {o}"),
    ("etl_schedule_fires", "owner_key = {o}"),
    ("etl_target_rows", "owner_key = {o}"),
    ("etl_api_clients", "owner_key = {o}"),
];

/// The columns of table `$1` (of the session's cell), in order, quoted, comma-separated.
///
/// Locks: none.
const COLUMNS_SQL: &str = "
SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute
 WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped";

/// Makes the moving jobs (brought into `durable_etl_moving`) live in the new cell.
///
/// Locks: inserts the live rows (the enqueue trigger wakes the cell's replicas at commit).
const ACTIVATE_JOBS_SQL: &str = "
INSERT INTO etl_job_records
SELECT (jsonb_populate_record(NULL::etl_job_records, m.row_data)).* FROM durable_etl_moving m
 WHERE m.relation = 'etl_job_records'
    ON CONFLICT DO NOTHING";

/// Makes the moving schedules (brought into `durable_etl_moving`) the new cell's: its replicas
/// fire them from where the old cell left them.
///
/// Locks: inserts the schedules' rows.
const ACTIVATE_SCHEDULES_SQL: &str = "
INSERT INTO etl_schedules
SELECT (jsonb_populate_record(NULL::etl_schedules, m.row_data)).* FROM durable_etl_moving m
 WHERE m.relation = 'etl_schedules'
    ON CONFLICT DO NOTHING";

/// How long the mover waits between two looks at what it waits for.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// Moves the owner whose key is `owner_key` to cell `to`, or carries on the move of it the
/// directory records (to `to`): `directory` is a session of the directory's database, `base`
/// its connection settings (each cell's are made of them, [`super::Cell::config`]). Tells
/// `progress` what it did at each step. Returns `false` when the owner was in `to` already.
///
/// # Errors
/// [`ConfigError::UnknownCell`] for a cell the directory does not list;
/// [`ConfigError::OwnerNotPlaced`] for an owner with no cell; [`ConfigError::MoveElsewhere`]
/// when a move of the owner to another cell is recorded (carry that one on first);
/// [`ConfigError::MoveRunning`] while another mover of the owner runs;
/// [`ConfigError::MoveCells`] when a cell is on Citus or the two are at different schema
/// versions, or the old cell's role cannot see every session; as [`crate::schema::open_checked`]
/// for each cell, and database errors. Nothing is lost at any error: run the move again.
pub async fn move_owner(
    directory: &Client,
    base: &DatabaseConfig,
    owner_key: &[u8; 32],
    to: &str,
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<bool, Error> {
    super::cell(directory, to).await?;
    let owner = &owner_key[..];
    let alone: bool = directory
        .query_typed_one(MOVER_LOCK_SQL, &[(&owner, Type::BYTEA)])
        .await?
        .get(0);
    if !alone {
        return Err(ConfigError::MoveRunning.into());
    }
    let moved = carry_on(directory, base, owner_key, to, progress).await;
    // Given back whatever happened (a session that died gave it back already).
    let unlocked = directory
        .query_typed_one(MOVER_UNLOCK_SQL, &[(&owner, Type::BYTEA)])
        .await;
    let moved = moved?;
    unlocked?;
    Ok(moved)
}

/// [`move_owner`] once it holds the mover's lock.
async fn carry_on(
    directory: &Client,
    base: &DatabaseConfig,
    owner_key: &[u8; 32],
    to: &str,
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<bool, Error> {
    let owner = &owner_key[..];
    let recorded = recorded(directory, owner).await?;
    let from = match &recorded {
        Some(mv) if mv.to != to => return Err(ConfigError::MoveElsewhere.into()),
        Some(mv) => mv.from.clone(),
        None => match super::find(directory, owner_key).await? {
            None => return Err(ConfigError::OwnerNotPlaced.into()),
            Some(cell) if cell == to => return Ok(false),
            Some(cell) => cell,
        },
    };
    // Both cells are checked before anything is written.
    let mut from_cell = open_cell(directory, base, &from).await?;
    let mut into = open_cell(directory, base, to).await?;
    let version = crate::schema::check_compatible(&from_cell).await?;
    let sees_all: bool = from_cell.query_typed_one(SEES_ALL_SQL, &[]).await?.get(0);
    if crate::schema::check_compatible(&into).await? != version || !sees_all {
        return Err(ConfigError::MoveCells.into());
    }
    let mv = match recorded {
        Some(mv) => mv,
        None => begin(directory, owner, &from, to).await?,
    };
    let from = &mut from_cell;
    let mut step = mv.step;
    if step == Step::Fence {
        fence(from, owner, &mv.to).await?;
        crash_point!("move.fenced");
        progress(Progress::Fenced);
        step = next(directory, &mv, Step::Drain).await?;
    }
    if step == Step::Drain {
        drain(from, owner, progress).await?;
        crash_point!("move.drained");
        step = next(directory, &mv, Step::Copy).await?;
    }
    if step == Step::Copy {
        let (jobs, rows) = copy(from, &mut into, owner, mv.id).await?;
        crash_point!("move.copied");
        progress(Progress::Copied { jobs, rows });
        step = next(directory, &mv, Step::Switch).await?;
    }
    if step == Step::Switch {
        directory
            .execute_typed(SWITCH_SQL, &[(&mv.id, Type::UUID)])
            .await?;
        crash_point!("move.switched");
        progress(Progress::Switched);
    }
    clean(from, owner).await?;
    directory
        .execute_typed(END_SQL, &[(&mv.id, Type::UUID)])
        .await?;
    progress(Progress::Done);
    Ok(true)
}

/// The move of `owner` the directory records, if any.
async fn recorded(directory: &Client, owner: &[u8]) -> Result<Option<Move>, Error> {
    let row = directory
        .query_typed_opt(MOVE_SQL, &[(&owner, Type::BYTEA)])
        .await
        .map_err(super::missing)?;
    row.map(|row| {
        Ok(Move {
            id: row.get(0),
            from: row.get(1),
            to: row.get(2),
            step: Step::of(row.get(3))?,
        })
    })
    .transpose()
}

/// Records a new move of `owner` from cell `from` to `to` and returns it: the one recorded by
/// a mover racing this one, if there is one (and it goes to `to`).
async fn begin(directory: &Client, owner: &[u8], from: &str, to: &str) -> Result<Move, Error> {
    let id = Uuid::now_v7();
    directory
        .execute_typed(
            BEGIN_SQL,
            &[
                (&owner, Type::BYTEA),
                (&id, Type::UUID),
                (&to, Type::TEXT),
                (&from, Type::TEXT),
            ],
        )
        .await?;
    match recorded(directory, owner).await? {
        Some(mv) if mv.to == to => Ok(mv),
        _ => Err(ConfigError::MoveElsewhere.into()),
    }
}

/// A session of cell `name`, on plain PostgreSQL.
async fn open_cell(directory: &Client, base: &DatabaseConfig, name: &str) -> Result<Client, Error> {
    let cfg = super::cell(directory, name).await?.config(base)?;
    let client = crate::db::connect(&cfg, "admin").await?;
    if crate::db::check_cell(&client, &cfg).await?.is_some() {
        return Err(ConfigError::MoveCells.into());
    }
    Ok(client)
}

/// Records that move `mv` is at `step`, and returns it.
async fn next(directory: &Client, mv: &Move, step: Step) -> Result<Step, Error> {
    let name = step.as_str();
    directory
        .execute_typed(STEP_SQL, &[(&mv.id, Type::UUID), (&name, Type::TEXT)])
        .await?;
    Ok(step)
}

/// The fence step on the old cell's session `from`: lists the owner as moved to `to` and takes
/// its schedules out, then waits until every transaction open at that commit has ended.
async fn fence(from: &Client, owner: &[u8], to: &str) -> Result<(), Error> {
    from.execute_typed(FENCE_SQL, &[(&owner, Type::BYTEA), (&to, Type::TEXT)])
        .await?;
    let open = from.query_typed(OPEN_SQL, &[]).await?;
    let pids: Vec<i32> = open.iter().map(|r| r.get(0)).collect();
    let starts: Vec<chrono::DateTime<chrono::Utc>> = open.iter().map(|r| r.get(1)).collect();
    loop {
        let still: i64 = from
            .query_typed_one(
                STILL_OPEN_SQL,
                &[
                    (&pids, Type::INT4_ARRAY),
                    (&starts, Type::TIMESTAMPTZ_ARRAY),
                ],
            )
            .await?
            .get(0);
        if still == 0 {
            return Ok(());
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

/// The drain step on the old cell's session `from`: takes the owner's pending jobs out of the
/// live table until it holds none of the owner's jobs, its running ones having ended.
async fn drain(
    from: &Client,
    owner: &[u8],
    progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<(), Error> {
    let mut moved = 0;
    let mut told = None;
    loop {
        moved += from
            .execute_typed(STAGE_SQL, &[(&owner, Type::BYTEA)])
            .await?;
        let running: i64 = from
            .query_typed_one(LIVE_SQL, &[(&owner, Type::BYTEA)])
            .await?
            .get(0);
        if told != Some((moved, running)) {
            progress(Progress::Draining { moved, running });
            told = Some((moved, running));
        }
        if running == 0 {
            return Ok(());
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

/// The copy step: in one transaction of the new cell's session `into`, unless the move's arrival
/// is recorded there already, brings every row of the owner from the old cell's session `from`
/// (each table streamed in PostgreSQL's binary copy format), then makes the moving rows its own.
/// Returns the jobs made live and the rows brought in all.
async fn copy(
    from: &mut Client,
    into: &mut Client,
    owner: &[u8],
    move_id: Uuid,
) -> Result<(u64, u64), Error> {
    let tx = into.transaction().await?;
    let arrived = tx
        .query_typed_opt(ARRIVE_SQL, &[(&move_id, Type::UUID), (&owner, Type::BYTEA)])
        .await?;
    if arrived.is_none() {
        return Ok((0, 0));
    }
    // An owner that lived here before is listed as moved: it is here again.
    tx.execute_typed(
        "DELETE FROM etl_moved_owners WHERE owner_key = $1",
        &[(&owner, Type::BYTEA)],
    )
    .await?;
    let literal = format!("'\\x{}'::bytea", hex(owner));
    let mut rows = 0;
    for (table, filter) in TABLES {
        let filter = filter.replace("{o}", &literal);
        rows += bring(from, &tx, table, &filter).await?;
    }
    let taken =
        format!("SELECT relation, row_data FROM etl_moving_rows WHERE owner_key = {literal}");
    tx.batch_execute(
        "CREATE TEMP TABLE durable_etl_moving (relation text, row_data jsonb) ON COMMIT DROP",
    )
    .await?;
    stream(from, &tx, &taken, "durable_etl_moving (relation, row_data)").await?;
    let schedules = tx.execute(ACTIVATE_SCHEDULES_SQL, &[]).await?;
    let jobs = tx.execute(ACTIVATE_JOBS_SQL, &[]).await?;
    tx.commit().await?;
    Ok((jobs, rows + schedules + jobs))
}

/// Brings the rows of `table` that `filter` selects from the old cell's session `from` into the
/// new cell's transaction `tx` (through a temporary table, each row inserted unless a row with
/// its key is there). Returns how many were inserted.
async fn bring(
    from: &Client,
    tx: &tokio_postgres::Transaction<'_>,
    table: &str,
    filter: &str,
) -> Result<u64, Error> {
    let columns: Option<String> = from
        .query_typed_one(COLUMNS_SQL, &[(&table, Type::TEXT)])
        .await?
        .get(0);
    let columns = columns.ok_or(Error::Internal)?;
    let temp = format!("durable_etl_moving_{table}");
    tx.batch_execute(&format!(
        "CREATE TEMP TABLE {temp} (LIKE {table}) ON COMMIT DROP"
    ))
    .await?;
    let select = format!("SELECT {columns} FROM {table} WHERE {filter}");
    stream(from, tx, &select, &format!("{temp} ({columns})")).await?;
    let inserted = tx
        .execute(
            &format!(
                "INSERT INTO {table} ({columns}) SELECT {columns} FROM {temp} ON CONFLICT DO NOTHING"
            ),
            &[],
        )
        .await?;
    Ok(inserted)
}

/// Streams what `select` reads on `from` into `target` (a table and its columns) on `tx`, in
/// PostgreSQL's binary copy format.
async fn stream(
    from: &Client,
    tx: &tokio_postgres::Transaction<'_>,
    select: &str,
    target: &str,
) -> Result<(), Error> {
    let out = from
        .copy_out(&format!("COPY ({select}) TO STDOUT (FORMAT binary)"))
        .await?;
    let sink = tx
        .copy_in(&format!("COPY {target} FROM STDIN (FORMAT binary)"))
        .await?;
    let mut sink = std::pin::pin!(sink);
    let mut out = std::pin::pin!(out);
    sink.send_all(&mut out).await?;
    sink.as_mut().finish().await?;
    Ok(())
}

/// The clean step on the old cell's session `from`: deletes the owner's rows (the moving rows
/// included) in one transaction, rows naming a job before the job's intake row; the owner stays
/// listed as moved.
async fn clean(from: &mut Client, owner: &[u8]) -> Result<(), Error> {
    let tx = from.transaction().await?;
    let literal = format!("'\\x{}'::bytea", hex(owner));
    for (table, filter) in TABLES.iter().rev() {
        let filter = filter.replace("{o}", &literal);
        tx.batch_execute(&format!("DELETE FROM {table} WHERE {filter}"))
            .await?;
    }
    tx.execute_typed(
        "DELETE FROM etl_moving_rows WHERE owner_key = $1",
        &[(&owner, Type::BYTEA)],
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// `bytes` in lowercase hexadecimal.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_step_is_read_back_from_its_name_and_an_unknown_name_is_a_bug() {
        for step in [
            Step::Fence,
            Step::Drain,
            Step::Copy,
            Step::Switch,
            Step::Clean,
        ] {
            assert_eq!(Step::of(step.as_str()).unwrap(), step);
        }
        assert!(matches!(Step::of("elsewhere"), Err(Error::Internal)));
    }

    #[tokio::test]
    async fn one_mover_of_an_owner_runs_at_a_time_and_gives_its_lock_back_when_it_stops() {
        let db = crate::test_db::TestDb::migrated().await;
        let client = db.client().await;
        super::super::init(&client).await.unwrap();
        super::super::add(&client, "cell_a", None).await.unwrap();
        let owner = [7; 32];
        let key = &owner[..];
        // Another process moving the owner holds the lock: this mover is refused.
        let other = db.client().await;
        let held: bool = other
            .query_one(MOVER_LOCK_SQL, &[&key])
            .await
            .unwrap()
            .get(0);
        assert!(held);
        let refused = move_owner(&client, &db.config, &owner, "cell_a", &mut |_| {}).await;
        assert!(
            matches!(refused, Err(Error::Config(ConfigError::MoveRunning))),
            "{refused:?}"
        );
        other.query_one(MOVER_UNLOCK_SQL, &[&key]).await.unwrap();
        // A mover that stops (here: an owner with no cell) gives the lock back.
        let stopped = move_owner(&client, &db.config, &owner, "cell_a", &mut |_| {}).await;
        assert!(
            matches!(stopped, Err(Error::Config(ConfigError::OwnerNotPlaced))),
            "{stopped:?}"
        );
        let free: bool = other
            .query_one(MOVER_LOCK_SQL, &[&key])
            .await
            .unwrap()
            .get(0);
        assert!(free, "the stopped mover kept its lock");
    }

    #[test]
    fn bytes_are_spelled_in_lowercase_hexadecimal() {
        assert_eq!(hex(&[0x00, 0x0f, 0xab, 0xff]), "000fabff");
    }
}
