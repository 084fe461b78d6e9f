-- 0039: where each audited action came from, now that the audit log takes the HTTP API's
-- operator actions beside the web console's.
--
-- `etl_audit_log.source` is `console` (a signed-in console session) or `api` (a bearer key on
-- the HTTP API). Every row written before it came from the console, and so does every row a
-- release before it writes: the column's default, `console`, is right for both. The log keeps
-- an operator key's actions only; an owner's key acting on its own owner's jobs or letters takes
-- no operator action and writes no row.
--
-- Readers: additive. A release before it never reads the column; its console's rows take the
-- default.
--
-- Locks: ADD COLUMN with a constant default changes only the catalog (the table's ACCESS
-- EXCLUSIVE lock for an instant); the CHECK is NOT VALID, as every existing row holds the
-- default, which it allows.

ALTER TABLE etl_audit_log
    ADD COLUMN source text NOT NULL DEFAULT 'console',
    ADD CONSTRAINT etl_audit_log_source_known CHECK (source IN ('console', 'api')) NOT VALID;

COMMENT ON TABLE etl_audit_log IS
    'durable-etl: operator actions from the console or the API (key id, source, action, target, count, time); no owner, no payload';
