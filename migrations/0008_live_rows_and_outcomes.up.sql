-- 0008: the storage redesign. A job's life is split over three tables, each written the way it
-- is read:
--
-- - `etl_job_intake`: one row per job ever accepted, written once at enqueue and never updated
--   (who asked, the idempotency digest and fingerprint, kind, bound, first due time, the job it
--   replaces). The idempotency constraint and the owner's listing index live here.
-- - `etl_job_records`: one narrow row per LIVE job (`pending` or `running`) with its payload and
--   its lease. This is the table claims lock (`FOR NO KEY UPDATE SKIP LOCKED`). It has exactly two
--   partial indexes (due pending rows; running rows by owner) and no index on the lease expiry,
--   so heartbeats are HOT updates. No foreign key points at it, so deleting a row fires nothing.
-- - `etl_job_outcomes`: one row per ENDED job (`succeeded`, `failed`, `cancelled`), appended by the
--   same statement that deletes the job's live row under its fence: a stale claim deletes
--   nothing, so it can write no outcome; the payload is gone by construction (it exists only on
--   the live row); a job with an outcome has no live row to claim, and the primary key refuses a
--   second outcome. A succeeded job's outcome carries its response ledger (rows inserted,
--   updated, unchanged, checksum), so effects, ledger and success commit as one row of the
--   effects transaction. This replaces `etl_job_responses`.
--
-- `etl_jobs` (0007) becomes the join of the three: one row per job, one snapshot per statement
-- (a terminal transition deletes and inserts in one statement, so a reader sees the live row or
-- the outcome, never both, never neither).
--
-- Locks: ACCESS EXCLUSIVE on the job tables while it runs (it moves every row once): stop every
-- replica and API process first (docs/migrations.md).

CREATE TABLE etl_job_intake (
    id                     uuid        PRIMARY KEY,
    owner_key              bytea       NOT NULL CHECK (octet_length(owner_key) = 32),
    idempotency_key_digest bytea       NOT NULL CHECK (octet_length(idempotency_key_digest) = 32),
    request_fingerprint    bytea       NOT NULL CHECK (octet_length(request_fingerprint) = 32),
    kind                   text        NOT NULL CHECK (kind ~ '^[a-z][a-z0-9_.]{0,62}$'),
    max_attempts           integer     NOT NULL CHECK (max_attempts BETWEEN 1 AND 100),
    run_at                 timestamptz NOT NULL,
    replaces_job_id        uuid
        CONSTRAINT etl_job_intake_replaces_job_id_fkey
        REFERENCES etl_job_intake (id) ON DELETE SET NULL,
    created_at             timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT etl_job_intake_idempotency UNIQUE (owner_key, idempotency_key_digest)
);

COMMENT ON TABLE etl_job_intake IS
    'durable-etl: every accepted job, written once; principals and idempotency keys only as keyed digests';

CREATE INDEX etl_job_intake_owner_listing_idx ON etl_job_intake (owner_key, id);

CREATE INDEX etl_job_intake_replaces_idx
    ON etl_job_intake (replaces_job_id)
    WHERE replaces_job_id IS NOT NULL;

CREATE TABLE etl_job_outcomes (
    job_id               uuid        PRIMARY KEY,
    owner_key            bytea       NOT NULL CHECK (octet_length(owner_key) = 32),
    status               text        NOT NULL
        CHECK (status IN ('succeeded', 'failed', 'cancelled')),
    attempts             integer     NOT NULL CHECK (attempts >= 0),
    run_at               timestamptz NOT NULL,
    lease_claim_id       uuid,
    failure_code         text        CHECK (failure_code IN (
        'invalid_payload', 'record_invalid', 'attempts_exhausted', 'lease_expired_exhausted',
        'handler_panicked', 'handler_failed', 'execution_timeout', 'transient_database',
        'cancelled', 'replaced', 'unknown_kind')),
    failure_record_index integer     CHECK (failure_record_index >= 0),
    rows_inserted        integer     CHECK (rows_inserted >= 0),
    rows_updated         integer     CHECK (rows_updated >= 0),
    rows_unchanged       integer     CHECK (rows_unchanged >= 0),
    data_checksum        bytea       CHECK (octet_length(data_checksum) = 32),
    started_at           timestamptz,
    finished_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT etl_job_outcomes_failure_code_matches_status CHECK (
        CASE status
            WHEN 'failed' THEN failure_code IS NOT NULL
            WHEN 'cancelled' THEN failure_code IN ('cancelled', 'replaced')
            ELSE failure_code IS NULL
        END),
    CONSTRAINT etl_job_outcomes_ledger_iff_succeeded CHECK (
        (status = 'succeeded') = (rows_inserted IS NOT NULL AND rows_updated IS NOT NULL
                                  AND rows_unchanged IS NOT NULL AND data_checksum IS NOT NULL
                                  AND lease_claim_id IS NOT NULL))
) WITH (
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 500
);

-- An owner's ended jobs by status, newest first: the listing with `?status=` an ended state.
CREATE INDEX etl_job_outcomes_owner_status_listing_idx
    ON etl_job_outcomes (owner_key, status, job_id);

COMMENT ON TABLE etl_job_outcomes IS
    'durable-etl: how each ended job ended, with the response ledger of succeeded ones; append only';

-- Every job ever accepted, then the ended ones' outcomes with their ledgers.
INSERT INTO etl_job_intake
       (id, owner_key, idempotency_key_digest, request_fingerprint, kind, max_attempts, run_at,
        replaces_job_id, created_at)
SELECT id, owner_key, idempotency_key_digest, request_fingerprint, kind, max_attempts, run_at,
       replaces_job_id, created_at
  FROM etl_job_records;

INSERT INTO etl_job_outcomes
       (job_id, owner_key, status, attempts, run_at, lease_claim_id, failure_code, failure_record_index,
        rows_inserted, rows_updated, rows_unchanged, data_checksum, started_at, finished_at)
SELECT j.id, j.owner_key, j.status, j.attempts, j.run_at, r.lease_claim_id, j.failure_code,
       j.failure_record_index, r.rows_inserted, r.rows_updated, r.rows_unchanged, r.data_checksum,
       j.started_at, j.finished_at
  FROM etl_job_records j
  LEFT JOIN etl_job_responses r ON r.job_id = j.id AND j.status = 'succeeded'
 WHERE j.status IN ('succeeded', 'failed', 'cancelled');

-- Cancel requests that releases before 0004 left on the row become rows of the request table.
INSERT INTO etl_job_cancel_requests (job_id, requested_at)
SELECT id, cancel_requested_at FROM etl_job_records
 WHERE cancel_requested_at IS NOT NULL AND status IN ('pending', 'running')
    ON CONFLICT (job_id) DO NOTHING;

-- What pointed at the wide table points at the intake now.
ALTER TABLE etl_job_cancel_requests
    DROP CONSTRAINT etl_job_cancel_requests_job_id_fkey,
    ADD CONSTRAINT etl_job_cancel_requests_job_id_fkey
        FOREIGN KEY (job_id) REFERENCES etl_job_intake (id) ON DELETE CASCADE;
ALTER TABLE etl_target_rows
    DROP CONSTRAINT etl_target_rows_written_by_job_fkey,
    ADD CONSTRAINT etl_target_rows_written_by_job_fkey
        FOREIGN KEY (written_by_job) REFERENCES etl_job_intake (id) ON DELETE SET NULL;

-- The ledger is in the outcomes now.
DROP VIEW etl_jobs;
DROP TRIGGER etl_job_records_delete_responses ON etl_job_records;
DROP FUNCTION etl_job_responses_follow_deleted_jobs();
DROP TABLE etl_job_responses;

-- The job table keeps its live rows only, and only what a live row needs.
DELETE FROM etl_job_records WHERE status NOT IN ('pending', 'running');
ALTER TABLE etl_job_records
    DROP CONSTRAINT etl_job_records_replaces_job_id_fkey,
    DROP CONSTRAINT etl_job_records_idempotency,
    DROP CONSTRAINT etl_job_records_terminal_payload_cleared,
    DROP CONSTRAINT etl_job_records_failure_code_matches_status,
    DROP CONSTRAINT etl_job_records_finished_iff_terminal,
    DROP CONSTRAINT etl_job_records_status_check,
    DROP COLUMN idempotency_key_digest,
    DROP COLUMN request_fingerprint,
    DROP COLUMN replaces_job_id,
    DROP COLUMN failure_code,
    DROP COLUMN failure_record_index,
    DROP COLUMN finished_at,
    DROP COLUMN created_at,
    DROP COLUMN cancel_requested_at,
    ALTER COLUMN request_payload SET NOT NULL,
    ADD CONSTRAINT etl_job_records_status_check CHECK (status IN ('pending', 'running'));
DROP INDEX etl_job_records_owner_listing_idx;
DROP INDEX etl_job_records_owner_status_listing_idx;
ALTER TABLE etl_job_records SET (fillfactor = 80);

COMMENT ON TABLE etl_job_records IS
    'durable-etl: live (pending and running) jobs with their payload and lease; ended jobs are in etl_job_outcomes';

-- The view joins the three. Locks: ACCESS SHARE on each table, like any SELECT: reading it
-- never blocks a claim, a commit or an enqueue. The listing walks etl_job_intake_owner_listing_idx
-- and probes the other two tables by primary key.
CREATE VIEW etl_jobs AS
SELECT i.id,
       i.owner_key,
       i.kind,
       coalesce(o.status, j.status) AS status,
       coalesce(o.attempts, j.attempts) AS attempts,
       i.max_attempts,
       coalesce(o.run_at, j.run_at) AS run_at,
       i.created_at,
       coalesce(o.finished_at, j.updated_at) AS updated_at,
       coalesce(o.started_at, j.started_at) AS started_at,
       o.finished_at,
       o.failure_code,
       o.failure_record_index,
       j.lease_owner_id,
       j.lease_claim_id,
       j.lease_expires_at,
       i.replaces_job_id,
       EXISTS (SELECT 1 FROM etl_job_cancel_requests c WHERE c.job_id = i.id) AS cancel_requested,
       o.rows_inserted,
       o.rows_updated,
       o.rows_unchanged,
       o.data_checksum
  FROM etl_job_intake i
  LEFT JOIN etl_job_records j ON j.id = i.id
  LEFT JOIN etl_job_outcomes o ON o.job_id = i.id;

COMMENT ON VIEW etl_jobs IS
    'durable-etl: one row per job ever accepted (no payload, no idempotency key); query this, not the tables';
