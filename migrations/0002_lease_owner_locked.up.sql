-- 0002: records whether a claim's owner holds its owner lock, so recovery can tell a dead owner
-- (lock-backed, lock gone) from one that never holds a lock (a replica behind a transaction-mode
-- pooler with no direct session), whose jobs are recovered by lease expiry alone.
-- Additive: a release that knows only 0001 never sets it (default false), and its rows are then
-- recovered by expiry, which is always safe.
ALTER TABLE etl_job_records
    ADD COLUMN lease_owner_locked boolean NOT NULL DEFAULT false;
