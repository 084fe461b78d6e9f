-- Reverts 0027: the enqueue trigger's 0024 body (a take deletes the row), and no parked row left
-- (before 0027 a row's existence is what says its replica waits, to every release's notifier).
-- Locks: the function's catalog row; the lock of each parked row deleted, to the commit (an
-- enqueue taking one meanwhile is waited for); the table's SHARE UPDATE EXCLUSIVE lock for the
-- comment.

DELETE FROM etl_waiting_replicas WHERE queues = '{}' OR kinds = '{}';

COMMENT ON TABLE etl_waiting_replicas IS
    'durable-etl: replicas waiting for work; the enqueue trigger notifies only while one does';

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
