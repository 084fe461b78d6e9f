-- Reverts 0020: no queues, priorities or virtual deadlines; the claim's index by due time again,
-- built before the queue index is dropped, so a release before 0020 can claim the moment it
-- starts; the enqueue trigger's function and the jobs view as 0009 and 0013 left them.
--
-- Locks: ACCESS EXCLUSIVE on etl_job_intake, etl_job_records and etl_waiting_replicas while the
-- columns are dropped, and on etl_job_records while its index is built (stop every replica and API
-- process of a release with 0020 first, docs/migrations.md).
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
        IF EXISTS (SELECT 1 FROM etl_waiting_replicas) THEN
            PERFORM pg_notify('durable_etl_jobs', '');
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

ALTER TABLE etl_waiting_replicas DROP COLUMN queues;

DROP TABLE etl_queues;

CREATE INDEX etl_job_records_pending_due_idx
    ON etl_job_records (run_at, id)
    WHERE status = 'pending';
DROP INDEX etl_job_records_claim_idx;

DROP VIEW etl_jobs;
CREATE VIEW etl_jobs AS
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
       o.data_checksum
  FROM etl_job_intake i
  LEFT JOIN etl_job_records j ON j.id = i.id
  LEFT JOIN etl_job_outcomes o ON o.job_id = i.id;

COMMENT ON VIEW etl_jobs IS
    'durable-etl: one row per job ever accepted (no payload, no idempotency key); query this, not the tables';

ALTER TABLE etl_job_records DROP COLUMN queue, DROP COLUMN priority, DROP COLUMN sort_at;
ALTER TABLE etl_job_intake DROP COLUMN queue, DROP COLUMN priority;

DROP FUNCTION durable_etl_sort_at(timestamptz, smallint);
