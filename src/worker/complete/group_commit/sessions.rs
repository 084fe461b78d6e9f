//! The commit lanes' own sessions: connections on which the success statements are prepared
//! once, so a group commit sends them by name and PostgreSQL plans them once per connection
//! instead of once per batch (about 0.3 ms of parsing and planning each, measured with pgbench
//! `-M simple` against `-M prepared`: a fifth of a small batch's server time).
//!
//! Invariants this module keeps:
//! - A commit session holds [`completer::SUCCEED_SQL`] and [`completer::SUCCEED_LOCKED_SQL`]
//!   prepared on its own connection, typed [`completer::SUCCESS_PARAMS`]; a statement is never
//!   run on a connection it was not prepared on. Behind a transaction-mode pooler (where the
//!   next transaction may run on another server connection) none is prepared: both are sent
//!   unnamed, typed the same.
//! - A session on which a batch's own statement failed (not with a lost connection) is dropped
//!   when it goes back to the pool, so the next batch prepares its statements afresh.
//! - The sessions plan with the server's settings, like every session but the claim's, and
//!   show as `durable-etl/worker` in `pg_stat_activity`, like a replica's pool: the sessions
//!   where jobs' effects run and commit.

use crate::config::DatabaseConfig;
use crate::db;
use crate::error::Error;
use crate::worker::complete::completer;
use bb8::ManageConnection;
use tokio_postgres::{Client, Statement};

/// A commit lane's connection, with the success statements prepared on it.
pub(crate) struct CommitSession {
    /// The connection.
    pub(crate) client: Client,
    /// [`completer::SUCCEED_SQL`], prepared (`None` behind a transaction-mode pooler).
    pub(crate) succeed: Option<Statement>,
    /// [`completer::SUCCEED_LOCKED_SQL`], prepared (`None` behind a transaction-mode pooler).
    pub(crate) succeed_locked: Option<Statement>,
    /// Set when a batch's own statement failed on it with an error that is not a lost
    /// connection (a prepared statement gone behind a pooler, a cached plan a migration
    /// invalidated, a read-only standby): the pool drops it rather than lend it again.
    pub(crate) broken: bool,
}

impl db::Session for CommitSession {
    fn is_closed(&self) -> bool {
        self.client.is_closed()
    }
}

/// Opens commit sessions: a connection, its owner's alive lock taken, then the two success
/// statements prepared on it (unless behind a transaction-mode pooler).
pub(crate) struct CommitSessions {
    /// Opens the connections.
    connections: db::Manager,
    /// The owner whose alive lock each session holds (`None`: a replica without alive locks).
    alive: Option<String>,
    /// Whether to prepare the success statements ([`crate::config::Pooler::keeps_sessions`]).
    prepare: bool,
}

impl ManageConnection for CommitSessions {
    type Connection = CommitSession;
    type Error = tokio_postgres::Error;

    async fn connect(&self) -> Result<CommitSession, tokio_postgres::Error> {
        let client = self.connections.connect().await?;
        crate::worker::liveness::alive::hold(&client, self.alive.as_deref()).await?;
        let (succeed, succeed_locked) = if self.prepare {
            let succeed = client
                .prepare_typed(completer::SUCCEED_SQL, &completer::SUCCESS_PARAMS)
                .await?;
            let succeed_locked = client
                .prepare_typed(completer::SUCCEED_LOCKED_SQL, &completer::SUCCESS_PARAMS)
                .await?;
            (Some(succeed), Some(succeed_locked))
        } else {
            (None, None)
        };
        Ok(CommitSession {
            client,
            succeed,
            succeed_locked,
            broken: false,
        })
    }

    async fn is_valid(&self, session: &mut CommitSession) -> Result<(), tokio_postgres::Error> {
        self.connections.is_valid(&mut session.client).await
    }

    fn has_broken(&self, session: &mut CommitSession) -> bool {
        session.broken || session.client.is_closed()
    }
}

/// A replica's commit sessions.
pub(crate) type CommitPool = bb8::Pool<CommitSessions>;

/// How many commit sessions a replica keeps: one per lane, and one for reading the outcome of
/// a batch whose connection was lost.
pub(crate) const COMMIT_POOL_SIZE: u32 = super::COMMIT_LANES as u32 + 1;

/// Opens a replica's commit pool ([`COMMIT_POOL_SIZE`] sessions, the replica's usual session
/// settings, each holding `alive`'s alive lock when given), proving the database answers, with
/// one session per lane open from the start: a lane's first batch never waits for a connection
/// to open (under a backlog that wait held a replica's first jobs about 20 ms).
///
/// # Errors
/// As [`db::connect_pool`]; the database's error when a lane's session cannot be opened.
pub(crate) async fn connect_commit_pool(
    cfg: &DatabaseConfig,
    alive: Option<&str>,
) -> Result<CommitPool, Error> {
    let sessions = CommitSessions {
        connections: db::Manager::new(db::Connector::for_role(cfg, "worker")?),
        alive: alive.map(str::to_owned),
        prepare: cfg.pooler.keeps_sessions(),
    };
    let pool = db::build_pool_of(sessions, cfg, COMMIT_POOL_SIZE).await?;
    db::open_sessions(&pool, super::COMMIT_LANES as u32)
        .await
        .map_err(|e| db::connect_error(cfg, e))?;
    Ok(pool)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_db::TestDb;

    /// How many times the statement `sql` prepared on `client`'s session was planned, if it is
    /// prepared there.
    async fn plans_of(client: &Client, sql: &str) -> Option<i64> {
        client
            .query_opt(
                "SELECT generic_plans + custom_plans FROM pg_prepared_statements
                  WHERE statement = $1 AND NOT from_sql",
                &[&sql],
            )
            .await
            .unwrap()
            .map(|r| r.get(0))
    }

    #[tokio::test]
    async fn a_commit_session_holds_both_success_statements_prepared_and_runs_them_by_name() {
        let db = TestDb::migrated().await;
        let pool = connect_commit_pool(&db.config, None).await.unwrap();
        let session = pool.get().await.unwrap();
        assert_eq!(
            plans_of(&session.client, completer::SUCCEED_LOCKED_SQL).await,
            Some(0)
        );
        assert_eq!(
            plans_of(&session.client, completer::SUCCEED_SQL).await,
            Some(0)
        );
        // An empty group through the prepared statement: run (and so planned) on this session,
        // never sent as text.
        let fenced = completer::succeed_many_with(&session.client, session.succeed.as_ref(), &[])
            .await
            .unwrap();
        assert!(fenced.is_empty());
        assert_eq!(
            plans_of(&session.client, completer::SUCCEED_SQL).await,
            Some(1)
        );
        assert!(!db::Session::is_closed(&*session));
    }

    /// Both lanes' sessions are open (and counted by the server) before the pool is handed
    /// over, so a lane's first batch never opens a connection; the third session, for reading
    /// a lost batch's outcome, opens only when needed.
    #[tokio::test]
    async fn a_commit_pool_opens_one_session_per_lane_from_the_start() {
        let db = TestDb::migrated().await;
        let pool = connect_commit_pool(&db.config, None).await.unwrap();
        assert_eq!(pool.state().connections, super::super::COMMIT_LANES as u32);
        assert_eq!(
            pool.state().idle_connections,
            super::super::COMMIT_LANES as u32
        );
        let backends: i64 = db
            .client()
            .await
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(backends, i64::from(super::super::COMMIT_LANES as u32));
        // A pool already at the count opens nothing more.
        db::open_sessions(&pool, 1).await.unwrap();
        assert_eq!(pool.state().connections, super::super::COMMIT_LANES as u32);
    }

    #[tokio::test]
    async fn behind_a_transaction_pooler_a_commit_session_prepares_nothing_and_sends_them_unnamed()
    {
        let db = TestDb::migrated().await;
        let pooled = DatabaseConfig {
            pooler: crate::config::Pooler::Transaction,
            ..db.config.clone()
        };
        let pool = connect_commit_pool(&pooled, None).await.unwrap();
        let session = pool.get().await.unwrap();
        assert!(session.succeed.is_none() && session.succeed_locked.is_none());
        let fenced = completer::succeed_many_with(&session.client, session.succeed.as_ref(), &[])
            .await
            .unwrap();
        assert!(fenced.is_empty());
        assert_eq!(crate::test_db::named_statements(&session.client).await, 0);
    }

    /// The plans of each prepared success statement, generic (what a commit session runs after
    /// a few batches) and custom, for a batch of 200 jobs on an analyzed live table of 20,000
    /// running jobs: the live rows are found through the primary key, never by scanning or
    /// hashing the table (joined with the pairs, the custom plan hashed the whole table).
    #[tokio::test]
    async fn the_plans_of_the_success_statements_probe_the_primary_key() {
        let db = TestDb::migrated().await;
        let pool = connect_commit_pool(&db.config, None).await.unwrap();
        let session = pool.get().await.unwrap();
        let pairs = session
            .client
            .query_one(
                "WITH live AS (
                     INSERT INTO etl_job_records
                         (id, owner_key, kind, request_payload, status, attempts, lease_owner_id,
                          lease_claim_id, lease_expires_at, lease_renewed_at)
                     SELECT gen_random_uuid(), sha256('o'::bytea), 'noop', '{}', 'running', 1,
                            'o', gen_random_uuid(), now() + interval '1 hour', now()
                       FROM generate_series(1, 20000)
                     RETURNING id, lease_claim_id
                 ), batch AS (SELECT * FROM live LIMIT 200)
                 SELECT array_agg(id)::text, array_agg(lease_claim_id)::text FROM batch",
                &[],
            )
            .await
            .unwrap();
        let (ids, claims): (String, String) = (pairs.get(0), pairs.get(1));
        session
            .client
            .batch_execute("ANALYZE etl_job_records")
            .await
            .unwrap();
        for mode in ["force_generic_plan", "force_custom_plan"] {
            session
                .client
                .batch_execute(&format!("SET plan_cache_mode = {mode}"))
                .await
                .unwrap();
            for sql in [completer::SUCCEED_SQL, completer::SUCCEED_LOCKED_SQL] {
                let name: String = session
                    .client
                    .query_one(crate::db::PREPARED_NAME_SQL, &[&sql])
                    .await
                    .unwrap()
                    .get(0);
                let plan: serde_json::Value = session
                    .client
                    .query_one(
                        &format!(
                            "EXPLAIN (FORMAT JSON) EXECUTE {name}('{ids}', '{claims}',
                                 array_fill('{{}}'::jsonb, ARRAY[200]))"
                        ),
                        &[],
                    )
                    .await
                    .unwrap()
                    .get(0);
                let text = plan.to_string();
                assert!(text.contains("etl_job_records_pkey"), "{mode}: {text}");
                assert!(!text.contains("\"Seq Scan\""), "{mode}: {text}");
            }
        }
    }
}
