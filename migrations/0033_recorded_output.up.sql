-- 0033: a kind's recorded output, stored as the kind gives it, instead of the ETL kind's ledger
-- in the core's columns.
--
-- The effects of a succeeded job may return what their kind records (the ETL kind: rows
-- inserted, updated and unchanged and the data's checksum); it is stored on the job's outcome
-- as one JSON document, `output`, and shown as the job's `result`. The four ledger columns stay
-- for the outcomes written before, and the view reads them as the same document, so every
-- succeeded ETL job answers alike whichever release wrote it.
--
-- Readers: a release before it reads the four columns, which this release no longer writes: it
-- would show no result for the jobs succeeded since, so it may not read (min_reader_version 33).
-- Writers before it still write the columns, which the view keeps reading.
--
-- Locks: ADD COLUMN without a default changes only the catalog; the CHECK is NOT VALID (the
-- column is new: every row is NULL); the view is replaced in place, its columns kept and one
-- appended.

ALTER TABLE etl_job_outcomes
    ADD COLUMN output jsonb,
    ADD CONSTRAINT etl_job_outcomes_output_only_if_succeeded
        CHECK (output IS NULL OR status = 'succeeded') NOT VALID;

-- The view as 0026 left it, with the output appended.
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
       i.priority,
       coalesce(o.output,
                CASE WHEN o.rows_inserted IS NOT NULL THEN
                    jsonb_build_object('rows_inserted', o.rows_inserted,
                                       'rows_updated', o.rows_updated,
                                       'rows_unchanged', o.rows_unchanged,
                                       'checksum', encode(o.data_checksum, 'hex'))
                END) AS output
  FROM etl_job_intake i
  LEFT JOIN etl_job_records j ON j.id = i.id
  LEFT JOIN etl_job_outcomes o ON o.job_id = i.id;
