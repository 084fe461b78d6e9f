//! Cells on Citus: which node holds a cell's tables, and the node views through which the
//! cell's processes on that node reach them.
//!
//! With schema-based sharding a cell's schema is one colocated group of single-shard tables on
//! one worker node. Through Citus's planner a statement on those tables is deparsed and planned
//! twice, and the statements that end or recover a job (several data-modifying CTEs) are planned
//! recursively, which Citus cannot always deparse. So on the node that holds the cell, the cell's
//! processes reach the shard tables themselves, as PostgreSQL does on a plain server: through
//! a view per table, in a schema of the node's own ([`node_schema`], `_` and the cell's name, a
//! name no cell can take), which every session of the cell puts before the cell on its
//! `search_path`. Elsewhere (the coordinator, plain PostgreSQL) that schema does not exist and
//! the session finds the cell's tables.
//!
//! Invariants this module keeps:
//! - The node views are built only on the node that holds the cell, from Citus's metadata, in one
//!   transaction under an advisory lock, and rebuilt when the cell's tables, columns or shards
//!   differ from what they were built from (a digest kept as the schema's comment) or a view is
//!   missing (a shard moved away drops its view, and may come back); nothing is rebuilt
//!   otherwise, so replicas starting together do not disturb each other.
//! - A cell's sessions never reach its tables through Citus's distributed execution
//!   (`citus.use_secondary_nodes = always`, set by `db`): on a node that no longer holds the cell
//!   every statement on its tables fails, and the replica asks where the cell went.
//! - Every write a cell's process makes through the node views is fenced as Citus fences its own:
//!   a statement-level trigger on each shard table takes the shard's metadata lock in share mode
//!   (`lock_shard_metadata`, the lock a shard move takes exclusively while it switches the shard
//!   over) and checks that the shard is still placed on this node; a write after a move fails
//!   with [`CELL_MOVED`] and its whole transaction rolls back, so no commit lands on a shard copy
//!   that the move left behind. A transaction that passed the fence holds the lock until it ends,
//!   so the move waits for it and carries its writes over.
//! - Nothing here touches the cell's tables or Citus's metadata: the views, the fence function and
//!   the fence triggers are this module's own, and dropping the node schema removes all of them.

use crate::config::DatabaseConfig;
use crate::error::Error;
use tokio_postgres::GenericClient;

/// The SQLSTATE a write through the node views fails with once the cell's shards have moved to
/// another node ([`crate::error::CELL_MOVED`]).
pub const CELL_MOVED: &str = crate::error::CELL_MOVED;

/// The schema of a cell's node views: `_` followed by the cell's name. A cell's name starts with
/// a letter (`config::cell_name_ok`), so no cell can take it.
pub fn node_schema(cell: &str) -> String {
    format!("_{cell}")
}

/// Where a cell's tables live, as the node a session is connected to sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Not on Citus: plain PostgreSQL, or the cell's tables are not distributed.
    Plain,
    /// On this node.
    Here,
    /// On another node of the cluster, at `host`:`port`.
    Elsewhere {
        /// The node's host name, as Citus's metadata names it.
        host: String,
        /// The node's port.
        port: u16,
    },
}

/// Whether the database has Citus's metadata.
///
/// Locks: none.
const HAS_CITUS_SQL: &str = "SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL";

/// The primary node that holds the shard of cell `$1`'s job table, and whether it is this one.
/// No row when the table is not distributed.
///
/// Locks: none (reads Citus's metadata tables).
const LOCATE_SQL: &str = "
SELECT n.nodename, n.nodeport, n.groupid = (SELECT groupid FROM pg_dist_local_group)
  FROM pg_dist_shard s
  JOIN pg_dist_placement p ON p.shardid = s.shardid
  JOIN pg_dist_node n ON n.groupid = p.groupid AND n.noderole = 'primary'
 WHERE s.logicalrelid = to_regclass(quote_ident($1) || '.etl_job_records')";

/// Where cell `cell`'s tables live, asked of the node `client` is connected to.
///
/// # Errors
/// Database errors.
pub async fn locate(client: &impl GenericClient, cell: &str) -> Result<Placement, Error> {
    let citus: bool = client.query_one(HAS_CITUS_SQL, &[]).await?.get(0);
    if !citus {
        return Ok(Placement::Plain);
    }
    let Some(row) = client.query_opt(LOCATE_SQL, &[&cell]).await? else {
        return Ok(Placement::Plain);
    };
    if row.get(2) {
        return Ok(Placement::Here);
    }
    let port: i32 = row.get(1);
    Ok(Placement::Elsewhere {
        host: row.get(0),
        port: u16::try_from(port).map_err(|_| Error::Internal)?,
    })
}

/// Builds cell `:cell`'s node views and fences on this node, in one transaction, unless they
/// are already built from the cell's current tables (see the module's invariants). The text
/// `:cell` is replaced by the cell's name, which needs no quoting (`config::cell_name_ok`).
///
/// Locks: an advisory transaction lock of the cell's node views; when it rebuilds, `ACCESS
/// EXCLUSIVE` on the old views and the new schema, and `SHARE ROW EXCLUSIVE` on each shard
/// table while its fence trigger is created (a moment; claims and commits wait for it).
const READY_SQL: &str = r#"
DO $ready$
DECLARE
    cell constant text := ':cell';
    views constant text := '_:cell';
    built text;
    tables int;
    cell_views int;
    view_names text[];
    view_bodies text[];
    t record;
    c record;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('durable_etl.node_views.' || cell));
    -- The cell's own views print with its tables' names unqualified, to be read again through
    -- the node views.
    PERFORM set_config('search_path', cell, true);
    SELECT md5(string_agg(format('%s/%s/%s', r.relname, s.shardid,
                   (SELECT string_agg(a.attname || ':' || format_type(a.atttypid, a.atttypmod)
                                      || ':' || a.attidentity::text, ',' ORDER BY a.attnum)
                      FROM pg_attribute a
                     WHERE a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped)),
                   ';' ORDER BY r.relname)),
           count(*)
      INTO built, tables
      FROM pg_dist_shard s
      JOIN pg_class r ON r.oid = s.logicalrelid
      JOIN pg_dist_placement p ON p.shardid = s.shardid
     WHERE r.relnamespace = to_regnamespace(cell)
       AND p.groupid = (SELECT groupid FROM pg_dist_local_group);
    IF built IS NULL THEN
        RAISE EXCEPTION 'the cell is not on this node' USING ERRCODE = '55M01';
    END IF;
    SELECT array_agg(v.relname ORDER BY v.oid), array_agg(pg_get_viewdef(v.oid) ORDER BY v.oid)
      INTO view_names, view_bodies
      FROM pg_class v
     WHERE v.relnamespace = to_regnamespace(cell) AND v.relkind = 'v';
    cell_views := coalesce(cardinality(view_names), 0);
    -- What this release builds, too: a release that builds them otherwise rebuilds them.
    built := md5('node views 1;' || built
                 || coalesce(array_to_string(view_names || view_bodies, ';'), ''));
    -- Built from these tables, and whole: a shard dropped since (moved away and back) took
    -- its view with it.
    IF built IS NOT DISTINCT FROM obj_description(to_regnamespace(views), 'pg_namespace')
       AND tables + cell_views = (SELECT count(*) FROM pg_class
                      WHERE relnamespace = to_regnamespace(views) AND relkind = 'v') THEN
        RETURN;
    END IF;
    -- The views are this node's own: not distributed, not sent to other nodes.
    PERFORM set_config('citus.enable_ddl_propagation', 'off', true);
    PERFORM set_config('citus.enable_schema_based_sharding', 'off', true);
    PERFORM set_config('citus.enable_manual_changes_to_shards', 'on', true);
    EXECUTE format('DROP SCHEMA IF EXISTS %I CASCADE', views);
    EXECUTE format('CREATE SCHEMA %I', views);
    EXECUTE format($fence$
        CREATE FUNCTION %I.durable_etl_node_fence() RETURNS trigger LANGUAGE plpgsql AS $body$
        BEGIN
            PERFORM lock_shard_metadata(5, ARRAY[TG_ARGV[0]::int8]);
            IF NOT EXISTS (SELECT 1 FROM pg_dist_placement
                            WHERE shardid = TG_ARGV[0]::int8
                              AND groupid = (SELECT groupid FROM pg_dist_local_group)) THEN
                RAISE EXCEPTION 'the cell has moved to another node' USING ERRCODE = '55M01';
            END IF;
            RETURN NULL;
        END
        $body$ $fence$, views);
    FOR t IN
        SELECT r.oid, r.relname, s.shardid, format('%I.%I', cell, r.relname || '_' || s.shardid) AS shard
          FROM pg_dist_shard s
          JOIN pg_class r ON r.oid = s.logicalrelid
          JOIN pg_dist_placement p ON p.shardid = s.shardid
         WHERE r.relnamespace = to_regnamespace(cell)
           AND p.groupid = (SELECT groupid FROM pg_dist_local_group)
    LOOP
        -- The row versions' transaction ids too, which statements read as they would off the
        -- table (an upsert's `xmax = 0` tells an insert from an update).
        EXECUTE format('CREATE VIEW %I.%I AS SELECT *, xmin, xmax FROM %s', views, t.relname,
                       t.shard);
        EXECUTE format('CREATE TRIGGER durable_etl_node_fence BEFORE INSERT OR UPDATE OR DELETE '
                       'ON %s FOR EACH STATEMENT EXECUTE FUNCTION %I.durable_etl_node_fence(%L)',
                       t.shard, views, t.shardid);
        -- A shard has no identity of its own: the view draws from this node's sequence.
        FOR c IN SELECT a.attname FROM pg_attribute a
                  WHERE a.attrelid = t.oid AND a.attidentity <> '' AND NOT a.attisdropped
        LOOP
            EXECUTE format('ALTER VIEW %I.%I ALTER COLUMN %I SET DEFAULT nextval(%L)', views,
                           t.relname, c.attname,
                           pg_get_serial_sequence(format('%I.%I', cell, t.relname), c.attname));
        END LOOP;
    END LOOP;
    -- The cell's views again, over the node views (the cell's own read Citus's tables).
    PERFORM set_config('search_path', format('%I,%I', views, cell), true);
    FOR i IN 1 .. cell_views LOOP
        EXECUTE format('CREATE VIEW %I.%I AS %s', views, view_names[i], view_bodies[i]);
    END LOOP;
    EXECUTE format('COMMENT ON SCHEMA %I IS %L', views, built);
END
$ready$"#;

/// Readies the node `client` is connected to for cell `cell`'s processes: builds its node views
/// and fences if they are missing or stale (see the module's invariants). Call it on the node
/// that holds the cell ([`Placement::Here`]).
///
/// # Errors
/// Database errors; [`CELL_MOVED`] if the cell is not on this node.
pub async fn ready(client: &impl GenericClient, cell: &str) -> Result<(), Error> {
    client
        .batch_execute(&READY_SQL.replace(":cell", cell))
        .await?;
    Ok(())
}

/// The configuration `cfg` pointed at the node that holds its cell: unchanged outside a cell, on
/// plain PostgreSQL or when the node `cfg` names holds it; otherwise its URL names that node
/// ([`crate::db::with_node`]), as Citus's metadata on the first node names it. Opens one session
/// to ask.
///
/// # Errors
/// [`crate::config::ConfigError::NodeUrl`] when the URL cannot be pointed at the node;
/// connection and database errors.
pub async fn find_node(cfg: &DatabaseConfig) -> Result<DatabaseConfig, Error> {
    let Some(cell) = &cfg.cell else {
        return Ok(cfg.clone());
    };
    let client = crate::db::connect(cfg, "locate").await?;
    match locate(&client, cell).await? {
        Placement::Plain | Placement::Here => Ok(cfg.clone()),
        Placement::Elsewhere { host, port } => Ok(DatabaseConfig {
            url: crate::db::with_node(&cfg.url, &host, port)?,
            ..cfg.clone()
        }),
    }
}

/// Drops cell `cell`'s node views and fences on every node, through the coordinator
/// `client` is connected to, so that a migration may change the tables they name; the node is
/// readied again after it ([`ready`]). Statements of the cell's running processes fail with
/// `undefined_table` meanwhile, and find the views again once they are rebuilt.
///
/// Locks: `ACCESS EXCLUSIVE` on each node's views while they are dropped.
///
/// # Errors
/// Database errors; [`Error::Unavailable`] if a worker did not drop them (unreachable, say).
pub async fn forget(client: &impl GenericClient, cell: &str) -> Result<(), Error> {
    // One simple-query string is one implicit transaction: the settings are its own.
    let command = format!(
        "SET LOCAL citus.enable_ddl_propagation = off; \
         SET LOCAL citus.enable_manual_changes_to_shards = on; \
         DROP SCHEMA IF EXISTS {} CASCADE",
        node_schema(cell)
    );
    let dropped: Option<bool> = client
        .query_one(
            "SELECT bool_and(success) FROM run_command_on_all_nodes($1)",
            &[&command],
        )
        .await?
        .get(0);
    if dropped == Some(false) {
        // A worker that could not be reached or refused: the migration waits for it.
        return Err(Error::Unavailable(None));
    }
    Ok(())
}

/// The live table's oid: the relation `etl_job_records` names on the session's `search_path`, or,
/// when that is a view reading exactly one relation (a cell's node view, on the Citus node that
/// holds the cell), that relation (the cell's shard). A view over several relations stays the
/// view (no statistics, no size: nothing is judged or vacuumed). Null when neither exists. (It
/// reads no `pg_class` row of the shard: Citus hides shards from `pg_class` queries.)
macro_rules! live_table_oid {
    () => {
        "coalesce((SELECT min(d.refobjid) FROM pg_rewrite r \
                     JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid \
                    WHERE r.ev_class = to_regclass('etl_job_records') AND r.rulename = '_RETURN' \
                      AND d.refclassid = 'pg_class'::regclass AND d.refobjid <> r.ev_class \
                   HAVING count(DISTINCT d.refobjid) = 1), \
                  to_regclass('etl_job_records')::oid)"
    };
}
pub(crate) use live_table_oid;
