-- 0037 down: the audit log goes; nothing else changes.

DROP TABLE etl_audit_log;
