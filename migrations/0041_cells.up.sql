-- 0041: a cell's names are its own. A cell is a deployment in a schema of its own
-- (`DatabaseConfig::schema`); several cells may share a database (a Citus worker holds many),
-- and what PostgreSQL scopes to the database, not to the schema, must not cross between them:
-- the wake channel, the owner locks and the queues' enqueue barriers.
--
-- `durable_etl_channel()` names the channel this deployment's wakes travel on, and
-- `durable_etl_lock_space()` the first key of its queues' enqueue barriers. A cell's owner-lock
-- key digests its schema's name with the owner id, so one replica id may serve several cells of
-- one database. Which kind of deployment this is comes from the migrating session's
-- `durable_etl.cell` setting (set by `schema::migrate` for a cell, and equal to the schema the
-- objects are created in): without it, today's names stay, so a deployment migrated before
-- cells keeps its channel and its keys and replicas of the previous release keep working.
--
-- Readers: additive. Outside a cell the names are the previous release's; in a cell they are
-- new, and no previous release runs in a cell.
--
-- Locks: CREATE (OR REPLACE) FUNCTION updates catalog rows; each session runs the new bodies
-- from its next statement that calls them.

DO $cell$
DECLARE
    cell text := nullif(current_setting('durable_etl.cell', true), '');
BEGIN
    IF cell IS NOT NULL AND cell IS DISTINCT FROM current_schema() THEN
        RAISE EXCEPTION 'durable_etl.cell names schema %, but objects are created in %',
            cell, current_schema();
    END IF;
    -- The channel this deployment's wakes travel on: the schema's name after a dot in a cell
    -- (schema names of cells are at most 40 bytes, so the name stays within 63).
    EXECUTE format(
        $f$CREATE FUNCTION durable_etl_channel() RETURNS text
               LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $b$SELECT %L::text$b$$f$,
        CASE WHEN cell IS NULL THEN 'durable_etl_jobs' ELSE 'durable_etl_jobs.' || cell END);
    -- The first key of the queues' enqueue barriers ('detl' in ASCII outside a cell; a hash of
    -- the cell's name in one, the name spelled out in the body so that a cell made from the
    -- baseline script, `migrations/cell_baseline.sql`, is this one with another name).
    EXECUTE format(
        $f$CREATE FUNCTION durable_etl_lock_space() RETURNS integer
               LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $b$SELECT %s$b$$f$,
        CASE WHEN cell IS NULL THEN '1684370540'
             ELSE format('hashtext(%L)', 'durable_etl.' || cell) END);
    -- A cell's owner-lock key: the first 64 bits of SHA-256 of `<schema>/<owner id>`.
    IF cell IS NOT NULL THEN
        EXECUTE format(
            $f$CREATE OR REPLACE FUNCTION durable_etl_owner_lock_key(owner_id text) RETURNS bigint
                   LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $b$
                   SELECT ('x' || substr(encode(sha256(convert_to(%L || owner_id, 'UTF8')),
                                                'hex'), 1, 16))::bit(64)::bigint
               $b$$f$,
            cell || '/');
    END IF;
END;
$cell$;

-- 0029's wake, on this deployment's channel and barrier keys; its rules and locks unchanged.
--
-- Locks: none but the notify queue's at commit when a read finds a replica to wake; else the
-- queue's enqueue barrier in share mode to the commit.
CREATE OR REPLACE FUNCTION durable_etl_wake(wake_queue text, wake_kind text, jobs bigint) RETURNS void
    LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_notify(durable_etl_channel(), 'q ' || wake_queue);
        RETURN;
    END IF;
    FOR read IN 1..2 LOOP
        PERFORM pg_notify(durable_etl_channel(),
                          CASE WHEN wake_kind IS NULL THEN 'q ' || wake_queue
                               ELSE 't ' || w.wake_token || ' ' || wake_queue || ' ' || wake_kind
                          END)
           FROM (SELECT w.wake_token
                   FROM etl_waiting_replicas w
                  WHERE wake_queue = ANY (w.queues)
                    AND (wake_kind IS NULL
                         OR (wake_kind = ANY (w.kinds) AND w.wake_token IS NOT NULL))
                    AND NOT EXISTS (
                        SELECT 1 FROM etl_queues q
                         WHERE q.queue = wake_queue
                           AND (q.paused
                                OR (q.cap IS NOT NULL
                                    AND NOT EXISTS (
                                        SELECT 1 FROM etl_queue_permits p
                                         WHERE p.queue = wake_queue AND p.claim_id IS NULL
                                           AND p.slot <= q.cap))))
                  ORDER BY random()
                  LIMIT CASE WHEN wake_kind IS NULL THEN 1 ELSE jobs END) w;
        EXIT WHEN FOUND OR read = 2;
        PERFORM pg_advisory_xact_lock_shared(durable_etl_lock_space(), hashtext(wake_queue));
    END LOOP;
END;
$$;
