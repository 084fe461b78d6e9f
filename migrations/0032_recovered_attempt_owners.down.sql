-- Reverts 0032. Recovered attempts keep their ending and lose the owner they were taken from:
-- a replica cut off before the down script can no longer give their charge back.
-- Locks: DROP INDEX and DROP COLUMN take the history table's ACCESS EXCLUSIVE lock briefly.

DROP INDEX etl_job_attempts_recovered_idx;

ALTER TABLE etl_job_attempts DROP COLUMN owner_id;
