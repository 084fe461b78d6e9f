-- 0042 down: no owner can move between cells.
--
-- Locks: DROP TRIGGER takes ACCESS EXCLUSIVE on the intake and the schedules for an
-- instant. Sent a statement at a time, as the up script is.

DROP TRIGGER etl_schedules_refuse_moved_owners ON etl_schedules;
-- ;
DROP TRIGGER etl_job_intake_refuse_moved_owners ON etl_job_intake;
-- ;
DROP FUNCTION durable_etl_refuse_moved_owners();
-- ;
DROP TABLE etl_owner_arrivals;
-- ;
DROP TABLE etl_moving_rows;
-- ;
DROP TABLE etl_moved_owners;
