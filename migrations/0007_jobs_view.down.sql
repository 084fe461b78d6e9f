-- 0007 down.
DROP VIEW etl_jobs;
