-- 0034 down: the schedules and their fires go; the jobs they made stay.

DROP TABLE etl_schedule_fires;
DROP TABLE etl_schedules;
