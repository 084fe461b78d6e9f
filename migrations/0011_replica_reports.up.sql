-- 0011: what replicas report about themselves, for the console's operator view.
--
-- Every replica upserts, once per heartbeat interval, its row of `etl_replicas` (when it
-- started, when it last reported, the jobs it holds, its claim rate) and its row of the current
-- minute in `etl_replica_minutes`: its counters since it started (jobs succeeded, failed, by
-- code; jobs recovered; pickups and their summed latency). The operator view reads per-minute
-- rates from the differences between a replica's consecutive minutes. Nothing here names a job,
-- an owner or a payload: aggregates only.
--
-- Both tables are UNLOGGED: reports are rewritten every few seconds, need no WAL, and a crash
-- that empties them loses only the dashboard's recent past (replicas report again at once).
-- Rows older than two hours are deleted by the replicas' own reports.
--
-- Readers: additive. Releases before it never report; the operator view shows only replicas of
-- releases that do.
--
-- Locks: creating the tables takes no lock on another table.
CREATE UNLOGGED TABLE etl_replicas (
    owner_id    text             PRIMARY KEY CHECK (length(owner_id) BETWEEN 1 AND 128),
    started_at  timestamptz      NOT NULL,
    reported_at timestamptz      NOT NULL,
    held        integer          NOT NULL CHECK (held >= 0),
    claimed     bigint           NOT NULL CHECK (claimed >= 0),
    claim_rate  double precision NOT NULL CHECK (claim_rate >= 0)
);

CREATE UNLOGGED TABLE etl_replica_minutes (
    minute         timestamptz      NOT NULL,
    owner_id       text             NOT NULL,
    started_at     timestamptz      NOT NULL,
    succeeded      bigint           NOT NULL CHECK (succeeded >= 0),
    failed         bigint           NOT NULL CHECK (failed >= 0),
    failed_by_code jsonb            NOT NULL,
    recovered      bigint           NOT NULL CHECK (recovered >= 0),
    pickups        bigint           NOT NULL CHECK (pickups >= 0),
    pickup_seconds double precision NOT NULL CHECK (pickup_seconds >= 0),
    PRIMARY KEY (minute, owner_id)
);

COMMENT ON TABLE etl_replicas IS
    'durable-etl: each replica''s last report (held jobs, claim rate), for the operator view';
COMMENT ON TABLE etl_replica_minutes IS
    'durable-etl: each replica''s counters at the end of each minute (two hours kept), for the operator view';
