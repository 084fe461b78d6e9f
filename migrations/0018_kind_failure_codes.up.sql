-- 0018: a failed job may end with a failure code its kind declares (`Job::CODES`), beside the
-- crate's own stored codes.
--
-- The outcome's `failure_code` was checked against the crate's fixed list. A kind of the job
-- runtime now declares codes of its own (an email kind's `address_bounced`, say), which the
-- worker stores only when the kind declared them. The database keeps them codes, never text: a
-- lower-case identifier of 1 to 63 characters (`[a-z][a-z0-9_]*`), which every code of the
-- crate's list is too; a cancelled job still ends only `cancelled` or `replaced`
-- (`etl_job_outcomes_failure_code_matches_status`). The check reads `[a-z][a-z0-9_]{0,62}`
-- without a regular expression, which costs a few microseconds a row (see 0019).
--
-- Readers: additive. Releases before it read the code as text and show it as it is; they never
-- run the kinds that declare codes. Locks: ACCESS EXCLUSIVE on etl_job_outcomes for the
-- constraint swap (catalog only: added NOT VALID, since every existing row met the stricter old
-- list, so no scan of the history runs under the lock).
ALTER TABLE etl_job_outcomes
    DROP CONSTRAINT etl_job_outcomes_failure_code_check,
    ADD CONSTRAINT etl_job_outcomes_failure_code_check
        CHECK (octet_length(failure_code) <= 63 AND ascii(failure_code) BETWEEN 97 AND 122
               AND ltrim(failure_code, 'abcdefghijklmnopqrstuvwxyz0123456789_') = '') NOT VALID;
