-- 0009: the enqueue trigger notifies only while a replica waits for work.
--
-- A transaction that notifies holds PostgreSQL's cluster-wide notify lock from its NOTIFY through
-- its commit's WAL flush, so notifying commits cannot share a flush: with 8 single-row producers
-- the trigger halved enqueue throughput. A NOTIFY wakes only a replica that waits; a busy replica
-- claims again by itself as its jobs end. So replicas that wait say so in
-- `etl_waiting_replicas`, and the trigger notifies only while that table has a row.
--
-- The race this must not lose: an enqueue reads "nobody waits", a replica then registers, claims,
-- finds nothing (the enqueue has not committed yet), and waits for a NOTIFY that never comes. The
-- enqueue barrier closes it. The trigger takes the barrier's advisory lock in SHARE mode before it
-- reads the table, and holds it to its commit. A replica that registered (committed) then takes
-- the same lock in EXCLUSIVE mode with a try (`pg_try_advisory_xact_lock`, never waiting, so it
-- never queues enqueues behind it) and claims after it succeeds: every enqueue that read the table
-- before the registration committed had then ended, so the claim sees its jobs; every enqueue
-- that reads it after sees the row and notifies. Until its try succeeds the replica tries again,
-- at doubling intervals (src/worker/presence.rs). The read needs a snapshot taken after the lock:
-- PL/pgSQL takes one per statement in READ COMMITTED; a transaction at a stricter isolation level
-- reads the table in its own older snapshot, so the trigger notifies for it as it always did.
--
-- Readers: releases before 0009 never register. Their replicas still LISTEN on the channel, and
-- every NOTIFY reaches every listener, so they are woken whenever a newer replica waits; when none
-- does, their poll finds the jobs (pickup then takes up to a poll interval). Mixed fleets work;
-- roll the fleet before relying on the pickup latency (docs/migrations.md).
--
-- Locks: creating the table takes no lock on another table; CREATE OR REPLACE updates the
-- function's catalog row, and each session uses the new body from its next enqueue after the
-- commit.

-- One row per replica that waits for work (its owner id). UNLOGGED: no WAL for a table that is
-- rewritten at every idle/busy change, and emptied by crash recovery, when every replica's
-- session is lost and each registers again after it reconnects.
CREATE UNLOGGED TABLE etl_waiting_replicas (
    owner_id     text        PRIMARY KEY CHECK (length(owner_id) BETWEEN 1 AND 128),
    refreshed_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE etl_waiting_replicas IS
    'durable-etl: replicas waiting for work; the enqueue trigger notifies only while one does';

CREATE OR REPLACE FUNCTION durable_etl_notify_enqueue() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('durable_etl.notify', true) IS DISTINCT FROM 'off'
       AND EXISTS (SELECT 1 FROM inserted_jobs WHERE status = 'pending' AND run_at <= now()) THEN
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            PERFORM pg_notify('durable_etl_jobs', '');
            RETURN NULL;
        END IF;
        -- The enqueue barrier ('detl', 1), held to commit; then a fresh snapshot of the table.
        PERFORM pg_advisory_xact_lock_shared(1684370540, 1);
        IF EXISTS (SELECT 1 FROM etl_waiting_replicas) THEN
            PERFORM pg_notify('durable_etl_jobs', '');
        END IF;
    END IF;
    RETURN NULL;
END;
$$;
