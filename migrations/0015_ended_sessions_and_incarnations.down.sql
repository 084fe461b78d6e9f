-- 0015 down: no ended sessions, one minute row per (minute, owner id). Where two incarnations of
-- one owner id reported in the same minute, the row of the later one is kept. Console sessions
-- signed out before the down script are refused anyway (releases before 0015 read another cookie
-- format). Locks: ACCESS EXCLUSIVE on the three tables while they change.
DROP TABLE etl_console_ended_sessions;

DELETE FROM etl_replica_minutes m
 USING (SELECT ctid, row_number() OVER (PARTITION BY minute, owner_id
                                        ORDER BY started_at DESC, incarnation DESC) AS n
          FROM etl_replica_minutes) later
 WHERE m.ctid = later.ctid AND later.n > 1;
ALTER TABLE etl_replica_minutes
    DROP CONSTRAINT etl_replica_minutes_pkey,
    ADD CONSTRAINT etl_replica_minutes_pkey PRIMARY KEY (minute, owner_id);
ALTER TABLE etl_replica_minutes DROP COLUMN incarnation;

ALTER TABLE etl_replicas DROP COLUMN incarnation;
