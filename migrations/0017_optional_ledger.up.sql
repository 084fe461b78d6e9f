-- 0017: a succeeded job of a kind that keeps no response ledger has none.
--
-- Until now every `succeeded` outcome carried the ETL ledger (rows inserted, updated, unchanged
-- and a data checksum), so a kind that loads nothing reported zero rows and a zero checksum. The
-- ledger is now all or nothing, and only on a succeeded outcome: a kind that keeps none stores
-- NULLs, and its status shows no `result`. A succeeded outcome still names its claim
-- (`lease_claim_id`), which resolves a COMMIT whose outcome the worker did not hear.
--
-- Readers: additive. Releases before it write a ledger for every success (which the new rule
-- admits) and read the ledger as optional already; they never run the kinds that keep none.
-- Locks: ACCESS EXCLUSIVE on etl_job_outcomes for the constraint swap (catalog only: the new
-- constraint is added NOT VALID, since every existing row met the stricter old rule, so no scan
-- of the history runs under the lock; it applies to every row written from now on).
ALTER TABLE etl_job_outcomes
    DROP CONSTRAINT etl_job_outcomes_ledger_iff_succeeded,
    ADD CONSTRAINT etl_job_outcomes_ledger_only_if_succeeded CHECK (
        (rows_inserted IS NULL) = (rows_updated IS NULL)
        AND (rows_inserted IS NULL) = (rows_unchanged IS NULL)
        AND (rows_inserted IS NULL) = (data_checksum IS NULL)
        AND (status = 'succeeded' OR rows_inserted IS NULL)
        AND (status <> 'succeeded' OR lease_claim_id IS NOT NULL)) NOT VALID;
