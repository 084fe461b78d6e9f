-- Reverts 0019: the regular-expression checks again, as 0001 and 0008 made them.
--
-- Locks: ACCESS EXCLUSIVE on etl_job_intake, etl_job_records and etl_target_rows while each check
-- is swapped and validated (a scan of each table).
ALTER TABLE etl_job_intake
    DROP CONSTRAINT etl_job_intake_kind_check,
    ADD CONSTRAINT etl_job_intake_kind_check CHECK (kind ~ '^[a-z][a-z0-9_.]{0,62}$');
ALTER TABLE etl_job_records
    DROP CONSTRAINT etl_job_records_kind_check,
    ADD CONSTRAINT etl_job_records_kind_check CHECK (kind ~ '^[a-z][a-z0-9_.]{0,62}$');
ALTER TABLE etl_target_rows
    DROP CONSTRAINT etl_target_rows_dataset_check,
    ADD CONSTRAINT etl_target_rows_dataset_check CHECK (dataset ~ '^[a-z][a-z0-9_]{0,62}$');
