-- 0025: the unkeyed enqueue (src/enqueue.rs, the common case: no job of the chunk has an
-- idempotency key or replaces another) runs inside a function whose plan its session keeps.
--
-- The library sends its enqueue as an unnamed statement on the caller's own connection or
-- transaction (it cannot prepare there: a prepared statement belongs to one connection, and
-- poolers in transaction mode keep none), so PostgreSQL parsed, analysed and planned the whole
-- two-table insert on every enqueue: a third of a single-job enqueue's server CPU on a 2-core
-- machine (`scripts/enqueue-levers`, docs/benchmarks.md, #26). A PL/pgSQL function's statements
-- are parsed once per session and their plans cached (re-planned by PostgreSQL whenever the
-- tables change), so the statement the library now sends is only the call, cheap to parse.
--
-- The body is the library's former statement, byte for byte the same SQL with the same
-- positional parameters $1..$12 (ids, key digests, fingerprints, payloads, attempt bounds,
-- asked due times, owner digest, kind, replaced jobs, queues, priorities, concurrency keys):
-- the same rows, the same `run_at` rule, the same trigger, fired by the insert as before.
--
-- Readers: additive; releases before it send the statement themselves.
-- Locks: CREATE FUNCTION takes no table lock. A call inserts new intake and live rows and
-- their index entries, as the statement did, and the live table's statement-level trigger runs
-- at the end of the insert, inside the call.

CREATE FUNCTION durable_etl_enqueue_unkeyed(uuid[], bytea[], bytea[], jsonb[], int4[],
                                            timestamptz[], bytea, text, uuid[], text[], int2[],
                                            text[]) RETURNS void
    LANGUAGE plpgsql AS $$
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
$$;

COMMENT ON FUNCTION durable_etl_enqueue_unkeyed(uuid[], bytea[], bytea[], jsonb[], int4[],
                                                timestamptz[], bytea, text, uuid[], text[],
                                                int2[], text[]) IS
    'durable-etl: inserts a chunk of jobs without idempotency keys (src/enqueue.rs), plan kept per session';
