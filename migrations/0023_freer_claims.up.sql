-- 0023: a permit freed by its holder's own completion wakes nobody; the holder claims next.
--
-- Before 0023 every freed permit (0021, 0022) notified every replica waiting for its queue: they
-- all claimed, one won, and under a capped backlog three of four claims came back empty (the
-- freed-permit herd, docs/benchmarks.md). The replica that frees a permit by completing its own
-- job has a free slot and serves the queue, so it is the one to claim the permit's next job:
--
-- - A completion (success, failure, retry) marks its transaction with the setting
--   `durable_etl.freer_claims = on` (transaction-local, `set_config(..., true)`, in the statement
--   that frees the permit), and the permit triggers then notify nobody.
-- - That replica then either claims the queue at once, or, when it cannot claim all the permits
--   it freed (it is draining, has no room, or its claim came back with fewer of the queue's jobs
--   than it freed permits: the queue ran dry of its kinds, or a key it freed has a job of a kind
--   it does not run), wakes the waiting replicas itself with a plain NOTIFY after its commit
--   (src/worker/claim/producer.rs). A NOTIFY sent after the permit's commit needs no barrier: a
--   replica that registers as waiting later claims in a snapshot that sees the permit free.
-- - Every other statement that frees a permit (a release of claims, recovery) sets nothing, and
--   its permits wake the waiting replicas as before, under the enqueue barrier.
--
-- Readers: additive. A release before it never sets the setting, so its freed permits wake the
-- waiting replicas as before; its replicas are woken by the newer replicas' explicit wakes and by
-- their own poll.
--
-- Locks: CREATE OR REPLACE updates the functions' catalog rows; each session runs the new bodies
-- from its next statement that fires them. The helper both triggers call is new.
-- What both permits' triggers do for a permit of `freed_queue` freed outside a completion: notify
-- while a waiting replica serves the queue, under the enqueue barrier (as in 0021 and 0022).
CREATE FUNCTION durable_etl_wake_for_freed(freed_queue text) RETURNS void
    LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('durable_etl.freer_claims', true) = 'on' THEN
        RETURN;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_notify('durable_etl_jobs', '');
        RETURN;
    END IF;
    -- The enqueue barrier ('detl', 1), held to commit; then a fresh snapshot of the table.
    PERFORM pg_advisory_xact_lock_shared(1684370540, 1);
    IF EXISTS (SELECT 1 FROM etl_waiting_replicas w
                WHERE w.queues IS NULL OR freed_queue = ANY (w.queues)) THEN
        PERFORM pg_notify('durable_etl_jobs', '');
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION durable_etl_notify_permits() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM durable_etl_wake_for_freed(NEW.queue);
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION durable_etl_notify_key_permits() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    PERFORM durable_etl_wake_for_freed(OLD.queue);
    RETURN NULL;
END;
$$;
