-- 0038: the operator view's per-minute series: finished and failed jobs by queue, pickup latency
-- percentiles, and the backlog minute by minute.
--
-- `etl_replica_minutes` gains two totals since the incarnation started, written by each report
-- beside the others (migration 0011):
-- - `by_queue`: `{"queue": [succeeded, failed], ...}` for each queue the replica served and ended
--   a job of (its served queues only, so bounded by its configuration);
-- - `pickup_buckets`: the pickups counted per latency bucket, 15 counts: one per upper bound
--   0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 10000 and 60000 ms (a latency falls in
--   the first bucket whose bound it does not exceed), then one for slower pickups. The bounds are
--   `worker::stats::LATENCY_BUCKETS`, the `pickup_latency` histogram's.
-- The differences between a replica's consecutive minutes, summed across replicas, give each
-- queue's jobs per minute and the fleet's latency histogram per minute.
--
-- `etl_backlog_minutes` holds the backlog once a minute: the active jobs due, deferred or waiting
-- to retry, and running, in all and for the deepest queues (`by_queue`: `{"queue": [due,
-- deferred, running], ...}`). The first replica to report in a minute counts them; the others'
-- statement finds the minute's row and skips the count. Rows older than two hours are deleted by
-- the reports. Aggregates only, like 0011's tables; UNLOGGED for the same reasons.
--
-- Readers: additive. A release before it writes NULL in the new columns and no backlog row; the
-- operator view shows no per-queue or percentile figure for its replicas' minutes.
--
-- Locks: ACCESS EXCLUSIVE on etl_replica_minutes for an instant (nullable columns without a
-- default: catalog only); the new table takes no lock on another.

ALTER TABLE etl_replica_minutes
    ADD COLUMN by_queue       jsonb,
    ADD COLUMN pickup_buckets bigint[];

CREATE UNLOGGED TABLE etl_backlog_minutes (
    minute   timestamptz PRIMARY KEY,
    due      bigint      NOT NULL CHECK (due >= 0),
    deferred bigint      NOT NULL CHECK (deferred >= 0),
    running  bigint      NOT NULL CHECK (running >= 0),
    by_queue jsonb       NOT NULL
);

COMMENT ON TABLE etl_backlog_minutes IS
    'durable-etl: the active jobs by state once a minute (two hours kept), for the operator view';
