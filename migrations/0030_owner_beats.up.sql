-- 0030: owner beats, so that a live replica whose every connection is cut at once is not judged
-- dead at once.
--
-- Before 0030, recovery took an owner whose claims stamped alive locks for dead as soon as no
-- backend held its owner lock or its alive lock: a pooler restart, a NAT reset or an operator
-- ending its backends made a live replica dead within milliseconds, and its running jobs ran
-- twice while its handlers kept computing.
--
-- Now each replica with a session writes its row here every beat (100 ms): when it beat last
-- (`beat_at`, the database's clock) and after how much silence it may be judged dead
-- (`silence_ms`, its own terms). Recovery takes a lock-backed owner for dead only when, beside
-- its locks being gone, its last beat is older than its silence. The replica itself stops
-- trusting its leases, and tells its handlers, a margin before that (see `worker::lease`).
--
-- Readers: additive. A release before it writes no beat and judges by locks alone; its rows of
-- other owners are judged as before 0030.
--
-- Locks: CREATE TABLE takes nothing a job statement holds. The table is UNLOGGED (no WAL, not
-- replicated: after a crash or a failover it is empty, and recovery's reconnect grace gives every
-- owner time to beat again before anyone is judged).

CREATE UNLOGGED TABLE etl_owner_beats (
    owner_id   durable_etl_owner_id PRIMARY KEY,
    beat_at    timestamptz NOT NULL,
    silence_ms integer NOT NULL CHECK (silence_ms > 0)
);

COMMENT ON TABLE etl_owner_beats IS
    'durable-etl: when each replica with a session last beat, and after how much silence recovery may judge it dead';
