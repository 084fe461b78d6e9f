-- 0010 down: no operator keys; every key acts for its owner only. Locks: ACCESS EXCLUSIVE on
-- etl_api_clients for an instant.
ALTER TABLE etl_api_clients DROP COLUMN operator;
