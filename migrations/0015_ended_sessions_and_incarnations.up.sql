-- 0015: console sessions that ended on the server, and replica incarnations in the reports.
--
-- `etl_console_ended_sessions` holds the id of every console session signed out before its
-- cookie expired, with that expiry. A console request whose session id is here is treated as
-- signed out (redirected to sign-in), so a copy of the cookie taken before the sign-out is
-- refused. Each sign-out also deletes the rows past their expiry: the table holds at most the
-- sign-outs of the last 30 minutes (the session lifetime). It is logged: a crash must not bring
-- ended sessions back.
--
-- `etl_replicas.incarnation` and `etl_replica_minutes.incarnation` name one run of a replica (a
-- random id per start). A replica stopping deletes its row only if it is still its own
-- incarnation's, so one stopped because another process took its owner id leaves that holder's
-- row; the minute rows are keyed by (minute, owner id, incarnation), so a replica restarted
-- with the same owner id (after `kill -9`, say) adds its totals to the dead incarnation's
-- instead of overwriting them. Rows written before 0015 become the nil incarnation.
--
-- Readers: additive for the queue. Releases before it neither read nor write the sessions
-- table (their cookies, of another format, are refused by releases with 0015 and the other
-- way round, so a signed-out session is not revived by an older API); their replicas' reports
-- are refused (`ON CONFLICT (minute, owner_id)` has no matching key any more): they log a
-- failed report per interval, keep working, and are missing from the operator view.
--
-- Locks: ACCESS EXCLUSIVE on etl_replicas and etl_replica_minutes while the key is rebuilt (an
-- instant: two hours of aggregates, unlogged); creating the sessions table takes no other lock.
CREATE TABLE etl_console_ended_sessions (
    session_id uuid        PRIMARY KEY,
    expires_at timestamptz NOT NULL
);

ALTER TABLE etl_replicas ADD COLUMN incarnation uuid;

ALTER TABLE etl_replica_minutes
    ADD COLUMN incarnation uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000';
ALTER TABLE etl_replica_minutes ALTER COLUMN incarnation DROP DEFAULT;
ALTER TABLE etl_replica_minutes
    DROP CONSTRAINT etl_replica_minutes_pkey,
    ADD CONSTRAINT etl_replica_minutes_pkey PRIMARY KEY (minute, owner_id, incarnation);

COMMENT ON TABLE etl_console_ended_sessions IS
    'durable-etl: console sessions signed out before their expiry (purged past it)';
