-- 0014: recovery judges a silent owner by the owner's own terms, and sees a dead process at once.
--
-- Two columns of a running row, stamped by the claim:
-- - `lease_heartbeat_ms`: the owner's heartbeat interval. Recovery's "unrenewed for two
--   heartbeat intervals" was the recovering replica's intervals, so a replica with a shorter
--   interval (`--lease 3s` gives 800 ms) took the job of a live peer (4 s) whose session was
--   reconnecting. NULL on rows claimed by a release before it: recovery then uses its own.
-- - `lease_owner_alive_locked`: every connection of the owner's own (its session, its claim and
--   commit sessions) holds a shared advisory lock on `durable_etl_owner_alive_key(owner)`
--   while it lives. When none does, the owner's process is gone (a dropped session alone leaves
--   the others' locks), so recovery need not wait for the leases to go unrenewed: a replica
--   SIGKILLed while its job computed ran again elsewhere only after two heartbeat intervals
--   (about 8 s), and now within a recovery pass.
--
-- Readers: breaking. A release before it would leave the columns as a newer claim set them when
-- it gives a row back or claims it (its statements do not know them), so recovery could judge an
-- older replica, which holds no alive lock, by a newer one's terms. Stop the older release's
-- processes before running it, as for 0013 (docs/migrations.md).
--
-- Locks: ACCESS EXCLUSIVE on etl_job_records while the columns are added (no default to write:
-- a catalog change only).
ALTER TABLE etl_job_records
    ADD COLUMN lease_heartbeat_ms integer CHECK (lease_heartbeat_ms > 0),
    ADD COLUMN lease_owner_alive_locked boolean NOT NULL DEFAULT false;

-- The key of the shared "alive" lock every connection of a live replica holds: the owner lock
-- key with its lowest bit flipped, so the two never share a key (the owner lock is exclusive
-- and held by the session alone; alive locks are shared and held by all of them).
CREATE FUNCTION durable_etl_owner_alive_key(owner_id text) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT durable_etl_owner_lock_key(owner_id) # 1
$$;
