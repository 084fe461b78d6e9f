-- 0026: the one-column checks of the tables every job passes through are domains, checked where
-- a value is written, instead of CHECK constraints re-read by every statement.
--
-- PostgreSQL 15 keeps a table's CHECK constraints as text and, in every statement that inserts
-- or updates a row of the table, parses each one back into an expression (`stringToNode`),
-- plans it and prepares it, whatever columns the statement writes: on the live table 15 KB of
-- them for every enqueue, claim, heartbeat and release, 8 KB on the intake for every enqueue,
-- 11 KB on the outcomes for every completion. That work was a fifth of a single-job enqueue's
-- backend CPU (`perf`, docs/benchmarks.md, #26). A domain's checks are parsed and planned once
-- per session (the type cache) and run only on a value written to a column of the domain: a
-- claim that sets the lease no longer re-checks the job's kind, queue, owner and attempt bound
-- (it still re-reads the live table's remaining CHECKs, about a third of what it read).
--
-- Each domain admits exactly what its CHECK did (the test
-- `schema::the_name_checks_admit_exactly_what_their_patterns_did` compares them with the
-- patterns they replace, for every column):
-- - `durable_etl_name`: a kind or a queue, `[a-z][a-z0-9_.]{0,62}` (0019's form, no regex);
-- - `durable_etl_identifier`: a failure code or a dataset, `[a-z][a-z0-9_]{0,62}`;
-- - `durable_etl_digest`: a SHA-256 digest (owner, idempotency key, fingerprint, checksum);
-- - `durable_etl_priority`: 0..9; `durable_etl_max_attempts`: 1..100;
-- - `durable_etl_owner_id`: a replica's owner id, 1..128 characters;
-- - `durable_etl_concurrency_key`: 1..255 bytes.
-- Checks over several columns (a running job has a lease, attempts within the bound, an outcome's
-- ledger only if it succeeded), the short status and cancel-code lists and the small counters
-- (fencing token, heartbeat, an outcome's attempts and row counts) stay CHECK constraints.
--
-- A column changes to a domain over its own type without a rewrite only while the domain has
-- no constraint, so the domains are created bare, the columns moved onto them, and each check
-- added afterwards `NOT VALID`: every stored value met the same CHECK, so nothing is scanned,
-- and the check holds for every value written from this commit on. The `etl_jobs` view reads
-- these columns and is dropped and recreated unchanged around the moves.
--
-- Readers: release 23 and later. Their workers and API write these columns from typed
-- parameters or arrays (`query_typed`, `$1::text[]`, `unnest`), which PostgreSQL coerces to
-- the domain, and their prepared claims return base types (a `UNION ALL` with `NULL::text`
-- rows), so a session prepared before this migration keeps working. Release 22's prepared claim
-- returns the live row's kind, attempt bound and owner directly: their types change, and a
-- prepared statement whose result types change fails (`0A000`) until its session closes, so
-- 22 is not a reader. A statement that binds one of these columns from an untyped parameter
-- (`INSERT … VALUES ($1)`, PostgreSQL infers the domain) fails in drivers that check types, as
-- tokio-postgres does: cast it (`$1::text`). (The `bench` command of releases 22 to 25 does.)
-- ALTER COLUMN … TYPE drops the moved columns' statistics: run ANALYZE on the five tables
-- afterwards, or let autovacuum's analyze do it. Dropping the view drops any GRANT on it.
-- Locks: ACCESS EXCLUSIVE on etl_job_intake, etl_job_records, etl_job_outcomes,
-- etl_target_rows and etl_waiting_replicas until the commit: every read and write of them waits
-- (enqueues, claims, completions, heartbeats, status reads). No table is rewritten and the
-- history's indexes are kept (their operator classes are unchanged); the live table's three
-- partial indexes over moved columns are rebuilt, a scan of the live rows (the backlog, not the
-- history).

DROP VIEW etl_jobs;

CREATE DOMAIN durable_etl_name AS text;
CREATE DOMAIN durable_etl_identifier AS text;
CREATE DOMAIN durable_etl_digest AS bytea;
CREATE DOMAIN durable_etl_priority AS smallint;
CREATE DOMAIN durable_etl_max_attempts AS integer;
CREATE DOMAIN durable_etl_owner_id AS text;
CREATE DOMAIN durable_etl_concurrency_key AS text;

ALTER TABLE etl_job_intake
    DROP CONSTRAINT etl_job_intake_owner_key_check,
    DROP CONSTRAINT etl_job_intake_idempotency_key_digest_check,
    DROP CONSTRAINT etl_job_intake_request_fingerprint_check,
    DROP CONSTRAINT etl_job_intake_kind_check,
    DROP CONSTRAINT etl_job_intake_max_attempts_check,
    DROP CONSTRAINT etl_job_intake_queue_check,
    DROP CONSTRAINT etl_job_intake_priority_check,
    ALTER COLUMN owner_key TYPE durable_etl_digest,
    ALTER COLUMN idempotency_key_digest TYPE durable_etl_digest,
    ALTER COLUMN request_fingerprint TYPE durable_etl_digest,
    ALTER COLUMN kind TYPE durable_etl_name,
    ALTER COLUMN max_attempts TYPE durable_etl_max_attempts,
    ALTER COLUMN queue TYPE durable_etl_name,
    ALTER COLUMN priority TYPE durable_etl_priority;

ALTER TABLE etl_job_records
    DROP CONSTRAINT etl_job_records_owner_key_check,
    DROP CONSTRAINT etl_job_records_kind_check,
    DROP CONSTRAINT etl_job_records_max_attempts_check,
    DROP CONSTRAINT etl_job_records_lease_owner_id_check,
    DROP CONSTRAINT etl_job_records_queue_check,
    DROP CONSTRAINT etl_job_records_priority_check,
    DROP CONSTRAINT etl_job_records_concurrency_key_check,
    ALTER COLUMN owner_key TYPE durable_etl_digest,
    ALTER COLUMN kind TYPE durable_etl_name,
    ALTER COLUMN max_attempts TYPE durable_etl_max_attempts,
    ALTER COLUMN lease_owner_id TYPE durable_etl_owner_id,
    ALTER COLUMN queue TYPE durable_etl_name,
    ALTER COLUMN priority TYPE durable_etl_priority,
    ALTER COLUMN concurrency_key TYPE durable_etl_concurrency_key;

ALTER TABLE etl_job_outcomes
    DROP CONSTRAINT etl_job_outcomes_owner_key_check,
    DROP CONSTRAINT etl_job_outcomes_failure_code_check,
    DROP CONSTRAINT etl_job_outcomes_data_checksum_check,
    ALTER COLUMN owner_key TYPE durable_etl_digest,
    ALTER COLUMN failure_code TYPE durable_etl_identifier,
    ALTER COLUMN data_checksum TYPE durable_etl_digest;

ALTER TABLE etl_target_rows
    DROP CONSTRAINT etl_target_rows_owner_key_check,
    DROP CONSTRAINT etl_target_rows_dataset_check,
    ALTER COLUMN owner_key TYPE durable_etl_digest,
    ALTER COLUMN dataset TYPE durable_etl_identifier;

ALTER TABLE etl_waiting_replicas
    DROP CONSTRAINT etl_waiting_replicas_owner_id_check,
    ALTER COLUMN owner_id TYPE durable_etl_owner_id;

ALTER DOMAIN durable_etl_name ADD CONSTRAINT durable_etl_name_check
    CHECK (octet_length(VALUE) <= 63 AND ascii(VALUE) BETWEEN 97 AND 122
           AND ltrim(VALUE, 'abcdefghijklmnopqrstuvwxyz0123456789_.') = '') NOT VALID;
ALTER DOMAIN durable_etl_identifier ADD CONSTRAINT durable_etl_identifier_check
    CHECK (octet_length(VALUE) <= 63 AND ascii(VALUE) BETWEEN 97 AND 122
           AND ltrim(VALUE, 'abcdefghijklmnopqrstuvwxyz0123456789_') = '') NOT VALID;
ALTER DOMAIN durable_etl_digest ADD CONSTRAINT durable_etl_digest_check
    CHECK (octet_length(VALUE) = 32) NOT VALID;
ALTER DOMAIN durable_etl_priority ADD CONSTRAINT durable_etl_priority_check
    CHECK (VALUE BETWEEN 0 AND 9) NOT VALID;
ALTER DOMAIN durable_etl_max_attempts ADD CONSTRAINT durable_etl_max_attempts_check
    CHECK (VALUE BETWEEN 1 AND 100) NOT VALID;
ALTER DOMAIN durable_etl_owner_id ADD CONSTRAINT durable_etl_owner_id_check
    CHECK (char_length(VALUE) BETWEEN 1 AND 128) NOT VALID;
ALTER DOMAIN durable_etl_concurrency_key ADD CONSTRAINT durable_etl_concurrency_key_check
    CHECK (octet_length(VALUE) BETWEEN 1 AND 255) NOT VALID;

-- The view as 0020 left it, over the moved columns.
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
