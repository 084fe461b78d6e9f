-- 0029: a wake reads the queue and its waiting replicas in one statement.
--
-- `durable_etl_wake` (0028) keeps its rules and its locks; each of its reads, the one before the
-- queue's enqueue barrier and the one after it, is now a single statement that checks that the
-- queue may be claimed (not paused; a free permit when capped), picks the waiting replicas to
-- name and notifies them, instead of two or three statements. An enqueue that finds every
-- replica busy, the common case under load, runs two statements and the barrier instead of five.
--
-- Readers: additive; the notifications' payloads are 0028's.
--
-- Locks: CREATE OR REPLACE updates the function's catalog row (each session runs the new body
-- from its next statement that calls it); DROP FUNCTION takes nothing a job statement holds.

-- Wakes for `jobs` claimable jobs of `wake_queue` and `wake_kind` (NULL: any kind, every waiting
-- replica of the queue) in the calling transaction. Under READ COMMITTED it reads, without locks,
-- whether the queue may be claimed and which replicas wait for it, and notifies up to `jobs` of
-- them chosen at random (`t <token> <queue> <kind>`), or, with no kind, the whole queue (`q
-- <queue>`). When it notified nobody it takes the queue's enqueue barrier in share mode to the
-- commit and reads again once: a replica that registered, or a resume that committed, before the
-- barrier was taken is seen by that read (each statement takes a new snapshot), and one after it
-- finds the barrier held when it tries it. Under another isolation level its reads would see the
-- transaction's first snapshot, so it wakes the whole queue.
--
-- Locks: none but the notify queue's at commit when a read finds a replica to wake; else the
-- queue's enqueue barrier in share mode to the commit.
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

DROP FUNCTION durable_etl_queue_open(text);
