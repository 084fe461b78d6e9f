-- 0035: dead letters, and payloads kept sealed for their replay.
--
-- A job that ends `failed` (attempts or leases exhausted, a permanent failure, an invalid
-- payload, an unknown kind) is a dead letter: one row here, written by the same fenced statement
-- that appends its `failed` outcome and deletes its live row. A letter leaves the open list when
-- it is replayed (`replayed_job_id`: the one job its replay made, with who asked and when) or
-- discarded (its row deleted; the job's outcome stays). Nothing here names a principal, a payload
-- or an error message: the owner is its digest, the code a stable one.
--
-- `etl_retained_payloads` keeps the payload of a job whose kind or queue opted in, sealed by the
-- enqueuer (XChaCha20-Poly1305 under a key derived from the deployment's secret and `key_id`),
-- never in plaintext. Maintenance deletes a row once its job ended other than `failed`, or its
-- `ttl_s` has passed since the job failed; a replay or a discard deletes its letter's row.
--
-- Jobs that failed before this migration become letters here (one INSERT over the failed
-- outcomes whose intake row is kept).
--
-- Readers: additive. A release before it neither reads nor writes the tables; while one still
-- runs beside a release with 0035, the jobs it fails get no letter.
--
-- Locks: two new tables and their indexes; the backfill reads etl_job_outcomes and
-- etl_job_intake (ACCESS SHARE) and takes `FOR KEY SHARE` on the intake rows it references.

CREATE TABLE etl_dead_letters (
    job_id          uuid               NOT NULL PRIMARY KEY
        CONSTRAINT etl_dead_letters_job_id_fkey
        REFERENCES etl_job_intake (id) ON DELETE CASCADE,
    owner_key       durable_etl_digest     NOT NULL,
    queue           durable_etl_name       NOT NULL,
    kind            durable_etl_name       NOT NULL,
    code            durable_etl_identifier NOT NULL,
    attempts        integer                NOT NULL CHECK (attempts >= 0),
    failed_at       timestamptz            NOT NULL,
    replayed_job_id uuid,
    replayed_at     timestamptz,
    replayed_by     text CHECK (char_length(replayed_by) BETWEEN 1 AND 128),
    CONSTRAINT etl_dead_letters_replay_complete CHECK (
        (replayed_job_id IS NULL) = (replayed_at IS NULL)
        AND (replayed_at IS NULL) = (replayed_by IS NULL))
);

-- The open letters, newest first, by each filter a listing starts from: all of them (an
-- operator's), one owner's, one queue's, one kind's, one code's. A page is a keyset walk of one
-- of these, never of the job history.
CREATE INDEX etl_dead_letters_open_idx ON etl_dead_letters (failed_at, job_id)
    WHERE replayed_job_id IS NULL;
CREATE INDEX etl_dead_letters_owner_idx ON etl_dead_letters (owner_key, failed_at, job_id)
    WHERE replayed_job_id IS NULL;
CREATE INDEX etl_dead_letters_queue_idx ON etl_dead_letters (queue, failed_at, job_id)
    WHERE replayed_job_id IS NULL;
CREATE INDEX etl_dead_letters_kind_idx ON etl_dead_letters (kind, failed_at, job_id)
    WHERE replayed_job_id IS NULL;
CREATE INDEX etl_dead_letters_code_idx ON etl_dead_letters (code, failed_at, job_id)
    WHERE replayed_job_id IS NULL;
-- The letter a job replays (the job's page links back to it).
CREATE INDEX etl_dead_letters_replayed_idx ON etl_dead_letters (replayed_job_id)
    WHERE replayed_job_id IS NOT NULL;

COMMENT ON TABLE etl_dead_letters IS
    'durable-etl: jobs that ended failed, until replayed or discarded; no payload, no error text';

CREATE TABLE etl_retained_payloads (
    job_id     uuid        NOT NULL PRIMARY KEY
        CONSTRAINT etl_retained_payloads_job_id_fkey
        REFERENCES etl_job_intake (id) ON DELETE CASCADE,
    key_id     text        NOT NULL CHECK (char_length(key_id) BETWEEN 1 AND 64),
    sealed     bytea       NOT NULL CHECK (octet_length(sealed) > 40),
    ttl_s      integer     NOT NULL CHECK (ttl_s BETWEEN 1 AND 31536000),
    created_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE etl_retained_payloads IS
    'durable-etl: sealed (AEAD) payloads kept to replay dead letters; never plaintext';

INSERT INTO etl_dead_letters (job_id, owner_key, queue, kind, code, attempts, failed_at)
SELECT o.job_id, o.owner_key, i.queue, i.kind, o.failure_code, o.attempts, o.finished_at
  FROM etl_job_outcomes o
  JOIN etl_job_intake i ON i.id = o.job_id
 WHERE o.status = 'failed';
