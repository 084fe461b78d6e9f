-- 0035 down: the letters and the sealed payloads go; the jobs and their outcomes stay.

DROP TABLE etl_retained_payloads;
DROP TABLE etl_dead_letters;
