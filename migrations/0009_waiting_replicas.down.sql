-- 0009 down: the enqueue trigger's function as 0005 left it (notify unless the transaction opted
-- out), and no waiting table. Locks: ACCESS EXCLUSIVE on etl_waiting_replicas while it is
-- dropped; replicas of a release with 0009 that are still running then fail to register, and
-- fall back to their poll until they stop (roll back the fleet first, docs/migrations.md).
CREATE OR REPLACE FUNCTION durable_etl_notify_enqueue() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('durable_etl.notify', true) IS DISTINCT FROM 'off'
       AND EXISTS (SELECT 1 FROM inserted_jobs WHERE status = 'pending' AND run_at <= now()) THEN
        PERFORM pg_notify('durable_etl_jobs', '');
    END IF;
    RETURN NULL;
END;
$$;

DROP TABLE etl_waiting_replicas;
