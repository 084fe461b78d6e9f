-- 0031: cancel requests recorded while a commit holds the job's row.
--
-- An owner's cancel of a running job sets `cancel_code` on its live row, which a group commit
-- holds (row-locked) while the job's effects apply. A cancel never waits for that lock: when the
-- row stays held, the request is recorded here and answered at once as "recorded; the job is
-- committing and may still succeed". If that commit ends the job, the request is moot and is
-- cleared; if it does not (the job is retried, released, recovered or stays running), the request
-- is applied to the live row (`cancel_code`) or, for a job back in `pending`, ends it `cancelled`:
-- by the replica's retry or release of the job (each applies it first), by the API process that
-- answered (it waits for the row right after answering), by every replica's rescuer pass, and by
-- the owner's next cancel of the job.
--
-- Readers: additive. A release before it never records here and ignores what is recorded (its
-- cancels wait for the row as before); replicas of this release apply what its API records.
--
-- Locks: CREATE TABLE takes nothing a job statement holds; the foreign key's check takes FOR KEY
-- SHARE on the job's intake row, which no commit, claim or cancel conflicts with.

CREATE TABLE etl_job_cancel_deferred (
    job_id       uuid        PRIMARY KEY REFERENCES etl_job_intake (id) ON DELETE CASCADE,
    code         text        NOT NULL CHECK (code IN ('cancelled', 'replaced')),
    requested_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE etl_job_cancel_deferred IS
    'durable-etl: owners'' cancel requests recorded while a commit held the job''s row, applied to it once the commit lets go';
