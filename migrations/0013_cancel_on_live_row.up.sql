-- 0013: a cancel request is a column of the job's live row, so it serializes with the commit.
--
-- Since 0004 a request for a running job was a row of etl_job_cancel_requests, recorded without
-- waiting for the job's row lock. That let a request land after a group commit had checked it
-- and before it committed: the job succeeded although the owner had been told its effects would
-- never commit, and a job replaced by a newer one could commit its stale data over the
-- replacement's. Now the request updates the live row (`cancel_code`: the code the job ends
-- with, `cancelled` or `replaced`), so it waits for a commit that holds the row (and then finds
-- the job ended), and a commit that reaches a row the request holds waits for it and sees the
-- request on the row's new version (PostgreSQL re-checks a waiting statement's predicate on the
-- row it changed, never on another table's). A request leaves with the live row: an ended job
-- shows none.
--
-- Readers: breaking. Releases before it read and write etl_job_cancel_requests, which is gone;
-- stop every replica and API process of an older release before running it
-- (docs/migrations.md).
--
-- Locks: ACCESS EXCLUSIVE on etl_job_records while the column is added and checked (the live
-- table is small by design) and on etl_job_cancel_requests while it is dropped; the view is
-- replaced in place.
ALTER TABLE etl_job_records
    ADD COLUMN cancel_code text
        CONSTRAINT etl_job_records_cancel_code_check CHECK (cancel_code IN ('cancelled', 'replaced'));

UPDATE etl_job_records j
   SET cancel_code = 'cancelled'
  FROM etl_job_cancel_requests c
 WHERE c.job_id = j.id;

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
       o.data_checksum
  FROM etl_job_intake i
  LEFT JOIN etl_job_records j ON j.id = i.id
  LEFT JOIN etl_job_outcomes o ON o.job_id = i.id;

DROP TABLE etl_job_cancel_requests;
