-- 0021: concurrency caps per queue, enforced by PostgreSQL and protected by the fence.
--
-- A capped queue (`etl_queues.cap`) has one row of `etl_queue_permits` per slot, 1 to its cap. A
-- permit names at most one claim (`claim_id`), and a claim of a capped queue's job is `running`
-- if and only if it holds its permit:
-- - the claim locks free permits (`FOR UPDATE SKIP LOCKED`, never more than it asks for) and
--   claims at most as many jobs as it locked, writing each claim's id into its permit and the
--   permit's slot into the live row (`permit_slot`), in the one claim statement;
-- - every statement that moves a claim out of `running` (success, failure, retry, release,
--   recovery) frees that claim's permit in the same statement, by the queue, slot and claim id of
--   the rows it moved, taken from its own RETURNING: a stale finisher moves no row, so it frees
--   nothing (Solid Queue's double release cannot happen).
-- There is no counter row that every claim updates: claims contend on `cap` rows, and SKIP
-- LOCKED never waits on them. A permit whose slot is above the cap (the cap was lowered while it
-- was held) is never taken again. A cap applies to claims made after it is set.
--
-- A freed permit wakes the replicas waiting for its queue: the permits' trigger notifies as the
-- enqueue trigger does (0009, 0020), under the same enqueue barrier, so a replica
-- that registered as waiting while a permit was being freed either sees the permit free when it
-- claims or is notified when the freeing transaction commits. A claim taking permits frees none,
-- so it notifies nobody.
--
-- Readers: additive for release 20 (its claims take no permits and its statements free none, so
-- a mixed fleet can exceed a cap, never lose a job); caps hold once every replica runs 21.
--
-- Locks: ACCESS EXCLUSIVE on etl_queues and etl_job_records while the columns are added
-- (catalog only: nullable, no default).
ALTER TABLE etl_queues
    ADD COLUMN cap integer CONSTRAINT etl_queues_cap_check CHECK (cap BETWEEN 1 AND 10000);

ALTER TABLE etl_job_records
    ADD COLUMN permit_slot integer;

CREATE TABLE etl_queue_permits (
    queue    text    NOT NULL REFERENCES etl_queues (queue) ON DELETE CASCADE,
    slot     integer NOT NULL CHECK (slot >= 1),
    claim_id uuid,
    PRIMARY KEY (queue, slot)
);

COMMENT ON TABLE etl_queue_permits IS
    'durable-etl: one row per running slot of a capped queue, held by at most one claim';

-- Row-level, with a WHEN clause: a statement that frees no permit (every claim or completion of
-- an uncapped queue) fires nothing and pays nothing.
CREATE FUNCTION durable_etl_notify_permits() RETURNS trigger
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

CREATE TRIGGER etl_queue_permits_notify_freed
    AFTER UPDATE OF claim_id ON etl_queue_permits
    FOR EACH ROW
    WHEN (OLD.claim_id IS NOT NULL AND NEW.claim_id IS NULL)
    EXECUTE FUNCTION durable_etl_notify_permits();
