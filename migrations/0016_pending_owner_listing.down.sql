-- 0016 down: no owner index of pending jobs; the listing by `?status=pending` walks the live
-- table's primary key again. Locks: ACCESS EXCLUSIVE on etl_job_records while it is dropped.
DROP INDEX etl_job_records_pending_owner_idx;
