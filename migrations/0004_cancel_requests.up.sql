-- 0004: cancel requests that never wait for a job's row.

-- A cancel request for a running job, recorded without touching (or waiting for the lock of) the
-- job's row: a commit or a claim may hold that row for as long as a job's effects take. Every path
-- that ends an attempt reads it (a primary-key probe in each statement): a fenced success never
-- commits for a job that has a request, and retry, release and recovery end it `cancelled` instead
-- of returning it to `pending`. The foreign key's check takes FOR KEY SHARE on the job row, which
-- conflicts with none of the FOR NO KEY UPDATE locks that claims and commits hold.
CREATE TABLE etl_job_cancel_requests (
    job_id       uuid        PRIMARY KEY REFERENCES etl_job_records (id) ON DELETE CASCADE,
    requested_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE etl_job_cancel_requests IS
    'durable-etl: owners'' requests to cancel running jobs, recorded without the job row''s lock';
