-- 0008 down: one wide row per job again. Live rows get their intake columns back, ended jobs
-- become terminal rows (payload NULL) built from their intake and outcome, the ledger of
-- succeeded jobs becomes `etl_job_responses` again, and what pointed at the intake points at
-- the job table.
DROP VIEW etl_jobs;

ALTER TABLE etl_job_records
    DROP CONSTRAINT etl_job_records_status_check,
    ADD COLUMN idempotency_key_digest bytea
        CHECK (octet_length(idempotency_key_digest) = 32),
    ADD COLUMN request_fingerprint bytea CHECK (octet_length(request_fingerprint) = 32),
    ADD COLUMN replaces_job_id uuid,
    ADD COLUMN failure_code text CHECK (failure_code IN (
        'invalid_payload', 'record_invalid', 'attempts_exhausted', 'lease_expired_exhausted',
        'handler_panicked', 'handler_failed', 'execution_timeout', 'transient_database',
        'cancelled', 'replaced', 'unknown_kind')),
    ADD COLUMN failure_record_index integer CHECK (failure_record_index >= 0),
    ADD COLUMN finished_at timestamptz,
    ADD COLUMN created_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN cancel_requested_at timestamptz,
    ALTER COLUMN request_payload DROP NOT NULL;

UPDATE etl_job_records j
   SET idempotency_key_digest = i.idempotency_key_digest,
       request_fingerprint = i.request_fingerprint,
       replaces_job_id = i.replaces_job_id,
       created_at = i.created_at
  FROM etl_job_intake i
 WHERE i.id = j.id;

INSERT INTO etl_job_records
       (id, owner_key, idempotency_key_digest, request_fingerprint, kind, status, attempts,
        max_attempts, run_at, replaces_job_id, failure_code, failure_record_index, created_at,
        updated_at, started_at, finished_at)
SELECT i.id, i.owner_key, i.idempotency_key_digest, i.request_fingerprint, i.kind, o.status,
       least(o.attempts, i.max_attempts), i.max_attempts, o.run_at, i.replaces_job_id,
       o.failure_code, o.failure_record_index, i.created_at, o.finished_at, o.started_at,
       o.finished_at
  FROM etl_job_intake i
  JOIN etl_job_outcomes o ON o.job_id = i.id;

ALTER TABLE etl_job_records
    ALTER COLUMN idempotency_key_digest SET NOT NULL,
    ALTER COLUMN request_fingerprint SET NOT NULL,
    ADD CONSTRAINT etl_job_records_status_check
        CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
    ADD CONSTRAINT etl_job_records_terminal_payload_cleared
        CHECK (status IN ('pending', 'running') OR request_payload IS NULL),
    ADD CONSTRAINT etl_job_records_failure_code_matches_status CHECK (
        CASE status
            WHEN 'failed' THEN failure_code IS NOT NULL
            WHEN 'cancelled' THEN failure_code IN ('cancelled', 'replaced')
            WHEN 'succeeded' THEN failure_code IS NULL
            ELSE true
        END),
    ADD CONSTRAINT etl_job_records_finished_iff_terminal
        CHECK ((status IN ('succeeded', 'failed', 'cancelled')) = (finished_at IS NOT NULL)),
    ADD CONSTRAINT etl_job_records_idempotency UNIQUE (owner_key, idempotency_key_digest),
    ADD CONSTRAINT etl_job_records_replaces_job_id_fkey
        FOREIGN KEY (replaces_job_id) REFERENCES etl_job_records (id) ON DELETE SET NULL;
-- Reset and set again, in 0001's order, so the catalog reads as 0001 left it.
ALTER TABLE etl_job_records RESET (fillfactor, autovacuum_vacuum_scale_factor,
    autovacuum_vacuum_threshold, autovacuum_analyze_scale_factor, autovacuum_analyze_threshold,
    autovacuum_vacuum_cost_delay);
ALTER TABLE etl_job_records SET (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 500,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 500,
    autovacuum_vacuum_cost_delay = 0
);

CREATE INDEX etl_job_records_owner_listing_idx ON etl_job_records (owner_key, id);
CREATE INDEX etl_job_records_owner_status_listing_idx ON etl_job_records (owner_key, status, id);
CREATE INDEX etl_job_records_replaces_idx
    ON etl_job_records (replaces_job_id)
    WHERE replaces_job_id IS NOT NULL;

COMMENT ON TABLE etl_job_records IS
    'durable-etl jobs; principals and idempotency keys stored only as keyed digests';

-- The ledger table of 0001, as 0006 left it (no foreign key; a trigger follows deleted jobs).
CREATE TABLE etl_job_responses (
    job_id          uuid        PRIMARY KEY,
    lease_claim_id  uuid        NOT NULL,
    rows_inserted   integer     NOT NULL CHECK (rows_inserted >= 0),
    rows_updated    integer     NOT NULL CHECK (rows_updated >= 0),
    rows_unchanged  integer     NOT NULL CHECK (rows_unchanged >= 0),
    data_checksum   bytea       NOT NULL CHECK (octet_length(data_checksum) = 32),
    committed_at    timestamptz NOT NULL DEFAULT now()
);

INSERT INTO etl_job_responses
       (job_id, lease_claim_id, rows_inserted, rows_updated, rows_unchanged, data_checksum,
        committed_at)
SELECT job_id, lease_claim_id, rows_inserted, rows_updated, rows_unchanged, data_checksum,
       finished_at
  FROM etl_job_outcomes
 WHERE status = 'succeeded';

CREATE FUNCTION etl_job_responses_follow_deleted_jobs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM etl_job_responses r USING deleted_jobs d WHERE r.job_id = d.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER etl_job_records_delete_responses
    AFTER DELETE ON etl_job_records
    REFERENCING OLD TABLE AS deleted_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION etl_job_responses_follow_deleted_jobs();

ALTER TABLE etl_job_cancel_requests
    DROP CONSTRAINT etl_job_cancel_requests_job_id_fkey,
    ADD CONSTRAINT etl_job_cancel_requests_job_id_fkey
        FOREIGN KEY (job_id) REFERENCES etl_job_records (id) ON DELETE CASCADE;
ALTER TABLE etl_target_rows
    DROP CONSTRAINT etl_target_rows_written_by_job_fkey,
    ADD CONSTRAINT etl_target_rows_written_by_job_fkey
        FOREIGN KEY (written_by_job) REFERENCES etl_job_records (id) ON DELETE SET NULL;

DROP TABLE etl_job_outcomes;
DROP TABLE etl_job_intake;

-- The view of 0007, over the wide table again.
CREATE VIEW etl_jobs AS
SELECT j.id,
       j.owner_key,
       j.kind,
       j.status,
       j.attempts,
       j.max_attempts,
       j.run_at,
       j.created_at,
       j.updated_at,
       j.started_at,
       j.finished_at,
       j.failure_code,
       j.failure_record_index,
       j.lease_owner_id,
       j.lease_claim_id,
       j.lease_expires_at,
       j.replaces_job_id,
       (j.cancel_requested_at IS NOT NULL
        OR EXISTS (SELECT 1 FROM etl_job_cancel_requests c WHERE c.job_id = j.id))
           AS cancel_requested,
       r.rows_inserted,
       r.rows_updated,
       r.rows_unchanged,
       r.data_checksum
  FROM etl_job_records j
  LEFT JOIN etl_job_responses r ON r.job_id = j.id;

COMMENT ON VIEW etl_jobs IS
    'durable-etl: one row per job ever accepted (no payload, no idempotency key); query this, not the tables';
