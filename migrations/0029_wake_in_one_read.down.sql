-- Reverts 0029: 0028's wake, which reads whether the queue may be claimed and which replicas
-- wait for it in separate statements. Locks: the functions' catalog rows.

-- Whether a job of `wake_queue` may be claimed now, read without locks: the queue is not paused
-- and, when capped, has a free permit within its cap.
CREATE FUNCTION durable_etl_queue_open(wake_queue text) RETURNS boolean
    LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM etl_queues q
         WHERE q.queue = wake_queue
           AND (q.paused
                OR (q.cap IS NOT NULL
                    AND NOT EXISTS (SELECT 1 FROM etl_queue_permits p
                                     WHERE p.queue = wake_queue AND p.claim_id IS NULL
                                       AND p.slot <= q.cap))))
$$;

-- Wakes for `jobs` claimable jobs of `wake_queue` and `wake_kind` (NULL: any kind, every waiting
-- replica of the queue) in the calling transaction; see the header. Locks: none but the notify
-- queue's at commit when its first read finds a replica to wake; else the queue's enqueue
-- barrier in share mode to the commit (and the notify queue's too, when its second read finds
-- one).
CREATE OR REPLACE FUNCTION durable_etl_wake(wake_queue text, wake_kind text, jobs bigint) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    token bigint;
    woke boolean := false;
    barrier boolean := false;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        -- Its reads see the transaction's first snapshot, older than the waiting table: wake
        -- every replica that waits for the queue.
        PERFORM pg_notify('durable_etl_jobs', 'q ' || wake_queue);
        RETURN;
    END IF;
    -- Read once without the barrier; when nobody may act, take the barrier and read again (each
    -- statement reads a snapshot taken after the lock): a replica that registered, or a resume
    -- that committed, before the barrier was taken is seen by the second read, and one after it
    -- finds the barrier held when it tries it.
    LOOP
        IF durable_etl_queue_open(wake_queue) THEN
            IF wake_kind IS NULL THEN
                IF EXISTS (SELECT 1 FROM etl_waiting_replicas w
                            WHERE wake_queue = ANY (w.queues)) THEN
                    PERFORM pg_notify('durable_etl_jobs', 'q ' || wake_queue);
                    woke := true;
                END IF;
            ELSE
                FOR token IN
                    SELECT w.wake_token FROM etl_waiting_replicas w
                     WHERE wake_queue = ANY (w.queues) AND wake_kind = ANY (w.kinds)
                       AND w.wake_token IS NOT NULL
                     ORDER BY random()
                     LIMIT jobs
                LOOP
                    PERFORM pg_notify('durable_etl_jobs',
                                      't ' || token || ' ' || wake_queue || ' ' || wake_kind);
                    woke := true;
                END LOOP;
            END IF;
        END IF;
        EXIT WHEN woke OR barrier;
        PERFORM pg_advisory_xact_lock_shared(1684370540, hashtext(wake_queue));
        barrier := true;
    END LOOP;
END;
$$;
