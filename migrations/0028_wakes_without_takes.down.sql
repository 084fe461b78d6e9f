-- Reverts 0028: the 0027 enqueue trigger and freed-permit wake, without the given-back trigger
-- and the wake functions. Locks: DROP TRIGGER takes the live table's ACCESS EXCLUSIVE lock for an
-- instant; the functions' catalog rows.

DROP TRIGGER etl_job_records_notify_given_back ON etl_job_records;
DROP FUNCTION durable_etl_notify_given_back();
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
CREATE OR REPLACE FUNCTION durable_etl_wake_for_freed(freed_queue text) RETURNS void
    LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('durable_etl.freer_claims', true) = 'on' THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_notify('durable_etl_jobs', '');
        RETURN;
    END IF;
    -- The enqueue barrier ('detl', 1), held to commit; then a fresh snapshot of the table.
    PERFORM pg_advisory_xact_lock_shared(1684370540, 1);
    IF EXISTS (SELECT 1 FROM etl_waiting_replicas w
                WHERE w.queues IS NULL OR freed_queue = ANY (w.queues)) THEN
        PERFORM pg_notify('durable_etl_jobs', '');
    END IF;
END;
$$;

DROP FUNCTION durable_etl_wake(text, text, bigint);
DROP FUNCTION durable_etl_queue_open(text);

COMMENT ON TABLE etl_waiting_replicas IS
    'durable-etl: one row per replica that waited for work since it started; a row whose queues and kinds are empty is parked (woken, or busy) and waits for nothing';
