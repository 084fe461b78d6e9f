-- 0014 down: recovery by the recovering replica's heartbeat interval and the owner lock alone.
-- Stop the replicas of a release with 0014 first: their claims write the columns.
--
-- Locks: ACCESS EXCLUSIVE on etl_job_records while the columns are dropped.
DROP FUNCTION durable_etl_owner_alive_key(text);

ALTER TABLE etl_job_records
    DROP COLUMN lease_heartbeat_ms,
    DROP COLUMN lease_owner_alive_locked;
