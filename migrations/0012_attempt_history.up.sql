-- 0012: each attempt that did not end its job, for the console's job timeline.
--
-- A job's last attempt is on its live row (`started_at`) or its outcome (`started_at`,
-- `finished_at`). The attempts before it left no trace: a retry, a recovery or a shutdown release
-- overwrote the live row. Each of those statements now also appends one row here, in the same
-- statement, built only from the live rows it changed under their fence: when the attempt started,
-- when it ended, how (`retried` after a transient failure, `recovered` after its lease expired or
-- its owner died, `released` at a replica's shutdown, the attempt not charged), and when the job
-- was due again. Nothing here names an owner, a payload or an error message.
--
-- The success path, the claim and the heartbeat never write here: the table grows only with
-- retries, recoveries and releases. A row goes with its job (`ON DELETE CASCADE` from the intake,
-- which the retention runbook deletes).
--
-- Readers: additive. Releases before it never read it; while they still run retries beside a
-- release with 0012, the attempts they end are missing from the timeline. Writers: a release with
-- 0012 appends here on every retry, recovery and release, so roll its replicas back before running
-- the down script (docs/migrations.md).
--
-- Locks: creating the table takes SHARE ROW EXCLUSIVE on etl_job_intake for the foreign key
-- (briefly: the intake is empty of references to check).
CREATE TABLE etl_job_attempts (
    job_id     uuid        NOT NULL
        CONSTRAINT etl_job_attempts_job_id_fkey
        REFERENCES etl_job_intake (id) ON DELETE CASCADE,
    attempt    integer     NOT NULL CHECK (attempt >= 0),
    started_at timestamptz NOT NULL,
    ended_at   timestamptz NOT NULL DEFAULT now(),
    ending     text        NOT NULL CHECK (ending IN ('retried', 'recovered', 'released')),
    due_at     timestamptz NOT NULL
);

-- A job's attempts in order: the timeline's read, and the cascade's delete.
CREATE INDEX etl_job_attempts_job_idx ON etl_job_attempts (job_id, ended_at);

COMMENT ON TABLE etl_job_attempts IS
    'durable-etl: attempts that did not end their job (retried, recovered, released); no payload, no error text';
