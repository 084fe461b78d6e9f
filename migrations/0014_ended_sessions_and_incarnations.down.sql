-- 0014 down: no ended sessions. Console sessions signed out before the down script are refused
-- anyway (releases before 0014 read another cookie format). Locks: ACCESS EXCLUSIVE on the table
-- while it is dropped.
DROP TABLE etl_console_ended_sessions;
