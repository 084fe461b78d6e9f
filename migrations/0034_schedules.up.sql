-- 0034: recurring schedules, evaluated by every replica with no leader.
--
-- A schedule (owner, name) makes a job of its kind and arguments at each fire of its cron
-- expression in its IANA time zone. Replicas take due rows (`next_fire_at` at or before the
-- database's clock) with FOR UPDATE SKIP LOCKED, enqueue the fire's job with a key derived from
-- (schedule, fire instant) and move `next_fire_at` on, in one transaction: a fire is enqueued
-- once whoever evaluates it. Each fire is recorded in `etl_schedule_fires` (its job, or why it
-- made none), which outlives the pruning of ended jobs.
--
-- Readers: additive. A release before it neither reads nor writes the tables.
--
-- Locks: two new tables and their indexes; nothing existing is touched.

CREATE TABLE etl_schedules (
    owner_key      durable_etl_digest       NOT NULL,
    name           durable_etl_name         NOT NULL,
    cron           text                     NOT NULL CHECK (char_length(cron) BETWEEN 1 AND 255),
    time_zone      text                     NOT NULL CHECK (char_length(time_zone) BETWEEN 1 AND 64),
    kind           durable_etl_name         NOT NULL,
    args           jsonb                    NOT NULL,
    queue          durable_etl_name         NOT NULL,
    priority       durable_etl_priority     NOT NULL,
    max_attempts   durable_etl_max_attempts NOT NULL,
    missed         text                     NOT NULL CHECK (missed IN ('coalesce', 'catch_up', 'skip')),
    catch_up_limit integer                  NOT NULL CHECK (catch_up_limit BETWEEN 0 AND 1000),
    overlap        text                     NOT NULL CHECK (overlap IN ('allow', 'skip')),
    paused         boolean                  NOT NULL DEFAULT false,
    declared       boolean                  NOT NULL,
    next_fire_at   timestamptz              NOT NULL,
    last_fire_at   timestamptz,
    last_job_id    uuid,
    created_at     timestamptz              NOT NULL DEFAULT now(),
    updated_at     timestamptz              NOT NULL DEFAULT now(),
    PRIMARY KEY (owner_key, name),
    CHECK ((missed = 'catch_up') = (catch_up_limit > 0))
);

-- What a replica probes each tick: the earliest unpaused fire.
CREATE INDEX etl_schedules_due_idx ON etl_schedules (next_fire_at) WHERE NOT paused;

COMMENT ON TABLE etl_schedules IS
    'durable-etl: recurring schedules; fired by every replica, each fire once';

CREATE TABLE etl_schedule_fires (
    owner_key durable_etl_digest NOT NULL,
    name      durable_etl_name   NOT NULL,
    fire_at   timestamptz        NOT NULL,
    job_id    uuid,
    outcome   text               NOT NULL CHECK (outcome IN ('enqueued', 'missed', 'overlapped')),
    fired_at  timestamptz        NOT NULL DEFAULT now(),
    PRIMARY KEY (owner_key, name, fire_at),
    CHECK ((outcome = 'enqueued') = (job_id IS NOT NULL))
);

COMMENT ON TABLE etl_schedule_fires IS
    'durable-etl: every fire of every schedule, with its job or why it made none';
