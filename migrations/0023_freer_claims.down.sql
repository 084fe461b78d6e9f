-- Reverts 0023: every freed permit wakes the replicas waiting for its queue again (the bodies of
-- 0021 and 0022), and the helper they called is dropped.
-- Locks: the functions' catalog rows.
CREATE OR REPLACE FUNCTION durable_etl_notify_permits() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_notify('durable_etl_jobs', '');
        RETURN NULL;
    END IF;
    -- The enqueue barrier ('detl', 1), held to commit; then a fresh snapshot of the table.
    PERFORM pg_advisory_xact_lock_shared(1684370540, 1);
    IF EXISTS (SELECT 1 FROM etl_waiting_replicas w
                WHERE w.queues IS NULL OR NEW.queue = ANY (w.queues)) THEN
        PERFORM pg_notify('durable_etl_jobs', '');
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION durable_etl_notify_key_permits() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_notify('durable_etl_jobs', '');
        RETURN NULL;
    END IF;
    -- The enqueue barrier ('detl', 1), held to commit; then a fresh snapshot of the table.
    PERFORM pg_advisory_xact_lock_shared(1684370540, 1);
    IF EXISTS (SELECT 1 FROM etl_waiting_replicas w
                WHERE w.queues IS NULL OR OLD.queue = ANY (w.queues)) THEN
        PERFORM pg_notify('durable_etl_jobs', '');
    END IF;
    RETURN NULL;
END;
$$;

DROP FUNCTION durable_etl_wake_for_freed(text);
