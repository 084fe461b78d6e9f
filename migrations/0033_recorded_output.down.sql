-- 0033 down: the ETL outputs written since go back into the four ledger columns, then the
-- column and the view's last column go. Another kind's output has no columns to go to and is
-- dropped with the column.

UPDATE etl_job_outcomes
   SET rows_inserted = (output ->> 'rows_inserted')::integer,
       rows_updated = (output ->> 'rows_updated')::integer,
       rows_unchanged = (output ->> 'rows_unchanged')::integer,
       data_checksum = decode(output ->> 'checksum', 'hex')
 WHERE output IS NOT NULL AND rows_inserted IS NULL
   AND output ?& ARRAY['rows_inserted', 'rows_updated', 'rows_unchanged', 'checksum'];

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
       o.data_checksum,
       i.queue,
       i.priority
  FROM etl_job_intake i
  LEFT JOIN etl_job_records j ON j.id = i.id
  LEFT JOIN etl_job_outcomes o ON o.job_id = i.id;

COMMENT ON VIEW etl_jobs IS
    'durable-etl: one row per job ever accepted (no payload, no idempotency key); query this, not the tables';

ALTER TABLE etl_job_outcomes
    DROP CONSTRAINT etl_job_outcomes_output_only_if_succeeded,
    DROP COLUMN output;
