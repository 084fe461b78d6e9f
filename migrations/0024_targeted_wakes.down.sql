-- Reverts 0024: the enqueue trigger's 0020 body (one empty NOTIFY while any waiting replica
-- serves a due job's queue), and the waiting table without tokens and kinds.
-- Locks: the function's catalog row; the waiting table's ACCESS EXCLUSIVE lock for an instant.
CREATE OR REPLACE FUNCTION durable_etl_notify_enqueue() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('durable_etl.notify', true) IS DISTINCT FROM 'off'
       AND EXISTS (SELECT 1 FROM inserted_jobs WHERE status = 'pending' AND run_at <= now()) THEN
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            PERFORM pg_notify('durable_etl_jobs', '');
            RETURN NULL;
        END IF;
        -- The enqueue barrier ('detl', 1), held to commit; then a fresh snapshot of the table.
        PERFORM pg_advisory_xact_lock_shared(1684370540, 1);
        IF EXISTS (SELECT 1 FROM etl_waiting_replicas w
                    WHERE w.queues IS NULL
                       OR w.queues && ARRAY(SELECT DISTINCT i.queue FROM inserted_jobs i
                                             WHERE i.status = 'pending' AND i.run_at <= now())) THEN
            PERFORM pg_notify('durable_etl_jobs', '');
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

ALTER TABLE etl_waiting_replicas
    DROP COLUMN wake_token,
    DROP COLUMN kinds;
