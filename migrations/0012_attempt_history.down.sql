-- 0012 down: no attempt history. Locks: ACCESS EXCLUSIVE on the table and on etl_job_intake
-- (dropping the foreign key's triggers) while it is dropped: it waits for running listings and
-- holds enqueues for that moment. Roll replicas back to a release before 0012 first: a release
-- with 0012 appends here on every retry, recovery and release.
DROP TABLE etl_job_attempts;
