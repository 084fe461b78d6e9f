-- 0016: each owner's pending jobs in id order, for the listing by `?status=pending`.
--
-- The listing by a live status picks its page from the live table (never the owner's history),
-- but without an owner index there it walked the live table's primary key and filtered by owner:
-- every newer live job of any owner (a backlog of others' jobs) was read first. This partial
-- index holds only pending rows, so a claim (pending -> running) adds nothing to it; it is
-- written by the statements that make a row pending (enqueue, retry, release, recovery), which
-- write the pending due index too. Heartbeats stay HOT updates: they change no indexed column.
-- The listing by `?status=running` needs none: running rows are as many as the replicas' slots
-- and prefetch buffers hold, read through `etl_job_records_running_owner_idx`.
--
-- Readers: additive; releases before it never use it. Locks: SHARE on etl_job_records while the
-- index is built (claims, enqueues and heartbeats wait that long; the live table is small). It
-- is not built CONCURRENTLY because a migration runs in one transaction.
CREATE INDEX etl_job_records_pending_owner_idx
    ON etl_job_records (owner_key, id)
    WHERE status = 'pending';
