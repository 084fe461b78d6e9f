-- 0001 down: removes everything 0001 created, in reverse dependency order.
DROP TRIGGER etl_job_records_notify_enqueue ON etl_job_records;
DROP FUNCTION durable_etl_notify_enqueue();
DROP FUNCTION durable_etl_owner_lock_key(text);
DROP TABLE etl_api_clients;
DROP TABLE etl_target_rows;
DROP TABLE etl_job_responses;
DROP TABLE etl_job_records;
