-- Reverts 0026: the columns back on their base types, each with the CHECK constraint it had
-- (the four added NOT VALID before, three by 0019 and the failure code's by 0018, are added
-- NOT VALID again; the others are validated, a scan of their table), the domains dropped, the
-- view recreated over the base types (a GRANT on it is not restored). The moved columns'
-- statistics are dropped again: ANALYZE afterwards.
-- Locks: ACCESS EXCLUSIVE on the five tables until the commit; no rewrite (a domain and its
-- base type are binary coercible); the live table's partial indexes over moved columns are
-- rebuilt, as on the way up.

DROP VIEW etl_jobs;

ALTER TABLE etl_job_intake
    ALTER COLUMN owner_key TYPE bytea,
    ALTER COLUMN idempotency_key_digest TYPE bytea,
    ALTER COLUMN request_fingerprint TYPE bytea,
    ALTER COLUMN kind TYPE text,
    ALTER COLUMN max_attempts TYPE integer,
    ALTER COLUMN queue TYPE text,
    ALTER COLUMN priority TYPE smallint,
    ADD CONSTRAINT etl_job_intake_owner_key_check CHECK ((octet_length(owner_key) = 32)),
    ADD CONSTRAINT etl_job_intake_idempotency_key_digest_check CHECK ((octet_length(idempotency_key_digest) = 32)),
    ADD CONSTRAINT etl_job_intake_request_fingerprint_check CHECK ((octet_length(request_fingerprint) = 32)),
    ADD CONSTRAINT etl_job_intake_kind_check CHECK (((octet_length(kind) <= 63) AND ((ascii(kind) >= 97) AND (ascii(kind) <= 122)) AND (ltrim(kind, 'abcdefghijklmnopqrstuvwxyz0123456789_.'::text) = ''::text))) NOT VALID,
    ADD CONSTRAINT etl_job_intake_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 100))),
    ADD CONSTRAINT etl_job_intake_queue_check CHECK (((octet_length(queue) <= 63) AND ((ascii(queue) >= 97) AND (ascii(queue) <= 122)) AND (ltrim(queue, 'abcdefghijklmnopqrstuvwxyz0123456789_.'::text) = ''::text))),
    ADD CONSTRAINT etl_job_intake_priority_check CHECK (((priority >= 0) AND (priority <= 9)));

ALTER TABLE etl_job_records
    ALTER COLUMN owner_key TYPE bytea,
    ALTER COLUMN kind TYPE text,
    ALTER COLUMN max_attempts TYPE integer,
    ALTER COLUMN lease_owner_id TYPE text,
    ALTER COLUMN queue TYPE text,
    ALTER COLUMN priority TYPE smallint,
    ALTER COLUMN concurrency_key TYPE text,
    ADD CONSTRAINT etl_job_records_owner_key_check CHECK ((octet_length(owner_key) = 32)),
    ADD CONSTRAINT etl_job_records_kind_check CHECK (((octet_length(kind) <= 63) AND ((ascii(kind) >= 97) AND (ascii(kind) <= 122)) AND (ltrim(kind, 'abcdefghijklmnopqrstuvwxyz0123456789_.'::text) = ''::text))) NOT VALID,
    ADD CONSTRAINT etl_job_records_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 100))),
    ADD CONSTRAINT etl_job_records_lease_owner_id_check CHECK (((char_length(lease_owner_id) >= 1) AND (char_length(lease_owner_id) <= 128))),
    ADD CONSTRAINT etl_job_records_queue_check CHECK (((octet_length(queue) <= 63) AND ((ascii(queue) >= 97) AND (ascii(queue) <= 122)) AND (ltrim(queue, 'abcdefghijklmnopqrstuvwxyz0123456789_.'::text) = ''::text))),
    ADD CONSTRAINT etl_job_records_priority_check CHECK (((priority >= 0) AND (priority <= 9))),
    ADD CONSTRAINT etl_job_records_concurrency_key_check CHECK (((octet_length(concurrency_key) >= 1) AND (octet_length(concurrency_key) <= 255)));

ALTER TABLE etl_job_outcomes
    ALTER COLUMN owner_key TYPE bytea,
    ALTER COLUMN failure_code TYPE text,
    ALTER COLUMN data_checksum TYPE bytea,
    ADD CONSTRAINT etl_job_outcomes_owner_key_check CHECK ((octet_length(owner_key) = 32)),
    ADD CONSTRAINT etl_job_outcomes_failure_code_check CHECK (((octet_length(failure_code) <= 63) AND ((ascii(failure_code) >= 97) AND (ascii(failure_code) <= 122)) AND (ltrim(failure_code, 'abcdefghijklmnopqrstuvwxyz0123456789_'::text) = ''::text))) NOT VALID,
    ADD CONSTRAINT etl_job_outcomes_data_checksum_check CHECK ((octet_length(data_checksum) = 32));

ALTER TABLE etl_target_rows
    ALTER COLUMN owner_key TYPE bytea,
    ALTER COLUMN dataset TYPE text,
    ADD CONSTRAINT etl_target_rows_owner_key_check CHECK ((octet_length(owner_key) = 32)),
    ADD CONSTRAINT etl_target_rows_dataset_check CHECK (((octet_length(dataset) <= 63) AND ((ascii(dataset) >= 97) AND (ascii(dataset) <= 122)) AND (ltrim(dataset, 'abcdefghijklmnopqrstuvwxyz0123456789_'::text) = ''::text))) NOT VALID;

ALTER TABLE etl_waiting_replicas
    ALTER COLUMN owner_id TYPE text,
    ADD CONSTRAINT etl_waiting_replicas_owner_id_check CHECK (((length(owner_id) >= 1) AND (length(owner_id) <= 128)));

DROP DOMAIN durable_etl_name;
DROP DOMAIN durable_etl_identifier;
DROP DOMAIN durable_etl_digest;
DROP DOMAIN durable_etl_priority;
DROP DOMAIN durable_etl_max_attempts;
DROP DOMAIN durable_etl_owner_id;
DROP DOMAIN durable_etl_concurrency_key;

CREATE VIEW etl_jobs AS
SELECT i.id,
       i.owner_key,
       i.kind,
       coalesce(o.status, j.status) AS status,
       coalesce(o.attempts, j.attempts) AS attempts,
       i.max_attempts,
       coalesce(o.run_at, j.run_at) AS run_at,
       i.created_at,
       coalesce(o.finished_at, j.updated_at) AS updated_at,
       coalesce(o.started_at, j.started_at) AS started_at,
       o.finished_at,
       o.failure_code,
       o.failure_record_index,
       j.lease_owner_id,
       j.lease_claim_id,
       j.lease_expires_at,
       i.replaces_job_id,
       coalesce(j.cancel_code IS NOT NULL, false) AS cancel_requested,
       o.rows_inserted,
       o.rows_updated,
       o.rows_unchanged,
       o.data_checksum,
       i.queue,
       i.priority
  FROM etl_job_intake i
  LEFT JOIN etl_job_records j ON j.id = i.id
  LEFT JOIN etl_job_outcomes o ON o.job_id = i.id;

COMMENT ON VIEW etl_jobs IS
    'durable-etl: one row per job ever accepted (no payload, no idempotency key); query this, not the tables';
