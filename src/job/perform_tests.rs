//! The typed effects as the worker applies them: what a job records, alone and in a set, and
//! every way a set of typed effects refuses to apply.

use super::*;
use crate::test_db::TestDb;
use serde_json::json;
use uuid::Uuid;

/// A job context for the tests, shared as the worker shares it.
fn ctx() -> Arc<JobContext> {
    Arc::new(JobContext {
        id: Uuid::nil(),
        kind: "test.count".to_owned(),
        attempt: 1,
        max_attempts: 1,
        lease_claim_id: Uuid::nil(),
        fencing_token: 1,
        owner_key: vec![0; 32],
        run_at: chrono::Utc::now(),
        lease_lost: crate::job::handler::LeaseLost::default(),
        recorded: Default::default(),
    })
}

/// Effects that record their number, alone or (marked) in a set.
struct Count(i64);

impl Apply for Count {
    async fn apply(self, _tx: &Transaction<'_>, job: &JobContext) -> Result<(), JobError> {
        job.record(json!({ "n": self.0 }))
    }

    fn in_set(&self) -> bool {
        self.0 >= 0
    }

    async fn apply_set<'a>(
        _tx: &'a Transaction<'a>,
        set: Vec<(&'a mut Count, &'a JobContext)>,
    ) -> Result<(), JobError> {
        for (count, job) in set {
            job.record(json!({ "n": count.0, "set": true }))?;
        }
        Ok(())
    }
}

/// Effects that record nothing and join sets without applying any.
struct Silent;

impl Apply for Silent {
    async fn apply(self, _tx: &Transaction<'_>, _job: &JobContext) -> Result<(), JobError> {
        Ok(())
    }

    fn in_set(&self) -> bool {
        true
    }
}

/// `effects` as the worker holds them, for the job of `job`.
fn boxed<A: Apply>(effects: A, job: &Arc<JobContext>) -> Box<dyn Effects> {
    Box::new(TypedEffects {
        effects,
        job: Arc::clone(job),
    })
}

#[tokio::test]
async fn typed_effects_return_what_they_record_alone_and_in_a_set() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let tx = client.transaction().await.unwrap();
    let job = ctx();
    assert_eq!(
        boxed(Count(1), &job).apply(&tx).await.unwrap(),
        Some(json!({ "n": 1 }))
    );
    // What an earlier application recorded is forgotten: effects that record nothing return
    // nothing, even on a context that once held a record.
    job.record(json!("stale")).unwrap();
    assert_eq!(boxed(Silent, &job).apply(&tx).await.unwrap(), None);

    let (a, b) = (ctx(), ctx());
    b.record(json!("stale")).unwrap();
    let mut members = vec![boxed(Count(2), &a), boxed(Count(3), &b)];
    let set = members[0].set().unwrap();
    assert_eq!(
        set.apply(&tx, &mut members).await.unwrap(),
        [
            Some(json!({ "n": 2, "set": true })),
            Some(json!({ "n": 3, "set": true }))
        ]
    );
    // Effects that do not join a set answer none.
    assert!(boxed(Count(-1), &a).set().is_none());
}

#[tokio::test]
async fn a_typed_set_refuses_a_member_of_another_type_and_a_kind_without_a_set() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let tx = client.transaction().await.unwrap();
    let job = ctx();
    let mut mixed = vec![
        boxed(Count(1), &job),
        Box::new(NoEffects) as Box<dyn Effects>,
    ];
    let set = mixed[0].set().unwrap();
    let refused = set.apply(&tx, &mut mixed).await.unwrap_err();
    assert_eq!(refused.to_string(), "permanent failure: handler_failed");
    // A kind that says it joins sets but has no `apply_set`: the default fails, and the worker
    // applies each alone.
    let mut silent = vec![boxed(Silent, &job), boxed(Silent, &job)];
    let set = silent[0].set().unwrap();
    let refused = set.apply(&tx, &mut silent).await.unwrap_err();
    assert_eq!(refused.to_string(), "permanent failure: handler_failed");
}

#[test]
fn an_output_that_is_no_json_document_fails_the_job_for_good() {
    let job = ctx();
    let keyed_by_bytes: std::collections::BTreeMap<Vec<u8>, i32> = [(vec![1], 1)].into();
    let refused = job.record(keyed_by_bytes).unwrap_err();
    assert_eq!(refused.to_string(), "permanent failure: handler_failed");
    assert_eq!(job.recorded.get(), None);
    job.record(json!({ "n": 1 })).unwrap();
    assert_eq!(job.recorded, ctx_with(json!({ "n": 1 })).recorded);
}

/// A context that recorded `output`.
fn ctx_with(output: serde_json::Value) -> Arc<JobContext> {
    let job = ctx();
    job.record(output).unwrap();
    job
}
