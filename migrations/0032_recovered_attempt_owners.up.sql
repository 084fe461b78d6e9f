-- 0032: which replica a recovered attempt was taken from, so a replica that was only cut off can
-- give back the charge.
--
-- Recovery takes a lock-backed owner's running jobs once its locks are gone and its beats have
-- been silent for its silence (0030), charging the attempt. A replica whose every connection was
-- cut for longer than that is judged exactly like a dead one: the database cannot tell them apart
-- while it must act. A live replica learns it when it reaches the database again; it then turns
-- every attempt of its own incarnation that recovery took (`owner_id` its own, started since its
-- start-up) from `recovered` into `released`, and gives each still-live job back the attempt.
-- Only a replica that never comes back (its process died) leaves its recovered attempts charged.
--
-- Readers: additive. A release before it records no owner (its recovered attempts stay charged,
-- as they always were) and never reads the column.
--
-- Locks: ADD COLUMN without a default changes only the catalog; the index build reads the table
-- under a SHARE lock (writes to the history wait for it; the partial index holds only recovered
-- attempts).

ALTER TABLE etl_job_attempts ADD COLUMN owner_id text;

CREATE INDEX etl_job_attempts_recovered_idx ON etl_job_attempts (owner_id, started_at)
    WHERE ending = 'recovered' AND owner_id IS NOT NULL;

COMMENT ON COLUMN etl_job_attempts.owner_id IS
    'durable-etl: for a recovered attempt, the replica it was taken from (its owner id, never a principal); null otherwise';
