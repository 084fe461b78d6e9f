-- 0037: the audit log of the actions taken from the web console.
--
-- One row per action (a replay, a discard, a cancel, a queue's pause, resume or cap): who took it
-- (the signed-in API key's id, never its owner), what (an action name), on what (a queue's name,
-- a job's id, or a filter summary that never names an owner), how many jobs or letters it took,
-- and when. The console writes a row in the transaction of its action where it can (a bulk
-- replay commits in chunks: its row follows the last one). Rows are only ever appended; the
-- operators' audit page reads the newest along the primary key.
--
-- Readers: additive. A release before it neither reads nor writes the table; its console's
-- actions are not logged.
--
-- Locks: one new table and its sequence; nothing existing is touched.

CREATE TABLE etl_audit_log (
    id       bigint                 GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz            NOT NULL DEFAULT now(),
    key_id   uuid                   NOT NULL,
    action   durable_etl_identifier NOT NULL,
    target   text                   NOT NULL CHECK (char_length(target) BETWEEN 1 AND 512),
    affected bigint                 NOT NULL CHECK (affected >= 0)
);

COMMENT ON TABLE etl_audit_log IS
    'durable-etl: console actions (key id, action, target, count, time); no owner, no payload';
