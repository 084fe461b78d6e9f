-- Reverts 0031. Requests still recorded are folded onto their jobs' live rows first (the code
-- every release since 0013 honours: a running job ends `cancelled` when its attempt ends, a
-- pending one when its next attempt does, its effects never committed), so a rollback loses none.
-- Locks: the live rows of the jobs with a recorded request (waiting at most the session's
-- `lock_timeout` for a commit that holds one); DROP TABLE takes the table's ACCESS EXCLUSIVE lock
-- (no job statement reads it).

UPDATE etl_job_records j
   SET cancel_code = coalesce(j.cancel_code, d.code)
  FROM etl_job_cancel_deferred d
 WHERE d.job_id = j.id;

DROP TABLE etl_job_cancel_deferred;
