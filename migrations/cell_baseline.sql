-- Every migration's schema at once, for a new cell: generated from a cell the migrations
-- built, by the cells test (DURABLE_ETL_UPDATE_BASELINE=1 writes it anew). Do not edit.
-- Its statements run one at a time, split at each `-- ;` line.
SET LOCAL check_function_bodies = false;
-- ;
CREATE DOMAIN durable_etl_concurrency_key AS text;
-- ;
CREATE DOMAIN durable_etl_digest AS bytea;
-- ;
CREATE DOMAIN durable_etl_identifier AS text;
-- ;
CREATE DOMAIN durable_etl_max_attempts AS integer;
-- ;
CREATE DOMAIN durable_etl_name AS text;
-- ;
CREATE DOMAIN durable_etl_owner_id AS text;
-- ;
CREATE DOMAIN durable_etl_priority AS smallint;
-- ;
CREATE FUNCTION durable_etl_channel() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$SELECT 'durable_etl_jobs.durable_etl_cell_template'::text$$;
-- ;
CREATE FUNCTION durable_etl_enqueue_unkeyed(uuid[], bytea[], bytea[], jsonb[], integer[], timestamp with time zone[], bytea, text, uuid[], text[], smallint[], text[]) RETURNS void
    LANGUAGE plpgsql
    AS $_$
BEGIN
    WITH batch AS (
        SELECT b.*, greatest(b.run_at_asked, now()) AS run_at
          FROM unnest($1, $2, $3, $4, $5, $6, $9, $10, $11, $12)
               AS b(id, key_digest, fingerprint, payload, max_attempts, run_at_asked, replaces,
                    queue, priority, concurrency_key)
    ), accepted AS (
        INSERT INTO etl_job_intake
               (id, owner_key, idempotency_key_digest, request_fingerprint, kind, max_attempts,
                run_at, replaces_job_id, queue, priority)
        SELECT id, $7, key_digest, fingerprint, $8, max_attempts, run_at, replaces, queue,
               priority
          FROM batch
    )
    INSERT INTO etl_job_records
           (id, owner_key, kind, request_payload, max_attempts, run_at, queue, priority, sort_at,
            concurrency_key)
    SELECT id, $7, $8, payload, max_attempts, run_at, queue, priority,
           durable_etl_sort_at(run_at, priority), concurrency_key
      FROM batch;
END;
$_$;
-- ;
COMMENT ON FUNCTION durable_etl_enqueue_unkeyed(uuid[], bytea[], bytea[], jsonb[], integer[], timestamp with time zone[], bytea, text, uuid[], text[], smallint[], text[]) IS 'durable-etl: inserts a chunk of jobs without idempotency keys (src/enqueue.rs), plan kept per session';
-- ;
CREATE FUNCTION durable_etl_lock_space() RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$SELECT hashtext('durable_etl.durable_etl_cell_template')$$;
-- ;
CREATE FUNCTION durable_etl_notify_enqueue() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    due record;
BEGIN
    IF current_setting('durable_etl.notify', true) IS NOT DISTINCT FROM 'off' THEN
        RETURN NULL;
    END IF;
    FOR due IN
        SELECT i.queue, i.kind, count(*) AS jobs
          FROM inserted_jobs i
         WHERE i.status = 'pending' AND i.run_at <= now()
         GROUP BY i.queue, i.kind
    LOOP
        PERFORM durable_etl_wake(due.queue, due.kind, due.jobs);
    END LOOP;
    RETURN NULL;
END;
$$;
-- ;
CREATE FUNCTION durable_etl_notify_given_back() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF current_setting('durable_etl.freer_claims', true) = 'on' THEN
        RETURN NULL;
    END IF;
    PERFORM durable_etl_wake(NEW.queue, NULL, 1);
    RETURN NULL;
END;
$$;
-- ;
CREATE FUNCTION durable_etl_notify_key_permits() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM durable_etl_wake_for_freed(OLD.queue);
    RETURN NULL;
END;
$$;
-- ;
CREATE FUNCTION durable_etl_notify_permits() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM durable_etl_wake_for_freed(NEW.queue);
    RETURN NULL;
END;
$$;
-- ;
CREATE FUNCTION durable_etl_owner_alive_key(owner_id text) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
    SELECT durable_etl_owner_lock_key(owner_id) # 1
$$;
-- ;
CREATE FUNCTION durable_etl_owner_lock_key(owner_id text) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
                   SELECT ('x' || substr(encode(sha256(convert_to('durable_etl_cell_template/' || owner_id, 'UTF8')),
                                                'hex'), 1, 16))::bit(64)::bigint
               $$;
-- ;
CREATE FUNCTION durable_etl_refuse_moved_owners() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM etl_moved_owners)
       AND EXISTS (SELECT 1 FROM etl_moved_owners m JOIN new_rows a USING (owner_key)) THEN
        RAISE EXCEPTION 'the owner has moved to another cell' USING ERRCODE = '55M02';
    END IF;
    RETURN NULL;
END;
$$;
-- ;
CREATE FUNCTION durable_etl_sort_at(run_at timestamp with time zone, priority smallint) RETURNS timestamp with time zone
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN (run_at + ((priority)::double precision * '00:00:10'::interval));
-- ;
CREATE FUNCTION durable_etl_wake(wake_queue text, wake_kind text, jobs bigint) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_notify(durable_etl_channel(), 'q ' || wake_queue);
        RETURN;
    END IF;
    FOR read IN 1..2 LOOP
        PERFORM pg_notify(durable_etl_channel(),
                          CASE WHEN wake_kind IS NULL THEN 'q ' || wake_queue
                               ELSE 't ' || w.wake_token || ' ' || wake_queue || ' ' || wake_kind
                          END)
           FROM (SELECT w.wake_token
                   FROM etl_waiting_replicas w
                  WHERE wake_queue = ANY (w.queues)
                    AND (wake_kind IS NULL
                         OR (wake_kind = ANY (w.kinds) AND w.wake_token IS NOT NULL))
                    AND NOT EXISTS (
                        SELECT 1 FROM etl_queues q
                         WHERE q.queue = wake_queue
                           AND (q.paused
                                OR (q.cap IS NOT NULL
                                    AND NOT EXISTS (
                                        SELECT 1 FROM etl_queue_permits p
                                         WHERE p.queue = wake_queue AND p.claim_id IS NULL
                                           AND p.slot <= q.cap))))
                  ORDER BY random()
                  LIMIT CASE WHEN wake_kind IS NULL THEN 1 ELSE jobs END) w;
        EXIT WHEN FOUND OR read = 2;
        PERFORM pg_advisory_xact_lock_shared(durable_etl_lock_space(), hashtext(wake_queue));
    END LOOP;
END;
$$;
-- ;
CREATE FUNCTION durable_etl_wake_for_freed(freed_queue text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF current_setting('durable_etl.freer_claims', true) = 'on' THEN
        RETURN;
    END IF;
    PERFORM durable_etl_wake(freed_queue, NULL, 1);
END;
$$;
-- ;
CREATE TABLE etl_api_clients (
    id uuid NOT NULL,
    owner_key bytea NOT NULL,
    key_digest bytea NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    revoked_at timestamp with time zone,
    operator boolean DEFAULT false NOT NULL,
    CONSTRAINT etl_api_clients_key_digest_check CHECK ((octet_length(key_digest) = 32)),
    CONSTRAINT etl_api_clients_owner_key_check CHECK ((octet_length(owner_key) = 32))
);
-- ;
CREATE TABLE etl_audit_log (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    key_id uuid NOT NULL,
    action durable_etl_identifier NOT NULL,
    target text NOT NULL,
    affected bigint NOT NULL,
    source text DEFAULT 'console'::text NOT NULL,
    CONSTRAINT etl_audit_log_affected_check CHECK ((affected >= 0)),
    CONSTRAINT etl_audit_log_target_check CHECK (((char_length(target) >= 1) AND (char_length(target) <= 512)))
);
-- ;
COMMENT ON TABLE etl_audit_log IS 'durable-etl: operator actions from the console or the API (key id, source, action, target, count, time); no owner, no payload';
-- ;
-- ;
CREATE UNLOGGED TABLE etl_backlog_minutes (
    minute timestamp with time zone NOT NULL,
    due bigint NOT NULL,
    deferred bigint NOT NULL,
    running bigint NOT NULL,
    by_queue jsonb NOT NULL,
    CONSTRAINT etl_backlog_minutes_deferred_check CHECK ((deferred >= 0)),
    CONSTRAINT etl_backlog_minutes_due_check CHECK ((due >= 0)),
    CONSTRAINT etl_backlog_minutes_running_check CHECK ((running >= 0))
);
-- ;
COMMENT ON TABLE etl_backlog_minutes IS 'durable-etl: the active jobs by state once a minute (two hours kept), for the operator view';
-- ;
CREATE TABLE etl_console_ended_sessions (
    session_id uuid NOT NULL,
    expires_at timestamp with time zone NOT NULL
);
-- ;
COMMENT ON TABLE etl_console_ended_sessions IS 'durable-etl: console sessions signed out before their expiry (purged past it)';
-- ;
CREATE TABLE etl_dead_letters (
    job_id uuid NOT NULL,
    owner_key durable_etl_digest NOT NULL,
    queue durable_etl_name NOT NULL,
    kind durable_etl_name NOT NULL,
    code durable_etl_identifier NOT NULL,
    attempts integer NOT NULL,
    failed_at timestamp with time zone NOT NULL,
    replayed_job_id uuid,
    replayed_at timestamp with time zone,
    replayed_by text,
    CONSTRAINT etl_dead_letters_attempts_check CHECK ((attempts >= 0)),
    CONSTRAINT etl_dead_letters_replay_complete CHECK ((((replayed_job_id IS NULL) = (replayed_at IS NULL)) AND ((replayed_at IS NULL) = (replayed_by IS NULL)))),
    CONSTRAINT etl_dead_letters_replayed_by_check CHECK (((char_length(replayed_by) >= 1) AND (char_length(replayed_by) <= 128)))
);
-- ;
COMMENT ON TABLE etl_dead_letters IS 'durable-etl: jobs that ended failed, until replayed or discarded; no payload, no error text';
-- ;
CREATE TABLE etl_job_attempts (
    job_id uuid NOT NULL,
    attempt integer NOT NULL,
    started_at timestamp with time zone NOT NULL,
    ended_at timestamp with time zone DEFAULT now() NOT NULL,
    ending text NOT NULL,
    due_at timestamp with time zone NOT NULL,
    owner_id text,
    diagnosis jsonb,
    CONSTRAINT etl_job_attempts_attempt_check CHECK ((attempt >= 0)),
    CONSTRAINT etl_job_attempts_ending_check CHECK ((ending = ANY (ARRAY['retried'::text, 'recovered'::text, 'released'::text])))
);
-- ;
COMMENT ON TABLE etl_job_attempts IS 'durable-etl: attempts that did not end their job (retried, recovered, released); no payload, no error text';
-- ;
COMMENT ON COLUMN etl_job_attempts.owner_id IS 'durable-etl: for a recovered attempt, the replica it was taken from (its owner id, never a principal); null otherwise';
-- ;
COMMENT ON COLUMN etl_job_attempts.diagnosis IS 'durable-etl: the attempt''s diagnosis (phase, retry decision, duration, error type names, declared detail; never a message); null for an attempt its replica gave back';
-- ;
CREATE TABLE etl_job_cancel_deferred (
    job_id uuid NOT NULL,
    code text NOT NULL,
    requested_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT etl_job_cancel_deferred_code_check CHECK ((code = ANY (ARRAY['cancelled'::text, 'replaced'::text])))
);
-- ;
COMMENT ON TABLE etl_job_cancel_deferred IS 'durable-etl: owners'' cancel requests recorded while a commit held the job''s row, applied to it once the commit lets go';
-- ;
CREATE TABLE etl_job_intake (
    id uuid NOT NULL,
    owner_key durable_etl_digest NOT NULL,
    idempotency_key_digest durable_etl_digest NOT NULL,
    request_fingerprint durable_etl_digest NOT NULL,
    kind durable_etl_name NOT NULL,
    max_attempts durable_etl_max_attempts NOT NULL,
    run_at timestamp with time zone NOT NULL,
    replaces_job_id uuid,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    queue durable_etl_name DEFAULT 'default'::text NOT NULL,
    priority durable_etl_priority DEFAULT 0 NOT NULL
);
-- ;
COMMENT ON TABLE etl_job_intake IS 'durable-etl: every accepted job, written once; principals and idempotency keys only as keyed digests';
-- ;
CREATE TABLE etl_job_outcomes (
    job_id uuid NOT NULL,
    owner_key durable_etl_digest NOT NULL,
    status text NOT NULL,
    attempts integer NOT NULL,
    run_at timestamp with time zone NOT NULL,
    lease_claim_id uuid,
    failure_code durable_etl_identifier,
    failure_record_index integer,
    rows_inserted integer,
    rows_updated integer,
    rows_unchanged integer,
    data_checksum durable_etl_digest,
    started_at timestamp with time zone,
    finished_at timestamp with time zone DEFAULT now() NOT NULL,
    output jsonb,
    diagnosis jsonb,
    CONSTRAINT etl_job_outcomes_attempts_check CHECK ((attempts >= 0)),
    CONSTRAINT etl_job_outcomes_failure_code_matches_status CHECK (
CASE status
    WHEN 'failed'::text THEN (failure_code IS NOT NULL)
    WHEN 'cancelled'::text THEN ((failure_code)::text = ANY (ARRAY['cancelled'::text, 'replaced'::text]))
    ELSE (failure_code IS NULL)
END),
    CONSTRAINT etl_job_outcomes_failure_record_index_check CHECK ((failure_record_index >= 0)),
    CONSTRAINT etl_job_outcomes_rows_inserted_check CHECK ((rows_inserted >= 0)),
    CONSTRAINT etl_job_outcomes_rows_unchanged_check CHECK ((rows_unchanged >= 0)),
    CONSTRAINT etl_job_outcomes_rows_updated_check CHECK ((rows_updated >= 0)),
    CONSTRAINT etl_job_outcomes_status_check CHECK ((status = ANY (ARRAY['succeeded'::text, 'failed'::text, 'cancelled'::text])))
)
WITH (autovacuum_analyze_scale_factor='0.02', autovacuum_analyze_threshold='500');
-- ;
COMMENT ON TABLE etl_job_outcomes IS 'durable-etl: how each ended job ended, with the response ledger of succeeded ones; append only';
-- ;
COMMENT ON COLUMN etl_job_outcomes.diagnosis IS 'durable-etl: the failed job''s last attempt''s diagnosis (never a message); null for a success or a cancellation';
-- ;
CREATE TABLE etl_job_records (
    id uuid NOT NULL,
    owner_key durable_etl_digest NOT NULL,
    kind durable_etl_name NOT NULL,
    request_payload jsonb NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    max_attempts durable_etl_max_attempts DEFAULT 5 NOT NULL,
    run_at timestamp with time zone DEFAULT now() NOT NULL,
    lease_owner_id durable_etl_owner_id,
    lease_claim_id uuid,
    lease_expires_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    lease_owner_locked boolean DEFAULT false NOT NULL,
    fencing_token bigint DEFAULT 0 NOT NULL,
    lease_renewed_at timestamp with time zone,
    cancel_code text,
    lease_heartbeat_ms integer,
    lease_owner_alive_locked boolean DEFAULT false NOT NULL,
    queue durable_etl_name DEFAULT 'default'::text NOT NULL,
    priority durable_etl_priority DEFAULT 0 NOT NULL,
    sort_at timestamp with time zone DEFAULT now() NOT NULL,
    permit_slot integer,
    concurrency_key durable_etl_concurrency_key,
    CONSTRAINT etl_job_records_attempts_bounded CHECK (((attempts >= 0) AND (attempts <= (max_attempts)::integer))),
    CONSTRAINT etl_job_records_cancel_code_check CHECK ((cancel_code = ANY (ARRAY['cancelled'::text, 'replaced'::text]))),
    CONSTRAINT etl_job_records_fencing_token_check CHECK ((fencing_token >= 0)),
    CONSTRAINT etl_job_records_lease_heartbeat_ms_check CHECK ((lease_heartbeat_ms > 0)),
    CONSTRAINT etl_job_records_running_has_lease CHECK (((status = 'running'::text) = ((lease_owner_id IS NOT NULL) AND (lease_claim_id IS NOT NULL) AND (lease_expires_at IS NOT NULL)))),
    CONSTRAINT etl_job_records_running_has_renewal CHECK (((status <> 'running'::text) OR (lease_renewed_at IS NOT NULL))),
    CONSTRAINT etl_job_records_sort_at_check CHECK ((sort_at >= run_at)),
    CONSTRAINT etl_job_records_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'running'::text])))
)
WITH (autovacuum_vacuum_scale_factor='0.02', autovacuum_vacuum_threshold='500', autovacuum_analyze_scale_factor='0.02', autovacuum_analyze_threshold='500', autovacuum_vacuum_cost_delay='0', fillfactor='80', vacuum_truncate='false');
-- ;
COMMENT ON TABLE etl_job_records IS 'durable-etl: live (pending and running) jobs with their payload and lease; ended jobs are in etl_job_outcomes';
-- ;
CREATE VIEW etl_jobs AS
 SELECT i.id,
    i.owner_key,
    i.kind,
    COALESCE(o.status, j.status) AS status,
    COALESCE(o.attempts, j.attempts) AS attempts,
    i.max_attempts,
    COALESCE(o.run_at, j.run_at) AS run_at,
    i.created_at,
    COALESCE(o.finished_at, j.updated_at) AS updated_at,
    COALESCE(o.started_at, j.started_at) AS started_at,
    o.finished_at,
    o.failure_code,
    o.failure_record_index,
    j.lease_owner_id,
    j.lease_claim_id,
    j.lease_expires_at,
    i.replaces_job_id,
    COALESCE((j.cancel_code IS NOT NULL), false) AS cancel_requested,
    o.rows_inserted,
    o.rows_updated,
    o.rows_unchanged,
    o.data_checksum,
    i.queue,
    i.priority,
    COALESCE(o.output,
        CASE
            WHEN (o.rows_inserted IS NOT NULL) THEN jsonb_build_object('rows_inserted', o.rows_inserted, 'rows_updated', o.rows_updated, 'rows_unchanged', o.rows_unchanged, 'checksum', encode((o.data_checksum)::bytea, 'hex'::text))
            ELSE NULL::jsonb
        END) AS output
   FROM ((etl_job_intake i
     LEFT JOIN etl_job_records j ON ((j.id = i.id)))
     LEFT JOIN etl_job_outcomes o ON ((o.job_id = i.id)));
-- ;
COMMENT ON VIEW etl_jobs IS 'durable-etl: one row per job ever accepted (no payload, no idempotency key); query this, not the tables';
-- ;
CREATE TABLE etl_key_permits (
    claim_id uuid NOT NULL,
    queue text NOT NULL,
    concurrency_key text NOT NULL,
    slot integer NOT NULL,
    CONSTRAINT etl_key_permits_slot_check CHECK ((slot >= 1))
);
-- ;
COMMENT ON TABLE etl_key_permits IS 'durable-etl: one row per running job of a key-capped queue, held by its claim';
-- ;
CREATE TABLE etl_moved_owners (
    owner_key durable_etl_digest NOT NULL,
    moved_to text NOT NULL,
    fenced_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT etl_moved_owners_moved_to_check CHECK (((char_length(moved_to) >= 1) AND (char_length(moved_to) <= 63)))
);
-- ;
COMMENT ON TABLE etl_moved_owners IS 'durable-etl: owners this cell holds no longer (moved, or moving, to another cell): their enqueues are refused here';
-- ;
CREATE TABLE etl_moving_rows (
    owner_key durable_etl_digest NOT NULL,
    relation text NOT NULL,
    row_data jsonb NOT NULL,
    CONSTRAINT etl_moving_rows_relation_check CHECK ((relation = ANY (ARRAY['etl_job_records'::text, 'etl_schedules'::text])))
);
-- ;
COMMENT ON TABLE etl_moving_rows IS 'durable-etl: pending jobs and schedules of an owner moving to another cell, out of their tables until the new cell has them';
-- ;
CREATE TABLE etl_owner_arrivals (
    move_id uuid NOT NULL,
    owner_key durable_etl_digest NOT NULL,
    arrived_at timestamp with time zone DEFAULT now() NOT NULL
);
-- ;
COMMENT ON TABLE etl_owner_arrivals IS 'durable-etl: each move that brought an owner here, written in the transaction that brought its rows, so that no move brings them twice';
-- ;
CREATE UNLOGGED TABLE etl_owner_beats (
    owner_id durable_etl_owner_id NOT NULL,
    beat_at timestamp with time zone NOT NULL,
    silence_ms integer NOT NULL,
    CONSTRAINT etl_owner_beats_silence_ms_check CHECK ((silence_ms > 0))
);
-- ;
COMMENT ON TABLE etl_owner_beats IS 'durable-etl: when each replica with a session last beat, and after how much silence recovery may judge it dead';
-- ;
CREATE TABLE etl_queue_permits (
    queue text NOT NULL,
    slot integer NOT NULL,
    claim_id uuid,
    CONSTRAINT etl_queue_permits_slot_check CHECK ((slot >= 1))
);
-- ;
COMMENT ON TABLE etl_queue_permits IS 'durable-etl: one row per running slot of a capped queue, held by at most one claim';
-- ;
CREATE TABLE etl_queues (
    queue text NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    cap integer,
    key_cap integer,
    CONSTRAINT etl_queues_cap_check CHECK (((cap >= 1) AND (cap <= 10000))),
    CONSTRAINT etl_queues_key_cap_check CHECK (((key_cap >= 1) AND (key_cap <= 10000))),
    CONSTRAINT etl_queues_queue_check CHECK (((octet_length(queue) <= 63) AND ((ascii(queue) >= 97) AND (ascii(queue) <= 122)) AND (ltrim(queue, 'abcdefghijklmnopqrstuvwxyz0123456789_.'::text) = ''::text)))
);
-- ;
COMMENT ON TABLE etl_queues IS 'durable-etl: what operators set per queue; a queue without a row is served as it comes';
-- ;
CREATE UNLOGGED TABLE etl_replica_minutes (
    minute timestamp with time zone NOT NULL,
    owner_id text NOT NULL,
    started_at timestamp with time zone NOT NULL,
    succeeded bigint NOT NULL,
    failed bigint NOT NULL,
    failed_by_code jsonb NOT NULL,
    recovered bigint NOT NULL,
    pickups bigint NOT NULL,
    pickup_seconds double precision NOT NULL,
    incarnation uuid NOT NULL,
    by_queue jsonb,
    pickup_buckets bigint[],
    CONSTRAINT etl_replica_minutes_failed_check CHECK ((failed >= 0)),
    CONSTRAINT etl_replica_minutes_pickup_seconds_check CHECK ((pickup_seconds >= (0)::double precision)),
    CONSTRAINT etl_replica_minutes_pickups_check CHECK ((pickups >= 0)),
    CONSTRAINT etl_replica_minutes_recovered_check CHECK ((recovered >= 0)),
    CONSTRAINT etl_replica_minutes_succeeded_check CHECK ((succeeded >= 0))
);
-- ;
COMMENT ON TABLE etl_replica_minutes IS 'durable-etl: each replica''s counters at the end of each minute (two hours kept), for the operator view';
-- ;
CREATE UNLOGGED TABLE etl_replicas (
    owner_id text NOT NULL,
    started_at timestamp with time zone NOT NULL,
    reported_at timestamp with time zone NOT NULL,
    held integer NOT NULL,
    claimed bigint NOT NULL,
    claim_rate double precision NOT NULL,
    incarnation uuid,
    kinds text[],
    queues text[],
    CONSTRAINT etl_replicas_claim_rate_check CHECK ((claim_rate >= (0)::double precision)),
    CONSTRAINT etl_replicas_claimed_check CHECK ((claimed >= 0)),
    CONSTRAINT etl_replicas_held_check CHECK ((held >= 0)),
    CONSTRAINT etl_replicas_owner_id_check CHECK (((length(owner_id) >= 1) AND (length(owner_id) <= 128)))
);
-- ;
COMMENT ON TABLE etl_replicas IS 'durable-etl: each replica''s last report (held jobs, claim rate), for the operator view';
-- ;
CREATE TABLE etl_retained_payloads (
    job_id uuid NOT NULL,
    key_id text NOT NULL,
    sealed bytea NOT NULL,
    ttl_s integer NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT etl_retained_payloads_key_id_check CHECK (((char_length(key_id) >= 1) AND (char_length(key_id) <= 64))),
    CONSTRAINT etl_retained_payloads_sealed_check CHECK ((octet_length(sealed) > 40)),
    CONSTRAINT etl_retained_payloads_ttl_s_check CHECK (((ttl_s >= 1) AND (ttl_s <= 31536000)))
);
-- ;
COMMENT ON TABLE etl_retained_payloads IS 'durable-etl: sealed (AEAD) payloads kept to replay dead letters; never plaintext';
-- ;
CREATE TABLE etl_schedule_fires (
    owner_key durable_etl_digest NOT NULL,
    name durable_etl_name NOT NULL,
    fire_at timestamp with time zone NOT NULL,
    job_id uuid,
    outcome text NOT NULL,
    fired_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT etl_schedule_fires_check CHECK (((outcome = 'enqueued'::text) = (job_id IS NOT NULL))),
    CONSTRAINT etl_schedule_fires_outcome_check CHECK ((outcome = ANY (ARRAY['enqueued'::text, 'missed'::text, 'overlapped'::text])))
);
-- ;
COMMENT ON TABLE etl_schedule_fires IS 'durable-etl: every fire of every schedule, with its job or why it made none';
-- ;
CREATE TABLE etl_schedules (
    owner_key durable_etl_digest NOT NULL,
    name durable_etl_name NOT NULL,
    cron text NOT NULL,
    time_zone text NOT NULL,
    kind durable_etl_name NOT NULL,
    args jsonb NOT NULL,
    queue durable_etl_name NOT NULL,
    priority durable_etl_priority NOT NULL,
    max_attempts durable_etl_max_attempts NOT NULL,
    missed text NOT NULL,
    catch_up_limit integer NOT NULL,
    overlap text NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    declared boolean NOT NULL,
    next_fire_at timestamp with time zone NOT NULL,
    last_fire_at timestamp with time zone,
    last_job_id uuid,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT etl_schedules_catch_up_limit_check CHECK (((catch_up_limit >= 0) AND (catch_up_limit <= 1000))),
    CONSTRAINT etl_schedules_check CHECK (((missed = 'catch_up'::text) = (catch_up_limit > 0))),
    CONSTRAINT etl_schedules_cron_check CHECK (((char_length(cron) >= 1) AND (char_length(cron) <= 255))),
    CONSTRAINT etl_schedules_missed_check CHECK ((missed = ANY (ARRAY['coalesce'::text, 'catch_up'::text, 'skip'::text]))),
    CONSTRAINT etl_schedules_overlap_check CHECK ((overlap = ANY (ARRAY['allow'::text, 'skip'::text]))),
    CONSTRAINT etl_schedules_time_zone_check CHECK (((char_length(time_zone) >= 1) AND (char_length(time_zone) <= 64)))
);
-- ;
COMMENT ON TABLE etl_schedules IS 'durable-etl: recurring schedules; fired by every replica, each fire once';
-- ;
CREATE TABLE etl_target_rows (
    owner_key durable_etl_digest NOT NULL,
    dataset durable_etl_identifier NOT NULL,
    record_key text NOT NULL,
    record jsonb NOT NULL,
    written_by_job uuid,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
)
WITH (fillfactor='85');
-- ;
CREATE UNLOGGED TABLE etl_waiting_replicas (
    owner_id durable_etl_owner_id NOT NULL,
    refreshed_at timestamp with time zone DEFAULT now() NOT NULL,
    queues text[],
    wake_token bigint,
    kinds text[]
);
-- ;
COMMENT ON TABLE etl_waiting_replicas IS 'durable-etl: one row per replica that waited for work since it started, written by that replica only; a row whose queues and kinds are empty is parked (busy) and waits for nothing';
-- ;
COMMENT ON COLUMN etl_waiting_replicas.wake_token IS 'durable-etl: the payload of the NOTIFY that wakes this replica alone (NULL: a release before 0024)';
-- ;
COMMENT ON COLUMN etl_waiting_replicas.kinds IS 'durable-etl: the kinds the replica runs (NULL: any)';
-- ;
ALTER DOMAIN durable_etl_concurrency_key
    ADD CONSTRAINT durable_etl_concurrency_key_check CHECK (((octet_length(VALUE) >= 1) AND (octet_length(VALUE) <= 255))) NOT VALID;
-- ;
ALTER DOMAIN durable_etl_digest
    ADD CONSTRAINT durable_etl_digest_check CHECK ((octet_length(VALUE) = 32)) NOT VALID;
-- ;
ALTER DOMAIN durable_etl_identifier
    ADD CONSTRAINT durable_etl_identifier_check CHECK (((octet_length(VALUE) <= 63) AND ((ascii(VALUE) >= 97) AND (ascii(VALUE) <= 122)) AND (ltrim(VALUE, 'abcdefghijklmnopqrstuvwxyz0123456789_'::text) = ''::text))) NOT VALID;
-- ;
ALTER DOMAIN durable_etl_max_attempts
    ADD CONSTRAINT durable_etl_max_attempts_check CHECK (((VALUE >= 1) AND (VALUE <= 100))) NOT VALID;
-- ;
ALTER DOMAIN durable_etl_name
    ADD CONSTRAINT durable_etl_name_check CHECK (((octet_length(VALUE) <= 63) AND ((ascii(VALUE) >= 97) AND (ascii(VALUE) <= 122)) AND (ltrim(VALUE, 'abcdefghijklmnopqrstuvwxyz0123456789_.'::text) = ''::text))) NOT VALID;
-- ;
ALTER DOMAIN durable_etl_owner_id
    ADD CONSTRAINT durable_etl_owner_id_check CHECK (((char_length(VALUE) >= 1) AND (char_length(VALUE) <= 128))) NOT VALID;
-- ;
ALTER DOMAIN durable_etl_priority
    ADD CONSTRAINT durable_etl_priority_check CHECK (((VALUE >= 0) AND (VALUE <= 9))) NOT VALID;
-- ;
ALTER TABLE ONLY etl_api_clients
    ADD CONSTRAINT etl_api_clients_key_digest_key UNIQUE (key_digest);
-- ;
ALTER TABLE ONLY etl_api_clients
    ADD CONSTRAINT etl_api_clients_pkey PRIMARY KEY (id);
-- ;
ALTER TABLE ONLY etl_audit_log
    ADD CONSTRAINT etl_audit_log_pkey PRIMARY KEY (id);
-- ;
ALTER TABLE etl_audit_log
    ADD CONSTRAINT etl_audit_log_source_known CHECK ((source = ANY (ARRAY['console'::text, 'api'::text]))) NOT VALID;
-- ;
ALTER TABLE ONLY etl_backlog_minutes
    ADD CONSTRAINT etl_backlog_minutes_pkey PRIMARY KEY (minute);
-- ;
ALTER TABLE ONLY etl_console_ended_sessions
    ADD CONSTRAINT etl_console_ended_sessions_pkey PRIMARY KEY (session_id);
-- ;
ALTER TABLE ONLY etl_dead_letters
    ADD CONSTRAINT etl_dead_letters_pkey PRIMARY KEY (job_id);
-- ;
ALTER TABLE ONLY etl_job_cancel_deferred
    ADD CONSTRAINT etl_job_cancel_deferred_pkey PRIMARY KEY (job_id);
-- ;
ALTER TABLE ONLY etl_job_intake
    ADD CONSTRAINT etl_job_intake_idempotency UNIQUE (owner_key, idempotency_key_digest);
-- ;
ALTER TABLE ONLY etl_job_intake
    ADD CONSTRAINT etl_job_intake_pkey PRIMARY KEY (id);
-- ;
ALTER TABLE etl_job_outcomes
    ADD CONSTRAINT etl_job_outcomes_diagnosis_only_if_failed CHECK (((diagnosis IS NULL) OR (status = 'failed'::text))) NOT VALID;
-- ;
ALTER TABLE etl_job_outcomes
    ADD CONSTRAINT etl_job_outcomes_ledger_only_if_succeeded CHECK ((((rows_inserted IS NULL) = (rows_updated IS NULL)) AND ((rows_inserted IS NULL) = (rows_unchanged IS NULL)) AND ((rows_inserted IS NULL) = (data_checksum IS NULL)) AND ((status = 'succeeded'::text) OR (rows_inserted IS NULL)) AND ((status <> 'succeeded'::text) OR (lease_claim_id IS NOT NULL)))) NOT VALID;
-- ;
ALTER TABLE etl_job_outcomes
    ADD CONSTRAINT etl_job_outcomes_output_only_if_succeeded CHECK (((output IS NULL) OR (status = 'succeeded'::text))) NOT VALID;
-- ;
ALTER TABLE ONLY etl_job_outcomes
    ADD CONSTRAINT etl_job_outcomes_pkey PRIMARY KEY (job_id);
-- ;
ALTER TABLE ONLY etl_job_records
    ADD CONSTRAINT etl_job_records_pkey PRIMARY KEY (id);
-- ;
ALTER TABLE ONLY etl_key_permits
    ADD CONSTRAINT etl_key_permits_pkey PRIMARY KEY (claim_id);
-- ;
ALTER TABLE ONLY etl_key_permits
    ADD CONSTRAINT etl_key_permits_slot_key UNIQUE (queue, concurrency_key, slot);
-- ;
ALTER TABLE ONLY etl_moved_owners
    ADD CONSTRAINT etl_moved_owners_pkey PRIMARY KEY (owner_key);
-- ;
ALTER TABLE ONLY etl_owner_arrivals
    ADD CONSTRAINT etl_owner_arrivals_pkey PRIMARY KEY (move_id);
-- ;
ALTER TABLE ONLY etl_owner_beats
    ADD CONSTRAINT etl_owner_beats_pkey PRIMARY KEY (owner_id);
-- ;
ALTER TABLE ONLY etl_queue_permits
    ADD CONSTRAINT etl_queue_permits_pkey PRIMARY KEY (queue, slot);
-- ;
ALTER TABLE ONLY etl_queues
    ADD CONSTRAINT etl_queues_pkey PRIMARY KEY (queue);
-- ;
ALTER TABLE ONLY etl_replica_minutes
    ADD CONSTRAINT etl_replica_minutes_pkey PRIMARY KEY (minute, owner_id, incarnation);
-- ;
ALTER TABLE ONLY etl_replicas
    ADD CONSTRAINT etl_replicas_pkey PRIMARY KEY (owner_id);
-- ;
ALTER TABLE ONLY etl_retained_payloads
    ADD CONSTRAINT etl_retained_payloads_pkey PRIMARY KEY (job_id);
-- ;
ALTER TABLE ONLY etl_schedule_fires
    ADD CONSTRAINT etl_schedule_fires_pkey PRIMARY KEY (owner_key, name, fire_at);
-- ;
ALTER TABLE ONLY etl_schedules
    ADD CONSTRAINT etl_schedules_pkey PRIMARY KEY (owner_key, name);
-- ;
ALTER TABLE ONLY etl_target_rows
    ADD CONSTRAINT etl_target_rows_pkey PRIMARY KEY (owner_key, dataset, record_key);
-- ;
ALTER TABLE ONLY etl_waiting_replicas
    ADD CONSTRAINT etl_waiting_replicas_pkey PRIMARY KEY (owner_id);
-- ;
CREATE INDEX etl_dead_letters_code_idx ON etl_dead_letters USING btree (code, failed_at, job_id) WHERE (replayed_job_id IS NULL);
-- ;
CREATE INDEX etl_dead_letters_kind_idx ON etl_dead_letters USING btree (kind, failed_at, job_id) WHERE (replayed_job_id IS NULL);
-- ;
CREATE INDEX etl_dead_letters_open_idx ON etl_dead_letters USING btree (failed_at, job_id) WHERE (replayed_job_id IS NULL);
-- ;
CREATE INDEX etl_dead_letters_owner_idx ON etl_dead_letters USING btree (owner_key, failed_at, job_id) WHERE (replayed_job_id IS NULL);
-- ;
CREATE INDEX etl_dead_letters_queue_idx ON etl_dead_letters USING btree (queue, failed_at, job_id) WHERE (replayed_job_id IS NULL);
-- ;
CREATE INDEX etl_dead_letters_replayed_idx ON etl_dead_letters USING btree (replayed_job_id) WHERE (replayed_job_id IS NOT NULL);
-- ;
CREATE INDEX etl_job_attempts_job_idx ON etl_job_attempts USING btree (job_id, ended_at);
-- ;
CREATE INDEX etl_job_attempts_recovered_idx ON etl_job_attempts USING btree (owner_id, started_at) WHERE ((ending = 'recovered'::text) AND (owner_id IS NOT NULL));
-- ;
CREATE INDEX etl_job_intake_owner_listing_idx ON etl_job_intake USING btree (owner_key, id);
-- ;
CREATE INDEX etl_job_intake_replaces_idx ON etl_job_intake USING btree (replaces_job_id) WHERE (replaces_job_id IS NOT NULL);
-- ;
CREATE INDEX etl_job_outcomes_owner_status_listing_idx ON etl_job_outcomes USING btree (owner_key, status, job_id);
-- ;
CREATE INDEX etl_job_records_claim_idx ON etl_job_records USING btree (queue, kind, sort_at, id) WHERE (status = 'pending'::text);
-- ;
CREATE INDEX etl_job_records_pending_owner_idx ON etl_job_records USING btree (owner_key, id) WHERE (status = 'pending'::text);
-- ;
CREATE INDEX etl_job_records_running_owner_idx ON etl_job_records USING btree (lease_owner_id) WHERE (status = 'running'::text);
-- ;
CREATE INDEX etl_moving_rows_owner_key_idx ON etl_moving_rows USING btree (owner_key);
-- ;
CREATE INDEX etl_schedules_due_idx ON etl_schedules USING btree (next_fire_at) WHERE (NOT paused);
-- ;
CREATE INDEX etl_target_rows_written_by_job_idx ON etl_target_rows USING btree (written_by_job) WHERE (written_by_job IS NOT NULL);
-- ;
CREATE TRIGGER etl_job_intake_refuse_moved_owners AFTER INSERT ON etl_job_intake REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION durable_etl_refuse_moved_owners();
-- ;
CREATE TRIGGER etl_job_records_notify_enqueue AFTER INSERT ON etl_job_records REFERENCING NEW TABLE AS inserted_jobs FOR EACH STATEMENT EXECUTE FUNCTION durable_etl_notify_enqueue();
-- ;
CREATE TRIGGER etl_job_records_notify_given_back AFTER UPDATE OF status ON etl_job_records FOR EACH ROW WHEN (((old.status = 'running'::text) AND (new.status = 'pending'::text) AND (new.run_at <= now()))) EXECUTE FUNCTION durable_etl_notify_given_back();
-- ;
CREATE TRIGGER etl_key_permits_notify_freed AFTER DELETE ON etl_key_permits FOR EACH ROW EXECUTE FUNCTION durable_etl_notify_key_permits();
-- ;
CREATE TRIGGER etl_queue_permits_notify_freed AFTER UPDATE OF claim_id ON etl_queue_permits FOR EACH ROW WHEN (((old.claim_id IS NOT NULL) AND (new.claim_id IS NULL))) EXECUTE FUNCTION durable_etl_notify_permits();
-- ;
CREATE TRIGGER etl_schedules_refuse_moved_owners AFTER INSERT ON etl_schedules REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION durable_etl_refuse_moved_owners();
-- ;
ALTER TABLE ONLY etl_dead_letters
    ADD CONSTRAINT etl_dead_letters_job_id_fkey FOREIGN KEY (job_id) REFERENCES etl_job_intake(id) ON DELETE CASCADE;
-- ;
ALTER TABLE ONLY etl_job_attempts
    ADD CONSTRAINT etl_job_attempts_job_id_fkey FOREIGN KEY (job_id) REFERENCES etl_job_intake(id) ON DELETE CASCADE;
-- ;
ALTER TABLE ONLY etl_job_cancel_deferred
    ADD CONSTRAINT etl_job_cancel_deferred_job_id_fkey FOREIGN KEY (job_id) REFERENCES etl_job_intake(id) ON DELETE CASCADE;
-- ;
ALTER TABLE ONLY etl_job_intake
    ADD CONSTRAINT etl_job_intake_replaces_job_id_fkey FOREIGN KEY (replaces_job_id) REFERENCES etl_job_intake(id) ON DELETE SET NULL;
-- ;
ALTER TABLE ONLY etl_queue_permits
    ADD CONSTRAINT etl_queue_permits_queue_fkey FOREIGN KEY (queue) REFERENCES etl_queues(queue) ON DELETE CASCADE;
-- ;
ALTER TABLE ONLY etl_retained_payloads
    ADD CONSTRAINT etl_retained_payloads_job_id_fkey FOREIGN KEY (job_id) REFERENCES etl_job_intake(id) ON DELETE CASCADE;
-- ;
ALTER TABLE ONLY etl_target_rows
    ADD CONSTRAINT etl_target_rows_written_by_job_fkey FOREIGN KEY (written_by_job) REFERENCES etl_job_intake(id) ON DELETE SET NULL;
