-- 0039 down: the source column goes (with its CHECK); the table's comment is 0037's again.

ALTER TABLE etl_audit_log DROP COLUMN source;

COMMENT ON TABLE etl_audit_log IS
    'durable-etl: console actions (key id, action, target, count, time); no owner, no payload';
