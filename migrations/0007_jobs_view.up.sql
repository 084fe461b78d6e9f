-- 0007: `etl_jobs`, one row per job ever accepted, for operators and dashboards to query.
--
-- The view is the stable way to read jobs: what it shows stays while the tables behind it change
-- (the storage redesign moves live and terminal jobs into tables of their own; this view will then
-- join them). It never shows what an operator must not see: no payload, no idempotency-key digest,
-- no request fingerprint. `owner_key` is the HMAC digest of the owner, never the principal.
-- `cancel_requested` is true once the owner asked to cancel the job while it ran. The ledger
-- summary is there for succeeded jobs (NULL otherwise). The owner-scoped status API reads it too,
-- so what owners and operators see is one definition, read in one snapshot per statement.
--
-- Locks: reading it takes ACCESS SHARE on etl_job_records, etl_job_cancel_requests and
-- etl_job_responses, like any SELECT: it never blocks a claim, a commit or an enqueue.
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
