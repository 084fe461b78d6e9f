-- 0005 down: the enqueue trigger's function as 0001 created it, which notifies whatever
-- `durable_etl.notify` says. Locks: none on any table (see the up script). Replicas of a release
-- with 0005 still running then notify twice per submission (trigger and notifier): harmless.
CREATE OR REPLACE FUNCTION durable_etl_notify_enqueue() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted_jobs WHERE status = 'pending' AND run_at <= now()) THEN
        PERFORM pg_notify('durable_etl_jobs', '');
    END IF;
    RETURN NULL;
END;
$$;
