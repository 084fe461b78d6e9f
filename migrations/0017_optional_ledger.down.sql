-- Reverts 0017: every succeeded outcome carries a ledger again. The successes that kept none get
-- the ledger releases before 0017 wrote for kinds that load nothing (zero rows, a zero checksum).
--
-- Locks: ACCESS EXCLUSIVE on etl_job_outcomes while the constraint is swapped and validated (a
-- scan of the history); the UPDATE row-locks the successes without a ledger.
UPDATE etl_job_outcomes
   SET rows_inserted = 0, rows_updated = 0, rows_unchanged = 0,
       data_checksum = decode(repeat('00', 32), 'hex')
 WHERE status = 'succeeded' AND rows_inserted IS NULL;
ALTER TABLE etl_job_outcomes
    DROP CONSTRAINT etl_job_outcomes_ledger_only_if_succeeded,
    ADD CONSTRAINT etl_job_outcomes_ledger_iff_succeeded CHECK (
        (status = 'succeeded') = (rows_inserted IS NOT NULL AND rows_updated IS NOT NULL
                                  AND rows_unchanged IS NOT NULL AND data_checksum IS NOT NULL
                                  AND lease_claim_id IS NOT NULL));
