-- Reverts 0021: no caps, no permits. Locks: ACCESS EXCLUSIVE on etl_queues, etl_job_records and
-- etl_queue_permits while they change (catalog only).
DROP TABLE etl_queue_permits;
DROP FUNCTION durable_etl_notify_permits();
ALTER TABLE etl_job_records DROP COLUMN permit_slot;
ALTER TABLE etl_queues DROP COLUMN cap;
