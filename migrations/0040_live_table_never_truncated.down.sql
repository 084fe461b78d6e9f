-- 0040 down: VACUUM may truncate the live job table again (the server's default).

ALTER TABLE etl_job_records RESET (vacuum_truncate);
