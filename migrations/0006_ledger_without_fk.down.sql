-- 0006 down: the foreign key again. A ledger row whose job is gone (deleted by a TRUNCATE, which
-- fires no DELETE trigger) could not satisfy it, so it goes first.
DROP TRIGGER etl_job_records_delete_responses ON etl_job_records;
DROP FUNCTION etl_job_responses_follow_deleted_jobs();
DELETE FROM etl_job_responses r
 WHERE NOT EXISTS (SELECT 1 FROM etl_job_records j WHERE j.id = r.job_id);
ALTER TABLE etl_job_responses
    ADD CONSTRAINT etl_job_responses_job_id_fkey
    FOREIGN KEY (job_id) REFERENCES etl_job_records (id) ON DELETE CASCADE;
