-- 0006: the response ledger without a foreign key to its job.
--
-- The key's check cost about a quarter of the server CPU of a fenced success (an RI trigger, and a
-- FOR KEY SHARE probe of the job row, for every ledger row written; measured in
-- shared/research/throughput, "T vs T0"). It protected nothing the statements do not already
-- guarantee: a ledger row is only ever written by the statement that moves its job, locked and
-- fenced, to `succeeded`, so the job exists and cannot be deleted before that statement commits.
-- What the key also did, deleting a job's ledger row with the job (ON DELETE CASCADE, which the
-- retention runbook relies on), a statement-level trigger does now: once per DELETE statement, over
-- the deleted rows' transition table, at no cost to any other statement.
--
-- Locks: DROP CONSTRAINT takes ACCESS EXCLUSIVE on both tables for an instant (no scan);
-- CREATE TRIGGER takes SHARE ROW EXCLUSIVE on etl_job_records.
ALTER TABLE etl_job_responses DROP CONSTRAINT etl_job_responses_job_id_fkey;

CREATE FUNCTION etl_job_responses_follow_deleted_jobs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM etl_job_responses r USING deleted_jobs d WHERE r.job_id = d.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER etl_job_records_delete_responses
    AFTER DELETE ON etl_job_records
    REFERENCING OLD TABLE AS deleted_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION etl_job_responses_follow_deleted_jobs();
