-- 0012 down: no attempt history. Locks: ACCESS EXCLUSIVE on the table while it is dropped, and
-- SHARE ROW EXCLUSIVE on etl_job_intake for its foreign key. Roll replicas back to a release
-- before 0012 first: a release with 0012 appends here on every retry, recovery and release.
DROP TABLE etl_job_attempts;
