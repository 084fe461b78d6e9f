-- 0036: the diagnosis of every attempt that failed, beside its code.
--
-- A retried or recovered attempt (`etl_job_attempts`) and a failed job's last attempt
-- (`etl_job_outcomes`) keep one JSON document, `diagnosis`: the phase the attempt failed in
-- (compute, effects, commit, recovery), the retry decision and its delay, how long the attempt
-- ran, the Rust type names of its error and of that error's sources (never their messages), and
-- the structured detail its kind declared (integers, booleans and tags only). It is written by
-- the same fenced statement that writes the row; successes, cancellations and releases keep
-- none.
--
-- Readers: additive. A release before it neither writes nor reads the columns (the attempts its
-- replicas end keep no diagnosis).
--
-- Locks: ADD COLUMN without a default changes only the catalog (each table's ACCESS EXCLUSIVE
-- lock for an instant); the CHECK is NOT VALID (the column is new: every row is NULL).

ALTER TABLE etl_job_attempts ADD COLUMN diagnosis jsonb;

ALTER TABLE etl_job_outcomes
    ADD COLUMN diagnosis jsonb,
    ADD CONSTRAINT etl_job_outcomes_diagnosis_only_if_failed
        CHECK (diagnosis IS NULL OR status = 'failed') NOT VALID;

COMMENT ON COLUMN etl_job_attempts.diagnosis IS
    'durable-etl: the attempt''s diagnosis (phase, retry decision, duration, error type names, declared detail; never a message); null for an attempt its replica gave back';

COMMENT ON COLUMN etl_job_outcomes.diagnosis IS
    'durable-etl: the failed job''s last attempt''s diagnosis (never a message); null for a success or a cancellation';
