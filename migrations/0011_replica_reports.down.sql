-- 0011 down: no replica reports. Locks: ACCESS EXCLUSIVE on both tables while they are dropped;
-- replicas of a release with 0011 still running then fail to report (logged), and keep working.
DROP TABLE etl_replica_minutes;
DROP TABLE etl_replicas;
