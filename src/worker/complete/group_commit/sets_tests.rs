//! Sets of effects in a batch, driven directly (as `group_commit::tests`): a set applies its
//! jobs together under one savepoint, and every way it can fail leaves its jobs to apply alone.

use super::super::tests::{ready, Scratch, SUCCEEDED};
use super::super::Ready;
use super::*;
use crate::job::handler::{JobError, Output};
use futures::future::BoxFuture;
use uuid::Uuid;

/// How a [`Row`]'s set behaves.
#[derive(Clone, Copy)]
enum Mode {
    /// No set: the row applies alone.
    Alone,
    /// A set that applies ([`SetOf`]).
    Together,
    /// A set that fails.
    Failing,
    /// A set that panics.
    Panicking,
    /// A set that returns a ledger too few.
    Short,
    /// A set that overruns.
    Slow,
    /// `Effects::set` itself panics.
    SetPanics,
}

/// Effects that insert one target row (plain `INSERT`: a key written twice fails), alone with
/// a ledger of one row inserted, or as a set (see [`Mode`]).
struct Row {
    /// The job.
    job: Uuid,
    /// Its row's key.
    key: String,
    /// Its set.
    mode: Mode,
}

/// Inserts target rows `keys` written by `jobs`, stamped with the transaction's id.
const INSERT_ROWS: &str =
    "INSERT INTO etl_target_rows (owner_key, dataset, record_key, record, written_by_job)
     SELECT decode(repeat('ab', 32), 'hex'), 'd', k,
            jsonb_build_object('xact', pg_current_xact_id()::text), j
       FROM unnest($1::text[], $2::uuid[]) AS u(k, j)";

/// [`INSERT_ROWS`] for a set: a key written twice is written once (so a set whose own
/// statement succeeds can fail in the ways each test scripts).
const INSERT_SET_ROWS: &str = "
INSERT INTO etl_target_rows (owner_key, dataset, record_key, record, written_by_job)
SELECT decode(repeat('ab', 32), 'hex'), 'd', k,
       jsonb_build_object('xact', pg_current_xact_id()::text), j
  FROM unnest($1::text[], $2::uuid[]) AS u(k, j)
    ON CONFLICT DO NOTHING";

impl Effects for Row {
    fn apply<'a>(
        self: Box<Self>,
        tx: &'a Transaction<'a>,
    ) -> BoxFuture<'a, Result<Option<Output>, JobError>> {
        Box::pin(async move {
            tx.execute(INSERT_ROWS, &[&vec![self.key.clone()], &vec![self.job]])
                .await?;
            Ok(Some(serde_json::json!({ "rows_inserted": 1 })))
        })
    }

    fn set(&self) -> Option<&'static dyn EffectsSet> {
        match self.mode {
            Mode::Alone => None,
            Mode::Together => Some(&SetOf(Mode::Together)),
            Mode::Failing => Some(&SetOf(Mode::Failing)),
            Mode::Panicking => Some(&SetOf(Mode::Panicking)),
            Mode::Short => Some(&SetOf(Mode::Short)),
            Mode::Slow => Some(&SetOf(Mode::Slow)),
            Mode::SetPanics => panic!("scripted panic in set"),
        }
    }
}

/// Inserts every member's row in one statement; each ledger says one row updated (so a test
/// tells a set's ledger from a job's alone).
async fn insert_all(
    tx: &Transaction<'_>,
    members: &mut [Box<dyn Effects>],
) -> Result<Vec<Option<Output>>, JobError> {
    let (keys, jobs): (Vec<String>, Vec<Uuid>) = members
        .iter()
        .filter_map(|m| m.downcast_ref::<Row>())
        .map(|r| (r.key.clone(), r.job))
        .unzip();
    tx.execute(INSERT_SET_ROWS, &[&keys, &jobs]).await?;
    let ledger = serde_json::json!({ "rows_updated": 1 });
    Ok(vec![Some(ledger); keys.len()])
}

/// A set that behaves as its mode says: inserts every member's row in one statement
/// (`Together`), and then fails (`Failing`), returns one ledger too few (`Short`) or sleeps on
/// the server past any budget (`Slow`); or panics (`Panicking`).
struct SetOf(Mode);

impl EffectsSet for SetOf {
    fn apply<'a>(
        &'a self,
        tx: &'a Transaction<'a>,
        members: &'a mut [Box<dyn Effects>],
    ) -> BoxFuture<'a, Result<Vec<Option<Output>>, JobError>> {
        if let Mode::Panicking = self.0 {
            panic!("scripted panic in a set");
        }
        Box::pin(async move {
            let mut ledgers = insert_all(tx, members).await?;
            match self.0 {
                Mode::Failing => {
                    return Err(JobError::permanent(crate::codes::Code::HandlerFailed))
                }
                Mode::Short => drop(ledgers.pop()),
                Mode::Slow => drop(tx.execute("SELECT pg_sleep(30)", &[]).await?),
                _ => {}
            }
            Ok(ledgers)
        })
    }
}

/// The batch of `jobs`, each writing the key of its place (`k0`, `k1`, …) in its mode, except
/// where `keys` names another; a budget of a minute, or 100 ms for a slow set.
fn batch(jobs: &[(Uuid, Uuid)], modes: &[Mode], keys: &[(usize, &str)]) -> Vec<Ready> {
    jobs.iter()
        .zip(modes)
        .enumerate()
        .map(|(i, (&pair, &mode))| {
            let key = keys
                .iter()
                .find(|(at, _)| *at == i)
                .map_or_else(|| format!("k{i}"), |(_, key)| (*key).to_owned());
            let budget = match mode {
                Mode::Slow => Duration::from_millis(100),
                _ => Duration::from_secs(60),
            };
            let effects = Row {
                job: pair.0,
                key,
                mode,
            };
            ready(pair, Box::new(effects), budget)
        })
        .collect()
}

/// The ledgers of the succeeded jobs `jobs`, in order: `set` for a set's ledger (one row
/// updated), `alone` for a job's own (one row inserted), `-` for none.
async fn ledgers(db: &Scratch, jobs: &[(Uuid, Uuid)]) -> Vec<&'static str> {
    let mut out = Vec::new();
    for &(job, _) in jobs {
        let row = db
            .client
            .query_opt(
                "SELECT (output ->> 'rows_updated')::int FROM etl_job_outcomes
                  WHERE job_id = $1 AND status = 'succeeded'",
                &[&job],
            )
            .await
            .unwrap();
        out.push(match row.map(|r| r.get::<_, Option<i32>>(0)) {
            Some(Some(1)) => "set",
            Some(_) => "alone",
            None => "-",
        });
    }
    out
}

#[tokio::test]
async fn jobs_of_one_type_with_a_set_apply_together_and_the_others_alone() {
    let (db, jobs) = Scratch::with_claimed(6).await;
    let modes = [
        Mode::Together,
        Mode::Alone,
        Mode::Together,
        Mode::SetPanics,
        Mode::Together,
        Mode::Alone,
    ];
    // Job 4's lease went to another claim: fenced out before any set applies.
    db.steal_lease(jobs[4].0).await;
    let outcomes = db.commit(batch(&jobs, &modes, &[])).await;
    assert_eq!(
        outcomes,
        [
            "Succeeded",
            "Succeeded",
            "Succeeded",
            "Succeeded",
            "lease lost",
            "Succeeded"
        ]
    );
    assert_eq!(
        ledgers(&db, &jobs).await,
        ["set", "alone", "set", "alone", "-", "alone"]
    );
    assert_eq!(db.target_keys().await, ["k0", "k1", "k2", "k3", "k5"]);
    assert_eq!(db.rows_per_transaction().await, [5]);
}

#[tokio::test]
async fn a_lone_job_with_a_set_applies_alone() {
    let (db, jobs) = Scratch::with_claimed(2).await;
    let outcomes = db
        .commit(batch(&jobs, &[Mode::Together, Mode::Alone], &[]))
        .await;
    assert_eq!(outcomes, ["Succeeded", "Succeeded"]);
    assert_eq!(ledgers(&db, &jobs).await, ["alone", "alone"]);
}

#[tokio::test]
async fn a_set_that_fails_in_any_way_is_rolled_back_and_its_jobs_apply_alone() {
    for mode in [Mode::Failing, Mode::Panicking, Mode::Short, Mode::Slow] {
        let (db, jobs) = Scratch::with_claimed(4).await;
        // Jobs 1 and 3 write the same key: alone, the later one fails on its own.
        let batch = batch(&jobs, &[mode; 4], &[(1, "same"), (3, "same")]);
        let outcomes = db.commit(batch).await;
        assert_eq!(outcomes[..3], ["Succeeded", "Succeeded", "Succeeded"]);
        assert_eq!(outcomes[3], "job error: database error in effects");
        assert_eq!(ledgers(&db, &jobs).await, ["alone", "alone", "alone", "-"]);
        // Nothing the set wrote stayed (else "same" and "k0" would be there twice, or fail).
        assert_eq!(db.target_keys().await, ["k0", "k2", "same"]);
        assert_eq!(db.count(SUCCEEDED).await, 3);
    }
}

#[tokio::test]
async fn a_batch_of_sets_keeps_the_subtransaction_bound() {
    let (db, jobs) = Scratch::with_claimed(130).await;
    let outcomes = db.commit(batch(&jobs, &[Mode::Together; 130], &[])).await;
    assert!(outcomes.iter().all(|o| o == "Succeeded"), "{outcomes:?}");
    // Transactions of at most 64 jobs, as alone: one set (one savepoint) in each.
    assert_eq!(db.rows_per_transaction().await, [64, 64, 2]);
    assert_eq!(
        ledgers(&db, &jobs).await,
        vec!["set"; 130],
        "every part of two or more applies as a set"
    );
}

#[tokio::test]
async fn a_batch_of_sets_whose_leases_are_all_stale_commits_nothing() {
    let (db, jobs) = Scratch::with_claimed(3).await;
    for &(job, _) in &jobs {
        db.steal_lease(job).await;
    }
    let outcomes = db.commit(batch(&jobs, &[Mode::Together; 3], &[])).await;
    assert_eq!(outcomes, ["lease lost", "lease lost", "lease lost"]);
    assert!(db.target_keys().await.is_empty());
    assert_eq!(db.count(SUCCEEDED).await, 0);
}

#[tokio::test]
async fn a_rolled_back_savepoint_is_released_so_the_next_does_not_nest_in_it() {
    let (db, _) = Scratch::with_claimed(1).await;
    let mut client = crate::db::connect(&db.db.config, "test").await.unwrap();
    let mut tx = client.transaction().await.unwrap();
    let savepoint = tx.savepoint(SET_SAVEPOINT).await.unwrap();
    savepoint
        .batch_execute("SELECT pg_current_xact_id()")
        .await
        .unwrap();
    let stats = WorkerStats::default();
    roll_back(savepoint, SET_SAVEPOINT, &stats).await.unwrap();
    // Released: there is no savepoint left to roll back to.
    let gone = tx
        .batch_execute(&format!("ROLLBACK TO SAVEPOINT {SET_SAVEPOINT}"))
        .await
        .unwrap_err();
    assert_eq!(gone.code().map(|c| c.code()), Some("3B001"));
}
