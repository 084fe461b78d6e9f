-- 0041 down: the names of the deployment before cells: 0029's wake on the `durable_etl_jobs`
-- channel and 'detl' barrier keys, and the owner-lock key of the owner id alone.
--
-- Locks: the functions' catalog rows.

CREATE OR REPLACE FUNCTION durable_etl_wake(wake_queue text, wake_kind text, jobs bigint) RETURNS void
    LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_notify('durable_etl_jobs', 'q ' || wake_queue);
        RETURN;
    END IF;
    FOR read IN 1..2 LOOP
        PERFORM pg_notify('durable_etl_jobs',
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
        PERFORM pg_advisory_xact_lock_shared(1684370540, hashtext(wake_queue));
    END LOOP;
END;
$$;

-- The advisory-lock key of a replica's owner id: the first 64 bits of SHA-256 of the id.
CREATE OR REPLACE FUNCTION durable_etl_owner_lock_key(owner_id text) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT ('x' || substr(encode(sha256(convert_to(owner_id, 'UTF8')), 'hex'), 1, 16))::bit(64)::bigint
$$;

DROP FUNCTION durable_etl_lock_space();
DROP FUNCTION durable_etl_channel();
