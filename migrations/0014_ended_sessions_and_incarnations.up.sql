-- 0014: console sessions that ended on the server.
--
-- `etl_console_ended_sessions` holds the id of every console session signed out before its
-- cookie expired, with that expiry. A console request whose session id is here is treated as
-- signed out (redirected to sign-in), so a copy of the cookie taken before the sign-out is
-- refused. Each sign-out also deletes the rows past their expiry: the table holds at most the
-- sign-outs of the last 30 minutes (the session lifetime). It is logged: a crash must not bring
-- ended sessions back.
--
-- Readers: additive. Releases before it neither read nor write the table (their cookies, of
-- another format, are refused by releases with 0014 and the other way round, so a signed-out
-- session is not revived by an older API).
--
-- Locks: creating the table takes no lock on another table.
CREATE TABLE etl_console_ended_sessions (
    session_id uuid        PRIMARY KEY,
    expires_at timestamptz NOT NULL
);

COMMENT ON TABLE etl_console_ended_sessions IS
    'durable-etl: console sessions signed out before their expiry (purged past it)';
