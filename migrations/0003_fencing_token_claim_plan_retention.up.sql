-- 0003: a monotonic fencing token per job, the time of a lease's last renewal, foreign keys that
-- let retention delete old jobs, and the indexes retention and the status listing need. Applied in one transaction under the migration
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
