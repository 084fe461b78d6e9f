-- 0024: an enqueue wakes one waiting replica per due job it inserts, by name, and each waiting
-- replica is woken once until it waits again.
--
-- Before 0024 every enqueue that found a waiting replica sent one NOTIFY that woke every
-- waiting replica: at a steady load of single-job enqueues each job cost a claim on every
-- replica (all but one came back empty), and every enqueue notified, so every enqueue took
-- PostgreSQL's cluster-wide notify lock from its NOTIFY through its commit's WAL flush:
-- concurrent producers committed one at a time (docs/benchmarks.md, #26).
--
-- Now a waiting replica's row names its process's wake token (a random number, nothing else)
-- and the kinds it runs. For each (queue, kind) of the due jobs a statement inserted, the
-- trigger takes up to as many waiting rows as it inserted such jobs, longest waiting first, of
-- replicas that serve that queue and run that kind, skipping rows another transaction holds
-- (`FOR UPDATE SKIP LOCKED`): an enqueue that is waking that replica right now, whose NOTIFY
-- will wake it for this job too. It deletes the rows it took and notifies each one's token:
-- the replica that reads its own token claims, and waits again (registers) on that claim. An
-- enqueue that finds no row to take sends nothing: every replica that could run its jobs is
-- awake, and claims again before it waits.
--
-- The race the enqueue barrier closes (0009) is the same, for every registration: an enqueue
-- that read the table before a replica's row was back holds the barrier in share mode from
-- before its read to its commit, and the replica claims only after a try of the barrier in
-- exclusive mode succeeded after its row committed (src/worker/liveness/presence.rs). A row a
-- replica is refreshing is skipped like a row being woken; the replica's refresh then needs a
-- successful try too.
--
-- Readers: additive. A release before it registers without a token: while such a row serves a
-- due job's queue, the trigger also sends the empty NOTIFY that wakes every replica, as before,
-- and leaves that row in place. Its replicas never read payloads, so they wake on every NOTIFY,
-- as they did. The API's notifier, released claims and freed permits keep the empty NOTIFY
-- that wakes every waiting replica.
--
-- Locks: ALTER TABLE takes the waiting table's ACCESS EXCLUSIVE lock for an instant (adding
-- nullable columns rewrites nothing); CREATE OR REPLACE updates the function's catalog row, and
-- each session runs the new body from its next enqueue after the commit.

ALTER TABLE etl_waiting_replicas
    ADD COLUMN wake_token bigint,
    ADD COLUMN kinds text[];

COMMENT ON COLUMN etl_waiting_replicas.wake_token IS
    'durable-etl: the payload of the NOTIFY that wakes this replica alone (NULL: a release before 0024)';
COMMENT ON COLUMN etl_waiting_replicas.kinds IS
    'durable-etl: the kinds the replica runs (NULL: any)';

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
        DELETE FROM etl_waiting_replicas w
         USING taken t
         WHERE w.owner_id = t.owner_id
        RETURNING w.wake_token
    LOOP
        PERFORM pg_notify('durable_etl_jobs', token::text);
    END LOOP;
    RETURN NULL;
END;
$$;
