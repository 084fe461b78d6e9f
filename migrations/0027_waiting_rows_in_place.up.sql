-- 0027: a waiting replica's row stays in place when an enqueue wakes it (or when it turns busy):
-- it is parked, updated to serve no queue and run no kind, instead of deleted.
--
-- Before 0027 every wake deleted the replica's row (0024) and the replica inserted it again when
-- it registered, so at a steady load of single-job enqueues the unlogged table gained a dead
-- tuple and a primary-key entry per job. PostgreSQL reuses a deleted tuple's line pointer only
-- after a vacuum, so new rows went to new pages: 13 to 42 after 10 s at 1,000 jobs/s, until
-- autovacuum came (once a minute at best), and the trigger seq-scans the table on every enqueue
-- (docs/benchmarks.md, #26). An update that changes no indexed column is a
-- heap-only tuple on the same page, and the next read of a full page prunes the old versions:
-- the table keeps about one page (one after those 10 s), and its index does not grow.
--
-- A parked row has `queues = '{}'` and `kinds = '{}'`: it matches no due job, no freed permit and
-- no queue, so every reader that asks "does a replica that serves this wait?" already answers no
-- for it. No registration writes an empty list (a replica serves at least one queue and runs at
-- least one kind, src/queue.rs and src/worker/claim/producer.rs), so a parked row is told apart
-- from a waiting one by that alone. Registering (every release since 0024 upserts its row) sets
-- the lists again. `refreshed_at` is kept, so recovery still deletes the rows of replicas that
-- are gone. The notifier's "anyone waiting?" read (src/notifier.rs) skips parked rows.
--
-- What else stays as 0024 made it: the take locks the rows it parks (`FOR UPDATE SKIP LOCKED`,
-- then the update's row lock, to the enqueue's commit), so a registration that meets a row
-- being taken skips it, as it skipped a row being deleted.
--
-- A take's `FOR UPDATE SKIP LOCKED` may lock a row it then drops: when another enqueue parked
-- the row after this statement's snapshot, the lock follows the update to the parked version,
-- re-checks it, finds it parked and keeps the lock to this enqueue's commit, which notifies
-- nobody for it. A registration that meets that lock writes nothing and says so, and the replica
-- registers again until it writes its row (release 27, src/worker/liveness/presence.rs).
--
-- Readers: release 27 and later. A release before it registers without checking that it wrote
-- its row, so it could count itself waiting behind a parked row and hear nothing until its poll;
-- it refuses to start against 0027. Its API's notifier reads a parked row as a waiting one (one
-- NOTIFY more than it needs).
--
-- Locks: CREATE OR REPLACE updates the function's catalog row; each session runs the new body
-- from its next enqueue after the commit. COMMENT takes the table's SHARE UPDATE EXCLUSIVE lock
-- for an instant.

COMMENT ON TABLE etl_waiting_replicas IS
    'durable-etl: one row per replica that waited for work since it started; a row whose queues and kinds are empty is parked (woken, or busy) and waits for nothing';

CREATE OR REPLACE FUNCTION durable_etl_notify_enqueue() RETURNS trigger
    LANGUAGE plpgsql AS $$
DECLARE
    due_queues text[];
    token bigint;
BEGIN
    IF current_setting('durable_etl.notify', true) IS NOT DISTINCT FROM 'off' THEN
        RETURN NULL;
    END IF;
    due_queues := ARRAY(SELECT DISTINCT i.queue FROM inserted_jobs i
                         WHERE i.status = 'pending' AND i.run_at <= now());
    IF cardinality(due_queues) = 0 THEN
        RETURN NULL;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_notify('durable_etl_jobs', '');
        RETURN NULL;
    END IF;
    -- The enqueue barrier ('detl', 1), held to commit; then a fresh snapshot of the table.
    PERFORM pg_advisory_xact_lock_shared(1684370540, 1);
    IF EXISTS (SELECT 1 FROM etl_waiting_replicas w
                WHERE w.wake_token IS NULL
                  AND (w.queues IS NULL OR w.queues && due_queues)) THEN
        PERFORM pg_notify('durable_etl_jobs', '');
    END IF;
    FOR token IN
        WITH due AS (
            SELECT i.queue, i.kind, count(*) AS jobs
              FROM inserted_jobs i
             WHERE i.status = 'pending' AND i.run_at <= now()
             GROUP BY i.queue, i.kind
        ), taken AS (
            SELECT DISTINCT t.owner_id
              FROM due d
             CROSS JOIN LATERAL (
                 SELECT w.owner_id
                   FROM etl_waiting_replicas w
                  WHERE w.wake_token IS NOT NULL
                    AND (w.queues IS NULL OR d.queue = ANY (w.queues))
                    AND (w.kinds IS NULL OR d.kind = ANY (w.kinds))
                  ORDER BY w.refreshed_at
                  LIMIT d.jobs
                    FOR UPDATE SKIP LOCKED
             ) t
        )
        -- Parks the rows taken (a heap-only update: no indexed column changes).
        UPDATE etl_waiting_replicas w
           SET queues = '{}', kinds = '{}'
          FROM taken t
         WHERE w.owner_id = t.owner_id
        RETURNING w.wake_token
    LOOP
        PERFORM pg_notify('durable_etl_jobs', token::text);
    END LOOP;
    RETURN NULL;
END;
$$;
