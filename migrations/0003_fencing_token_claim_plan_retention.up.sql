-- 0003: a monotonic fencing token per job, the time of a lease's last renewal, the claim as a
-- function that pins its own plan, foreign keys that let retention delete old jobs, and the
-- indexes retention and the status listing need. Applied in one transaction under the migration
-- lock; the index builds scan the job and target tables while holding their locks, so writers
-- wait for them (see docs/migrations.md).
--
-- Not readable by older releases (min_reader_version 3): their claims advance no fencing token
-- and stamp no renewal time, and their recovery treats a missing owner lock alone as death. The
-- CHECK below makes an older replica that is still running fail every claim instead.

-- The fencing token: the claim adds 1, and nothing else ever writes it (a release, a retry or a
-- recovery keep it), so for one job it only grows. External systems compare it; the fences of
-- this crate keep comparing `lease_claim_id`. Existing rows start at 0 (no rewrite of the table).
-- The renewal time: set by the claim and by heartbeats, read by recovery. No index covers it, so
-- a heartbeat that sets it stays a HOT update.
ALTER TABLE etl_job_records
    ADD COLUMN fencing_token bigint NOT NULL DEFAULT 0
        CONSTRAINT etl_job_records_fencing_token_check CHECK (fencing_token >= 0),
    ADD COLUMN lease_renewed_at timestamptz;

-- Rows a replica still runs while this migration applies were live a moment ago.
UPDATE etl_job_records SET lease_renewed_at = now() WHERE status = 'running';

-- A running row always says when its lease was last renewed (a claim of an older release, which
-- does not set it, fails here).
ALTER TABLE etl_job_records
    ADD CONSTRAINT etl_job_records_running_has_renewal
        CHECK (status <> 'running' OR lease_renewed_at IS NOT NULL);

-- The claim: takes up to `max_jobs` due jobs for `owner_id` with a lease of `lease_ms`
-- milliseconds; `owner_locked` says whether the owner holds its owner lock (so recovery may treat
-- the lock's absence as evidence of death).
--
-- Why a function: its SET clause scopes the planner switches to this one statement. Without
-- statistics (a new or truncated table after a bulk insert, before autoanalyze) the planner
-- guesses a handful of pending rows and prefers a bitmap scan plus a sort of every pending row;
-- with sorts and bitmap scans off it walks the pending index in order, whatever the statistics.
-- The switches end with the call, so every other statement of the session (group commits, a
-- library user's effects) plans with the server's settings. `plan_cache_mode` makes releases of
-- PostgreSQL that cache the plans of SQL functions (18 and later) plan each call with its
-- arguments; earlier ones plan the body at each call anyway.
--
-- Locks: the CTE walks `etl_job_records_pending_due_idx` in `(run_at, id)` order and takes a row
-- lock (`FOR NO KEY UPDATE`: the claim changes no key, so the `FOR KEY SHARE` locks of foreign-key
-- checks never make a claim skip a row) on each due pending row, skipping (`SKIP LOCKED`) rows
-- another claimer, canceller or recovery holds, so concurrent claimers never wait for each other
-- and never take the same row. After locking, PostgreSQL re-checks the row's current version
-- against the predicate. The UPDATE rewrites only the rows the CTE locked.
CREATE FUNCTION durable_etl_claim(max_jobs bigint, owner_id text, lease_ms bigint,
                                  owner_locked boolean)
    RETURNS TABLE (id uuid, kind text, request_payload jsonb, attempts integer,
                   max_attempts integer, lease_claim_id uuid, owner_key bytea, due_for float8,
                   fencing_token bigint)
    LANGUAGE sql VOLATILE
    SET enable_sort = off
    SET enable_bitmapscan = off
    SET plan_cache_mode = force_custom_plan
AS $$
WITH due AS (
    SELECT d.id
      FROM etl_job_records d
     WHERE d.status = 'pending' AND d.run_at <= now()
     ORDER BY d.run_at, d.id
     LIMIT max_jobs
     FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE etl_job_records AS j
   SET status = 'running',
       attempts = j.attempts + 1,
       fencing_token = j.fencing_token + 1,
       lease_claim_id = gen_random_uuid(),
       lease_owner_id = owner_id,
       lease_owner_locked = owner_locked,
       lease_expires_at = now() + lease_ms * interval '1 millisecond',
       lease_renewed_at = now(),
       started_at = now(),
       updated_at = now()
  FROM due
 WHERE j.id = due.id
RETURNING j.id, j.kind, j.request_payload, j.attempts, j.max_attempts, j.lease_claim_id,
          j.owner_key, greatest(extract(epoch FROM now() - j.run_at), 0)::float8,
          j.fencing_token
$$;

-- An owner's jobs of one status, newest first (`GET /v1/etl-jobs?status=`): the listing reads one
-- page of index entries instead of filtering every job of the owner.
CREATE INDEX etl_job_records_owner_status_listing_idx
    ON etl_job_records (owner_key, status, id);

-- The job that replaced a deleted one, for the foreign key's action. Partial: few jobs replace
-- another, and the column never changes after insert, so heartbeats stay HOT.
CREATE INDEX etl_job_records_replaces_idx
    ON etl_job_records (replaces_job_id)
    WHERE replaces_job_id IS NOT NULL;

-- The target rows a deleted job wrote, for the foreign key's action. A load that changes a row
-- also changes this column, so such updates are no longer HOT (rows a load leaves unchanged are
-- not updated at all).
CREATE INDEX etl_target_rows_written_by_job_idx
    ON etl_target_rows (written_by_job)
    WHERE written_by_job IS NOT NULL;

-- Retention deletes old terminal jobs: the target rows they wrote keep their data and lose the
-- name of their writer, and a job that replaced one of them loses its `replaces` link.
ALTER TABLE etl_target_rows
    ALTER COLUMN written_by_job DROP NOT NULL,
    DROP CONSTRAINT etl_target_rows_written_by_job_fkey,
    ADD CONSTRAINT etl_target_rows_written_by_job_fkey
        FOREIGN KEY (written_by_job) REFERENCES etl_job_records (id) ON DELETE SET NULL;

ALTER TABLE etl_job_records
    DROP CONSTRAINT etl_job_records_replaces_job_id_fkey,
    ADD CONSTRAINT etl_job_records_replaces_job_id_fkey
        FOREIGN KEY (replaces_job_id) REFERENCES etl_job_records (id) ON DELETE SET NULL;
