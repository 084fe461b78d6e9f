-- 0022: concurrency caps per key. A job may carry a concurrency key (`concurrency_key`, e.g. a
-- customer's id, set at enqueue); a queue with a key cap (`etl_queues.key_cap`) runs at most that
-- many of its jobs of one key at once, across all replicas. Keys need no set-up: a key's permits
-- exist only while they are held.
--
-- A key permit is a row of `etl_key_permits`, named by its claim (`claim_id`, the primary key)
-- and unique per (queue, key, slot), slots 1 to the key cap:
-- - the claim skips a keyed job whose key already holds `key_cap` permits, inserts one permit
--   (`ON CONFLICT DO NOTHING`, in (queue, key, slot) order) for each keyed job it keeps, and
--   claims only the jobs whose permit it inserted, in the one claim statement: two claimers that
--   pick the same slot of one key cannot both insert it, so a key never runs more than its cap;
-- - every statement that moves a claim out of `running` (success, failure, retry, release,
--   recovery) deletes that claim's permit in the same statement, by the claim ids of the rows it
--   moved, taken from its own RETURNING: a stale finisher moves no row, so it frees nothing.
-- There is no counter row: a claim of a key writes only that key's permit row. A key cap applies
-- to claims made after it is set; a lowered cap lets no new job of a key start until the key's
-- permits fall below it.
--
-- A freed key permit wakes the replicas waiting for its queue, as a freed queue permit does
-- (0021): the permits' trigger notifies under the enqueue barrier.
--
-- The key is stored on the live row only (never on the intake row, the outcome or the jobs view),
-- so it leaves with the live row when the job ends; nothing logs, labels or shows it.
--
-- Replicas also report the kinds they run and the queues they serve (`etl_replicas.kinds`,
-- `queues`), so that operators see the due jobs no live replica serves (a job of a kind or a
-- queue nobody runs waits, it is never failed for it).
--
-- Readers: breaking. A release before it inserts no key and frees no key permit: a replica of
-- release 21 that recovered or finished a claim of release 22 would leave its permit held, and a
-- key with cap 1 would never run again. Stop every replica and API process of the older release
-- before migrating.
--
-- Locks: ACCESS EXCLUSIVE on etl_queues, etl_replicas and etl_job_records while the columns are
-- added (catalog only: nullable, no default).
ALTER TABLE etl_queues
    ADD COLUMN key_cap integer CONSTRAINT etl_queues_key_cap_check CHECK (key_cap BETWEEN 1 AND 10000);

ALTER TABLE etl_replicas ADD COLUMN kinds text[], ADD COLUMN queues text[];

ALTER TABLE etl_job_records
    ADD COLUMN concurrency_key text
        CONSTRAINT etl_job_records_concurrency_key_check
        CHECK (octet_length(concurrency_key) BETWEEN 1 AND 255);

CREATE TABLE etl_key_permits (
    claim_id        uuid    PRIMARY KEY,
    queue           text    NOT NULL,
    concurrency_key text    NOT NULL,
    slot            integer NOT NULL CHECK (slot >= 1),
    CONSTRAINT etl_key_permits_slot_key UNIQUE (queue, concurrency_key, slot)
);

COMMENT ON TABLE etl_key_permits IS
    'durable-etl: one row per running job of a key-capped queue, held by its claim';

-- Row-level: a statement that frees no key permit (every job without a key) fires nothing.
CREATE FUNCTION durable_etl_notify_key_permits() RETURNS trigger
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

CREATE TRIGGER etl_key_permits_notify_freed
    AFTER DELETE ON etl_key_permits
    FOR EACH ROW
    EXECUTE FUNCTION durable_etl_notify_key_permits();
