-- 0040: VACUUM never shrinks the live job table's file, so no VACUUM ever takes the lock that
-- holds up every claim, enqueue and completion.
--
-- A VACUUM that finds empty pages at the end of a table truncates them, under an ACCESS
-- EXCLUSIVE lock it takes and gives back in 20 ms steps while anyone waits, for up to seconds
-- while the table churns. On `etl_job_records` under a sustained load an autovacuum's truncation
-- held claims and enqueues for about four seconds (throughput of that five-second window fell
-- from 32,000 to 4,800 jobs/s). The replicas vacuum the table often
-- (`worker::maintain::vacuum`), so its free space is recorded and reused and the file stays as
-- large as its busiest moment; `VACUUM (TRUNCATE true) etl_job_records` gives the rest back at a
-- quiet time.
--
-- Readers: a storage parameter; no release reads it.
--
-- Locks: SET of a storage parameter takes SHARE UPDATE EXCLUSIVE on the table for an instant
-- (it waits for a running VACUUM, never for claims or enqueues).

ALTER TABLE etl_job_records SET (vacuum_truncate = false);
