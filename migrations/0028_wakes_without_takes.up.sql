-- 0028: wakes that no caller's transaction can stall or lose.
--
-- Before 0028 the enqueue trigger took a waiting replica's row (`FOR UPDATE SKIP LOCKED`) and
-- held its lock to the caller's commit: another producer's committed job then found no row and
-- woke nobody, a rollback lost the wake, a replica parking its row waited for the caller's
-- commit, and a dead replica's row (taken oldest first) absorbed the next wake.
--
-- Now no statement of the caller's transaction locks a row another party needs:
--
-- - `durable_etl_wake(queue, kind, jobs)` is the one place a transaction decides to wake. It
--   reads, without locks, whether the queue may be claimed (not paused, and a free permit when
--   capped) and which replicas wait for it. When some do, it notifies up to `jobs` of them,
--   chosen at random, by wake token: `t <token> <queue> <kind>`. Every replica hears every
--   notification; the named one claims at once, and every other replica that waits for that
--   queue and kind claims after a short backup delay unless it claimed meanwhile, so a wake
--   named for a replica that died, or filled up, still reaches one that can act. With no kind
--   (work a release or recovery made claimable), it wakes every replica waiting for the queue:
--   `q <queue>`.
-- - When nobody may act (nobody waits for the queue and kind, or the queue is paused or has no
--   free permit), it takes the queue's enqueue barrier in share mode
--   (`pg_advisory_xact_lock_shared('detl', hashtext(queue))`) to its commit, and reads again
--   after the lock: whoever it finds then is woken; if still nobody, it sends nothing. Every party that
--   makes the queue claimable for some replica afterwards (a replica that starts waiting, a
--   resume, a cap raised, a permit freed) has that replica try the barrier in exclusive mode
--   (never waiting) and claim after a successful try: the enqueues that skipped have ended by
--   then. No enqueue ever waits for another, nor for a replica.
-- - A row trigger wakes for every row moved from `running` back to a due `pending` (recovery,
--   releases), in the moving statement's transaction.
-- - The waiting table's rows are written only by their own replicas (and deleted by recovery).
--
-- Readers: breaking. A release before it reads a notification's payload as a bare wake token,
-- so the new payloads would wake it never; it refuses to start against 0028.
--
-- Locks: CREATE OR REPLACE updates the functions' catalog rows (each session runs the new bodies
-- from its next statement that fires them); CREATE TRIGGER takes the live table's SHARE ROW
-- EXCLUSIVE lock for an instant.

COMMENT ON TABLE etl_waiting_replicas IS
    'durable-etl: one row per replica that waited for work since it started, written by that replica only; a row whose queues and kinds are empty is parked (busy) and waits for nothing';

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
CREATE FUNCTION durable_etl_wake(wake_queue text, wake_kind text, jobs bigint) RETURNS void
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

CREATE OR REPLACE FUNCTION durable_etl_notify_enqueue() RETURNS trigger
    LANGUAGE plpgsql AS $$
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

-- A permit freed outside a completion (a release, recovery): wake the queue's waiting replicas.
CREATE OR REPLACE FUNCTION durable_etl_wake_for_freed(freed_queue text) RETURNS void
    LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('durable_etl.freer_claims', true) = 'on' THEN
        RETURN;
    END IF;
    PERFORM durable_etl_wake(freed_queue, NULL, 1);
END;
$$;

-- A row given back to a due `pending` (recovery, a release, a retry due at once): wake the
-- queue's waiting replicas, unless a completion that frees its permit claims next (0023).
CREATE FUNCTION durable_etl_notify_given_back() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('durable_etl.freer_claims', true) = 'on' THEN
        RETURN NULL;
    END IF;
    PERFORM durable_etl_wake(NEW.queue, NULL, 1);
    RETURN NULL;
END;
$$;

CREATE TRIGGER etl_job_records_notify_given_back
    AFTER UPDATE OF status ON etl_job_records
    FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.status = 'pending' AND NEW.run_at <= now())
    EXECUTE FUNCTION durable_etl_notify_given_back();
