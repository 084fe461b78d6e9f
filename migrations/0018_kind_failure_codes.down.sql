-- Reverts 0018: only the crate's own codes again. A job that ended with a code its kind declared
-- keeps the code releases before 0018 stored for a kind's own permanent failure,
-- `handler_failed`.
--
-- Locks: ACCESS EXCLUSIVE on etl_job_outcomes while the constraint is swapped and validated (a
-- scan of the history); the UPDATE row-locks the outcomes with a kind's code.
UPDATE etl_job_outcomes
   SET failure_code = 'handler_failed'
 WHERE failure_code NOT IN (
        'invalid_payload', 'record_invalid', 'attempts_exhausted', 'lease_expired_exhausted',
        'handler_panicked', 'handler_failed', 'execution_timeout', 'transient_database',
        'cancelled', 'replaced', 'unknown_kind');
ALTER TABLE etl_job_outcomes
    DROP CONSTRAINT etl_job_outcomes_failure_code_check,
    ADD CONSTRAINT etl_job_outcomes_failure_code_check CHECK (failure_code IN (
        'invalid_payload', 'record_invalid', 'attempts_exhausted', 'lease_expired_exhausted',
        'handler_panicked', 'handler_failed', 'execution_timeout', 'transient_database',
        'cancelled', 'replaced', 'unknown_kind'));
