-- 0003 down. Fails (and is rolled back) while target rows whose writing job was deleted exist:
-- `written_by_job` cannot be NOT NULL again until they are deleted or pointed at a job.
ALTER TABLE etl_job_records
    DROP CONSTRAINT etl_job_records_replaces_job_id_fkey,
    ADD CONSTRAINT etl_job_records_replaces_job_id_fkey
        FOREIGN KEY (replaces_job_id) REFERENCES etl_job_records (id);
ALTER TABLE etl_target_rows
    DROP CONSTRAINT etl_target_rows_written_by_job_fkey,
    ADD CONSTRAINT etl_target_rows_written_by_job_fkey
        FOREIGN KEY (written_by_job) REFERENCES etl_job_records (id),
    ALTER COLUMN written_by_job SET NOT NULL;
DROP INDEX etl_target_rows_written_by_job_idx;
DROP INDEX etl_job_records_replaces_idx;
DROP INDEX etl_job_records_owner_status_listing_idx;
ALTER TABLE etl_job_records
    DROP CONSTRAINT etl_job_records_running_has_renewal,
    DROP COLUMN lease_renewed_at,
    DROP COLUMN fencing_token;
