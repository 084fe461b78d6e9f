-- 0002 down.
ALTER TABLE etl_job_records DROP COLUMN lease_owner_locked;
