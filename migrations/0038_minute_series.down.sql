-- 0038 down: the backlog minutes and the minute rows' series go; the rest of each minute row
-- stays. Roll the replicas back first: a replica of a release with 0038 would fail its reports.

DROP TABLE etl_backlog_minutes;
ALTER TABLE etl_replica_minutes
    DROP COLUMN pickup_buckets,
    DROP COLUMN by_queue;
