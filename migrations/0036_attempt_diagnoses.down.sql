-- Reverts 0036: the diagnoses recorded are dropped with their columns. Roll the replicas of a
-- release with 0036 back first: their retries, failures and recoveries write the columns.
-- Locks: DROP COLUMN and DROP CONSTRAINT take each table's ACCESS EXCLUSIVE lock briefly.

ALTER TABLE etl_job_outcomes
    DROP CONSTRAINT etl_job_outcomes_diagnosis_only_if_failed,
    DROP COLUMN diagnosis;

ALTER TABLE etl_job_attempts DROP COLUMN diagnosis;
