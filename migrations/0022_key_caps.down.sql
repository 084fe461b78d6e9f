-- Reverts 0022: no key caps, no key permits, no keys, no kinds or queues in the replicas' reports.
-- Locks: ACCESS EXCLUSIVE on etl_queues, etl_replicas, etl_job_records and etl_key_permits while
-- they change (catalog only).
DROP TABLE etl_key_permits;
DROP FUNCTION durable_etl_notify_key_permits();
ALTER TABLE etl_job_records DROP COLUMN concurrency_key;
ALTER TABLE etl_queues DROP COLUMN key_cap;
ALTER TABLE etl_replicas DROP COLUMN kinds, DROP COLUMN queues;
