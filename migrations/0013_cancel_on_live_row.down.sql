-- 0013 down: cancel requests as rows of etl_job_cancel_requests again (as 0004 and 0008 left
-- them). Stop every process of a release with 0013 first: it reads and writes the column.
--
-- Locks: ACCESS EXCLUSIVE on etl_job_records while the column is dropped, and SHARE ROW
-- EXCLUSIVE on etl_job_intake for the request table's foreign key.
CREATE TABLE etl_job_cancel_requests (
    job_id       uuid        PRIMARY KEY
        CONSTRAINT etl_job_cancel_requests_job_id_fkey
        REFERENCES etl_job_intake (id) ON DELETE CASCADE,
    requested_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE etl_job_cancel_requests IS
    'durable-etl: owners'' requests to cancel running jobs, recorded without the job row''s lock';

INSERT INTO etl_job_cancel_requests (job_id)
SELECT id FROM etl_job_records WHERE cancel_code IS NOT NULL;

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
       EXISTS (SELECT 1 FROM etl_job_cancel_requests c WHERE c.job_id = i.id) AS cancel_requested,
       o.rows_inserted,
       o.rows_updated,
       o.rows_unchanged,
       o.data_checksum
  FROM etl_job_intake i
  LEFT JOIN etl_job_records j ON j.id = i.id
  LEFT JOIN etl_job_outcomes o ON o.job_id = i.id;

ALTER TABLE etl_job_records DROP COLUMN cancel_code;
