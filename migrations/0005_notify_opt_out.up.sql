-- 0005: a transaction may opt out of the enqueue trigger's NOTIFY.

-- Replaces the body of the enqueue trigger's function (0001): a transaction that ran
-- `SET LOCAL durable_etl.notify = 'off'` inserts its jobs without notifying; any other value, or
-- none, notifies exactly as before. Why: a transaction that has notified holds PostgreSQL's
-- cluster-wide notify lock from its NOTIFY through its commit's WAL flush, so notifying commits
-- cannot share a flush (group commit); the API process instead opts out and sends one coalesced
-- NOTIFY from a connection of its own after its commits (`durable_etl::notifier`).
--
-- Readers: a release that does not know 0005 never sets the option, so its enqueues notify as
-- they always did, and its workers read the same channel: older releases are unaffected.
--
-- Locks: none on any table. CREATE OR REPLACE updates the function's own catalog row; sessions
-- pick up the new body at their next call after this transaction commits, and an enqueue
-- running meanwhile finishes under the old one (it notifies: harmless).
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
