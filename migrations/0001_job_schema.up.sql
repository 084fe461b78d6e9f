-- 0001 job schema: the job table, the response ledger, the ETL target rows, API clients and the
-- enqueue trigger. Applied in one transaction by `durable-etl migrate` under the migration lock.

-- Jobs. One row per accepted ETL request; the lifecycle is
--   pending -> running -> succeeded | failed | cancelled, and running -> pending (retry, release, recovery).
-- Principals and idempotency keys are stored only as keyed HMAC-SHA-256 digests (32 bytes).
CREATE TABLE etl_job_records (
    id                     uuid        PRIMARY KEY,
    owner_key              bytea       NOT NULL CHECK (octet_length(owner_key) = 32),
    idempotency_key_digest bytea       NOT NULL CHECK (octet_length(idempotency_key_digest) = 32),
    request_fingerprint    bytea       NOT NULL CHECK (octet_length(request_fingerprint) = 32),
    kind                   text        NOT NULL CHECK (kind ~ '^[a-z][a-z0-9_.]{0,62}$'),
    request_payload        jsonb,
    status                 text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
    attempts               integer     NOT NULL DEFAULT 0,
    max_attempts           integer     NOT NULL DEFAULT 5 CHECK (max_attempts BETWEEN 1 AND 100),
    run_at                 timestamptz NOT NULL DEFAULT now(),
    lease_owner_id         text        CHECK (char_length(lease_owner_id) BETWEEN 1 AND 128),
    lease_claim_id         uuid,
    lease_expires_at       timestamptz,
    cancel_requested_at    timestamptz,
    replaces_job_id        uuid        REFERENCES etl_job_records (id),
    failure_code           text        CHECK (failure_code IN (
        'invalid_payload', 'record_invalid', 'attempts_exhausted', 'lease_expired_exhausted',
        'handler_panicked', 'handler_failed', 'execution_timeout', 'transient_database',
        'cancelled', 'replaced', 'unknown_kind')),
    failure_record_index   integer     CHECK (failure_record_index >= 0),
    created_at             timestamptz NOT NULL DEFAULT now(),
    updated_at             timestamptz NOT NULL DEFAULT now(),
    started_at             timestamptz,
    finished_at            timestamptz,
    -- Attempts are counted at claim time and a claim needs attempts < max_attempts.
    CONSTRAINT etl_job_records_attempts_bounded CHECK (attempts BETWEEN 0 AND max_attempts),
    -- Every terminal transition clears the payload in the same statement.
    CONSTRAINT etl_job_records_terminal_payload_cleared
        CHECK (status IN ('pending', 'running') OR request_payload IS NULL),
    -- A running row always carries its whole lease; no other state carries one.
    CONSTRAINT etl_job_records_running_has_lease CHECK (
        (status = 'running') = (lease_owner_id IS NOT NULL
                                AND lease_claim_id IS NOT NULL
                                AND lease_expires_at IS NOT NULL)),
    -- failed and cancelled rows say why; succeeded rows have no failure; pending rows may keep the
    -- code of the transient failure that scheduled their retry.
    CONSTRAINT etl_job_records_failure_code_matches_status CHECK (
        CASE status
            WHEN 'failed' THEN failure_code IS NOT NULL
            WHEN 'cancelled' THEN failure_code IN ('cancelled', 'replaced')
            WHEN 'succeeded' THEN failure_code IS NULL
            ELSE true
        END),
    CONSTRAINT etl_job_records_finished_iff_terminal
        CHECK ((status IN ('succeeded', 'failed', 'cancelled')) = (finished_at IS NOT NULL)),
    CONSTRAINT etl_job_records_idempotency UNIQUE (owner_key, idempotency_key_digest)
) WITH (
    -- Every job row is updated in place three or more times (claim, heartbeats, completion).
    -- Leaving 30% of each page free lets those new row versions stay on the same page, which keeps
    -- heartbeat updates HOT (no indexed column changes) and avoids page splits on the hot heap.
    fillfactor = 70,
    -- A queue table churns: dead versions in the pending index slow every claim. Vacuum after 2% of
    -- the rows (or 500 rows) are dead instead of the default 20%, and analyze as often so the planner
    -- keeps seeing the real size of the pending set.
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 500,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 500,
    -- Do not throttle vacuum on this table: it is small per pass and latency-critical.
    autovacuum_vacuum_cost_delay = 0
);

COMMENT ON TABLE etl_job_records IS
    'durable-etl jobs; principals and idempotency keys stored only as keyed digests';

-- The claim predicate, exactly: status = 'pending' AND run_at <= now() ORDER BY run_at, id.
-- Partial, so it holds only the pending rows and stays small however many terminal rows remain.
CREATE INDEX etl_job_records_pending_due_idx
    ON etl_job_records (run_at, id)
    WHERE status = 'pending';

-- The recovery and heartbeat predicate: status = 'running', by owner. It indexes lease_owner_id and
-- not lease_expires_at on purpose: heartbeats update only lease_expires_at and updated_at, so with no
-- indexed column changed they are HOT updates. Running rows are bounded by the slots of all replicas,
-- so recovery filters expired leases from this small set.
CREATE INDEX etl_job_records_running_owner_idx
    ON etl_job_records (lease_owner_id)
    WHERE status = 'running';

-- The owner's job listing, newest first, with keyset pagination on id (UUIDv7 is time-ordered).
CREATE INDEX etl_job_records_owner_listing_idx
    ON etl_job_records (owner_key, id);

-- The response ledger: one row per job whose effects committed, written in the same transaction as
-- the effects and the succeeded transition. Its existence means "never execute this job again".
CREATE TABLE etl_job_responses (
    job_id          uuid        PRIMARY KEY REFERENCES etl_job_records (id) ON DELETE CASCADE,
    lease_claim_id  uuid        NOT NULL,
    rows_inserted   integer     NOT NULL CHECK (rows_inserted >= 0),
    rows_updated    integer     NOT NULL CHECK (rows_updated >= 0),
    rows_unchanged  integer     NOT NULL CHECK (rows_unchanged >= 0),
    data_checksum   bytea       NOT NULL CHECK (octet_length(data_checksum) = 32),
    committed_at    timestamptz NOT NULL DEFAULT now()
);

-- ETL target rows, keyed by owner, dataset and record key, with the job that last wrote them.
CREATE TABLE etl_target_rows (
    owner_key      bytea       NOT NULL CHECK (octet_length(owner_key) = 32),
    dataset        text        NOT NULL CHECK (dataset ~ '^[a-z][a-z0-9_]{0,62}$'),
    record_key     text        NOT NULL,
    record         jsonb       NOT NULL,
    written_by_job uuid        NOT NULL REFERENCES etl_job_records (id),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (owner_key, dataset, record_key)
) WITH (
    -- Loads upsert rows in place; the spare room keeps their new versions on the same page.
    fillfactor = 85
);

-- API clients: only the keyed digest of each API key is stored, mapped to the owner's keyed digest.
CREATE TABLE etl_api_clients (
    id          uuid        PRIMARY KEY,
    owner_key   bytea       NOT NULL CHECK (octet_length(owner_key) = 32),
    key_digest  bytea       NOT NULL UNIQUE CHECK (octet_length(key_digest) = 32),
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

-- The advisory-lock key of a replica's owner id: the first 64 bits of SHA-256 of the id. Each live
-- replica holds pg_advisory_lock(durable_etl_owner_lock_key(owner id)) on its long-lived session;
-- recovery reads pg_locks to tell live owners from dead ones.
CREATE FUNCTION durable_etl_owner_lock_key(owner_id text) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT ('x' || substr(encode(sha256(convert_to(owner_id, 'UTF8')), 'hex'), 1, 16))::bit(64)::bigint
$$;

-- The enqueue trigger. Statement level, so a statement inserting 1,000 jobs runs it once; and
-- NOTIFY folds identical notifications of one transaction into one, so a transaction sends at most
-- one. Why so frugal: every committing transaction that has notified takes a cluster-wide lock on
-- the notification queue during commit, which serializes those commits. The payload is constant and
-- empty: no id, payload or principal ever crosses the channel. Deferred jobs (run_at in the future)
-- do not notify; the worker's poll and its next-run_at timer pick them up.
CREATE FUNCTION durable_etl_notify_enqueue() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted_jobs WHERE status = 'pending' AND run_at <= now()) THEN
        PERFORM pg_notify('durable_etl_jobs', '');
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER etl_job_records_notify_enqueue
    AFTER INSERT ON etl_job_records
    REFERENCING NEW TABLE AS inserted_jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION durable_etl_notify_enqueue();
