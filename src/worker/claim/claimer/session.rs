//! A replica's claim sessions: connections whose planner switches pin the claim's plan, with
//! the claim prepared on each once its plan passed its check (see the parent module's
//! invariants). Behind a transaction-mode pooler nothing is prepared and nothing is set on the
//! session: each claim (and next-due read) runs in a transaction of its own that sets the planner
//! switches `LOCAL` first, all of it pipelined in one round trip.

use super::capped::CappedQueues;
use super::next_due::{next_due, until_due, NEXT_DUE_PARAMS, NEXT_DUE_SQL};
use super::plan_check::{
    explain_planned, explain_prepared, in_planner_transaction, judged_failure,
    walks_the_pending_index_in_order, RECHECK_AFTER,
};
use super::rows::{claimed, refused, Claim};
use super::statement::{
    claim_uncapped, Ask, ClaimValues, Claimant, CLAIM_PARAMS, CLAIM_SQL, CLAIM_UNCAPPED_SQL,
};
use crate::config::{DatabaseConfig, Pooler};
use crate::db;
use crate::error::Error;
use crate::worker::liveness::presence;
use crate::worker::stats::WorkerStats;
use bb8::ManageConnection;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::{Client, Statement};

/// The statements a claim session prepared, the claim's plan having passed its check.
struct Prepared {
    /// [`CLAIM_SQL`].
    claim: Statement,
    /// [`CLAIM_UNCAPPED_SQL`].
    uncapped: Statement,
    /// [`NEXT_DUE_SQL`].
    next_due: Statement,
}

/// A replica's claim session: a connection of its claim pool ([`super::claim_pg_config`]: planner
/// switches pinned) with the claim and next-due statements prepared on it, unless the claim's
/// plan failed its check.
pub struct ClaimSession {
    /// The connection.
    pub(super) client: Client,
    /// Its prepared statements; `None` after a failed plan check.
    prepared: Option<Prepared>,
    /// The presence statements pipelined before claims, prepared whatever the check found (they
    /// read and write only the waiting table, by primary key).
    presence: presence::Statements,
    /// When a session whose check could not be judged yet (the live table was too small for
    /// any plan to matter) is due to be replaced, so that a fresh session checks again.
    recheck_at: Option<Instant>,
    /// Whether the session is a transaction-mode pooler's ([`Pooler::Transaction`]): each claim
    /// then sets the planner switches in a transaction of its own ([`ClaimSession::planned`]).
    pooled: bool,
}

impl ClaimSession {
    /// Prepares the statements on `client` and checks the plans of both claims (with and without
    /// permits): each must walk `etl_job_records_claim_idx` in order, with no sort below its row
    /// locks and no scan or join of the whole table.
    /// If it does not, the session plans each claim for its values instead (`plan_cache_mode =
    /// force_custom_plan`); and if the live table is large enough for the check to be judged
    /// ([`JUDGED_FROM_PAGES`]), the failure is logged and `stats` counts a fallback, else the
    /// session is only due for a recheck after [`RECHECK_AFTER`] (an empty queue is no alarm).
    ///
    /// # Errors
    /// The database error of a statement.
    pub async fn open(
        client: Client,
        stats: &WorkerStats,
        pooler: Pooler,
    ) -> Result<ClaimSession, tokio_postgres::Error> {
        if !pooler.keeps_sessions() {
            return ClaimSession::open_pooled(client, stats).await;
        }
        // A pooler in session mode drops the start-up options that carry them.
        client
            .batch_execute(&super::planner::claim_planner_statements("", ""))
            .await?;
        let presence = presence::Statements::prepare(&client).await?;
        let claim = client.prepare_typed(CLAIM_SQL, &CLAIM_PARAMS).await?;
        let uncapped = client
            .prepare_typed(CLAIM_UNCAPPED_SQL, &CLAIM_PARAMS)
            .await?;
        let with_permits = explain_prepared(&client, CLAIM_SQL).await?;
        let without = explain_prepared(&client, CLAIM_UNCAPPED_SQL).await?;
        if walks_the_pending_index_in_order(&with_permits)
            && walks_the_pending_index_in_order(&without)
        {
            let next_due = client.prepare_typed(NEXT_DUE_SQL, &NEXT_DUE_PARAMS).await?;
            let prepared = Some(Prepared {
                claim,
                uncapped,
                next_due,
            });
            return Ok(ClaimSession {
                client,
                prepared,
                presence,
                recheck_at: None,
                pooled: false,
            });
        }
        let recheck_at = if judged_failure(&client, stats).await? {
            None
        } else {
            Some(Instant::now() + RECHECK_AFTER)
        };
        client
            .batch_execute("SET plan_cache_mode = force_custom_plan")
            .await?;
        Ok(ClaimSession {
            client,
            prepared: None,
            presence,
            recheck_at,
            pooled: false,
        })
    }

    /// [`ClaimSession::open`] behind a transaction-mode pooler: nothing prepared, nothing set on
    /// the session; both claims' plans for sample values are checked (the switches set `LOCAL`
    /// in the check's own transaction, as each claim will), and a failure the table is large
    /// enough to judge is logged and counted. Each claim is planned for its values anyway.
    ///
    /// # Errors
    /// The database error of a statement.
    async fn open_pooled(
        client: Client,
        stats: &WorkerStats,
    ) -> Result<ClaimSession, tokio_postgres::Error> {
        let with_permits = explain_planned(&client, CLAIM_SQL).await?;
        let without = explain_planned(&client, CLAIM_UNCAPPED_SQL).await?;
        if !(walks_the_pending_index_in_order(&with_permits)
            && walks_the_pending_index_in_order(&without))
        {
            judged_failure(&client, stats).await?;
        }
        Ok(ClaimSession {
            client,
            prepared: None,
            presence: presence::Statements::unnamed(),
            recheck_at: None,
            pooled: true,
        })
    }

    /// Runs `statement` (one statement sent on its first poll, on this session's client) with
    /// the claim's planner switches: as it is on a session that set them, else pipelined between
    /// [`begin_with_planner_switches`] and `COMMIT` (a failed statement's transaction is rolled
    /// back by that `COMMIT`).
    ///
    /// # Errors
    /// The database error of the statement, or of the transaction around it.
    async fn planned<T>(
        &self,
        statement: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, tokio_postgres::Error> {
        in_planner_transaction(&self.client, self.pooled, statement).await
    }

    /// The session's connection, to pipeline other statements before a claim.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// The presence statements prepared on the session.
    pub(crate) fn presence(&self) -> &presence::Statements {
        &self.presence
    }

    /// Whether the claim runs prepared (its plan passed the check).
    pub fn is_prepared(&self) -> bool {
        self.prepared.is_some()
    }

    /// Whether the session's plan check could not be judged (the queue was nearly empty) and
    /// it is due, at `now`, to be replaced by a session that checks again.
    pub(crate) fn due_for_recheck(&self, now: Instant) -> bool {
        self.recheck_at.is_some_and(|at| now >= at)
    }

    /// Claims `asks` for `claimant` on this session, prepared when it can be: with
    /// [`CLAIM_SQL`] if a queue of `asks` is known to be `capped`, else with
    /// [`CLAIM_UNCAPPED_SQL`] and then, for the asks it refused (their queues, now known to be
    /// capped), with [`CLAIM_SQL`]. Each job's [`ClaimedJob::asked_of`], and each ask of
    /// [`Claim::left_free`], is its position in `asks`; [`Claim::capped`] is empty.
    ///
    /// # Errors
    /// The database error of a claim statement.
    pub async fn claim(
        &self,
        claimant: Claimant<'_>,
        asks: &[Ask<'_>],
        capped: &CappedQueues,
    ) -> Result<Claim, tokio_postgres::Error> {
        if capped.any_of(asks) {
            return self.claim_with_permits(claimant, asks).await;
        }
        let Claim {
            mut jobs,
            capped: refused,
            ..
        } = self.claim_without_permits(claimant, asks).await?;
        let mut left_free = Vec::new();
        if !refused.is_empty() {
            let again: Vec<Ask<'_>> = refused
                .iter()
                .filter_map(|&i| asks.get(i).copied())
                .collect();
            capped.learn(again.iter().map(|&(queue, _)| queue));
            let of = |i: usize| refused.get(i).copied().unwrap_or(i);
            let permitted = self.claim_with_permits(claimant, &again).await?;
            for mut job in permitted.jobs {
                job.asked_of = of(job.asked_of);
                jobs.push(job);
            }
            left_free = permitted
                .left_free
                .into_iter()
                .map(|(i, left)| (of(i), left))
                .collect();
        }
        Ok(Claim {
            jobs,
            capped: Vec::new(),
            left_free,
        })
    }

    /// [`CLAIM_SQL`] on this session, prepared when it can be.
    async fn claim_with_permits(
        &self,
        claimant: Claimant<'_>,
        asks: &[Ask<'_>],
    ) -> Result<Claim, tokio_postgres::Error> {
        let values = ClaimValues::of(claimant, asks);
        let rows = match &self.prepared {
            Some(prepared) => self.client.query(&prepared.claim, &values.params()).await?,
            None => {
                let typed: Vec<_> = values.params().into_iter().zip(CLAIM_PARAMS).collect();
                self.planned(self.client.query_typed(CLAIM_SQL, &typed))
                    .await?
            }
        };
        Ok(claimed(rows, asks))
    }

    /// [`claim_uncapped`] on this session, prepared when it can be.
    async fn claim_without_permits(
        &self,
        claimant: Claimant<'_>,
        asks: &[Ask<'_>],
    ) -> Result<Claim, tokio_postgres::Error> {
        let Some(prepared) = &self.prepared else {
            return self
                .planned(claim_uncapped(&self.client, claimant, asks))
                .await;
        };
        let values = ClaimValues::of(claimant, asks);
        let rows = self
            .client
            .query(&prepared.uncapped, &values.params())
            .await?;
        Ok(refused(rows, asks))
    }

    /// [`next_due`] on this session, prepared when it can be.
    ///
    /// # Errors
    /// The database error of the query.
    pub async fn next_due(
        &self,
        queues: &[&str],
        kinds: &[&str],
    ) -> Result<Option<Duration>, tokio_postgres::Error> {
        match &self.prepared {
            Some(prepared) => Ok(until_due(
                &self
                    .client
                    .query_one(&prepared.next_due, &[&queues, &kinds])
                    .await?,
            )),
            None => self.planned(next_due(&self.client, queues, kinds)).await,
        }
    }
}

impl db::Session for ClaimSession {
    fn is_closed(&self) -> bool {
        self.client.is_closed()
    }
}

/// Opens a replica's claim sessions ([`ClaimSession`]) for `bb8`, each holding its owner's alive
/// lock when the replica holds them.
pub struct ClaimSessions {
    /// Opens the connections.
    pub(super) connections: db::Manager,
    /// Where plan-check fallbacks are counted.
    pub(super) stats: Arc<WorkerStats>,
    /// The owner whose alive lock each session holds (`None`: a replica without alive locks).
    pub(super) alive: Option<String>,
    /// The pooler the sessions connect through.
    pub(super) pooler: Pooler,
}

impl ManageConnection for ClaimSessions {
    type Connection = ClaimSession;
    type Error = tokio_postgres::Error;

    async fn connect(&self) -> Result<ClaimSession, tokio_postgres::Error> {
        let client = self.connections.connect().await?;
        crate::worker::liveness::alive::hold(&client, self.alive.as_deref()).await?;
        ClaimSession::open(client, &self.stats, self.pooler).await
    }

    async fn is_valid(&self, session: &mut ClaimSession) -> Result<(), tokio_postgres::Error> {
        self.connections.is_valid(&mut session.client).await
    }

    fn has_broken(&self, session: &mut ClaimSession) -> bool {
        session.client.is_closed() || session.due_for_recheck(Instant::now())
    }
}

/// The claim sessions of a replica.
pub type ClaimPool = bb8::Pool<ClaimSessions>;

/// Opens a replica's claim pool ([`super::claim_pg_config`], [`super::CLAIM_POOL_SIZE`] sessions,
/// each holding `alive`'s alive lock when given), proving the database answers; plan-check
/// fallbacks are counted in `stats`.
///
/// # Errors
/// As [`db::connect_pool`].
pub async fn connect_claim_pool(
    cfg: &DatabaseConfig,
    stats: Arc<WorkerStats>,
    alive: Option<&str>,
) -> Result<ClaimPool, Error> {
    let sessions = ClaimSessions {
        connections: db::Manager::new(db::Connector::new(cfg, super::claim_pg_config(cfg)?)?),
        stats,
        alive: alive.map(str::to_owned),
        pooler: cfg.pooler,
    };
    db::build_pool_of(sessions, cfg, super::CLAIM_POOL_SIZE).await
}
