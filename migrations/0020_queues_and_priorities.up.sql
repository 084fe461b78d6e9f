-- 0020: queues and priorities. Every job has a queue (`default` unless its enqueue names one) and a
-- priority (0, the first, to 9); a replica claims only jobs of the queues it serves and of the
-- kinds it has registered, so a job of a kind no running replica serves waits instead of failing.
--
-- Priorities without aging writes: a live row carries `sort_at`, its virtual deadline, set with
-- `run_at` by every statement that sets `run_at` (enqueue, retry) as `durable_etl_sort_at(run_at,
-- priority)` = `run_at + priority x 10 s`. The claim takes due jobs in `(sort_at, id)` order, so a
-- job is passed only by jobs of a more urgent priority due less than `(its priority - theirs) x
-- 10 s` after it, and never by a job due later than that: a priority-9 job waits at most 90 s of
-- priority-0 arrivals. No statement ever rewrites a row to age it.
--
-- The claim's index becomes `(queue, kind, sort_at, id) WHERE status = 'pending'`: one ordered
-- probe per (queue, kind) with equal leading columns, which the planner does not trade for a
-- bitmap scan plus a sort. It replaces `etl_job_records_pending_due_idx`, so an enqueue writes no
-- more index entries than before.
--
-- `etl_queues` holds what operators set per queue (for now, whether it is paused); a queue without
-- a row is served as it comes. `etl_waiting_replicas.queues` names the queues a waiting replica
-- serves (NULL: every queue), so the enqueue trigger notifies only when a replica waits for one
-- of the inserted jobs' queues.
--
-- Readers: breaking. A release before it inserts live rows without `sort_at` (refused: NOT NULL)
-- and claims without the queue filter, through an index that is gone. Stop every replica and API
-- process of an older release first (docs/migrations.md).
--
-- Locks: ACCESS EXCLUSIVE on etl_job_intake, etl_job_records and etl_waiting_replicas while
-- columns and checks are added (a scan of each to validate the checks; the live table is also
-- rewritten once by the UPDATE that fills `sort_at`) and while the index is swapped.

-- The virtual deadline of a job due at `run_at` with `priority`. STABLE because `timestamptz +
-- interval` is (a whole number of seconds never depends on the time zone); inlined where used.
CREATE FUNCTION durable_etl_sort_at(run_at timestamptz, priority smallint) RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN run_at + priority * interval '10 seconds';

ALTER TABLE etl_job_intake
    ADD COLUMN queue text NOT NULL DEFAULT 'default'
        CONSTRAINT etl_job_intake_queue_check
        CHECK (octet_length(queue) <= 63 AND ascii(queue) BETWEEN 97 AND 122
               AND ltrim(queue, 'abcdefghijklmnopqrstuvwxyz0123456789_.') = ''),
    ADD COLUMN priority smallint NOT NULL DEFAULT 0
        CONSTRAINT etl_job_intake_priority_check CHECK (priority BETWEEN 0 AND 9);

ALTER TABLE etl_job_records
    ADD COLUMN queue text NOT NULL DEFAULT 'default'
        CONSTRAINT etl_job_records_queue_check
        CHECK (octet_length(queue) <= 63 AND ascii(queue) BETWEEN 97 AND 122
               AND ltrim(queue, 'abcdefghijklmnopqrstuvwxyz0123456789_.') = ''),
    ADD COLUMN priority smallint NOT NULL DEFAULT 0
        CONSTRAINT etl_job_records_priority_check CHECK (priority BETWEEN 0 AND 9),
    ADD COLUMN sort_at timestamptz;
UPDATE etl_job_records SET sort_at = run_at;
-- A row inserted without one is due now, like `run_at`'s own default; one dated later without
-- its deadline is refused, so that no deferred job sorts before its due time.
ALTER TABLE etl_job_records
    ALTER COLUMN sort_at SET NOT NULL,
    ALTER COLUMN sort_at SET DEFAULT now(),
    ADD CONSTRAINT etl_job_records_sort_at_check CHECK (sort_at >= run_at);

DROP INDEX etl_job_records_pending_due_idx;
CREATE INDEX etl_job_records_claim_idx
    ON etl_job_records (queue, kind, sort_at, id)
    WHERE status = 'pending';

CREATE TABLE etl_queues (
    queue      text        PRIMARY KEY
        CHECK (octet_length(queue) <= 63 AND ascii(queue) BETWEEN 97 AND 122
               AND ltrim(queue, 'abcdefghijklmnopqrstuvwxyz0123456789_.') = ''),
    paused     boolean     NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE etl_queues IS
    'durable-etl: what operators set per queue; a queue without a row is served as it comes';

ALTER TABLE etl_waiting_replicas ADD COLUMN queues text[];

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

CREATE OR REPLACE VIEW etl_jobs AS
SELECT i.id,
       i.owner_key,
       i.kind,
       coalesce(o.status, j.status) AS status,
       coalesce(o.attempts, j.attempts) AS attempts,
       i.max_attempts,
       coalesce(o.run_at, j.run_at) AS run_at,
       i.created_at,
       coalesce(o.finished_at, j.updated_at) AS updated_at,
       coalesce(o.started_at, j.started_at) AS started_at,
       o.finished_at,
       o.failure_code,
       o.failure_record_index,
       j.lease_owner_id,
       j.lease_claim_id,
       j.lease_expires_at,
       i.replaces_job_id,
       coalesce(j.cancel_code IS NOT NULL, false) AS cancel_requested,
       o.rows_inserted,
       o.rows_updated,
       o.rows_unchanged,
       o.data_checksum,
       i.queue,
       i.priority
  FROM etl_job_intake i
  LEFT JOIN etl_job_records j ON j.id = i.id
  LEFT JOIN etl_job_outcomes o ON o.job_id = i.id;
