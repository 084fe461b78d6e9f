//! Unit tests of the handler contract: errors, kind names and codes, which effects skip the
//! execution transaction, and the `noop` kind.

use super::*;

#[test]
fn permanent_errors_carry_only_stored_codes() {
    match JobError::permanent(Code::LeaseLost) {
        JobError::Permanent { code, .. } => assert_eq!(code, Code::HandlerFailed),
        other => panic!("unexpected {other:?}"),
    }
    match JobError::record_invalid(7) {
        JobError::Permanent {
            code, record_index, ..
        } => {
            assert_eq!(code, Code::RecordInvalid);
            assert_eq!(record_index, Some(7));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(
        JobError::transient("busy"),
        JobError::Transient(_)
    ));
}

#[test]
fn a_kind_name_is_what_the_schema_stores() {
    for name in [
        "etl.load",
        "noop",
        "welcome_email",
        "a.b_2",
        &"k".repeat(63),
    ] {
        assert!(is_kind_name(name), "{name}");
    }
    for name in [
        "",
        "WelcomeEmail",
        "2fa",
        ".hidden",
        "with space",
        &"k".repeat(64),
    ] {
        assert!(!is_kind_name(name), "{name}");
    }
}

#[test]
fn a_kind_code_is_a_lower_case_identifier_that_is_no_code_of_the_crate() {
    for code in ["address_bounced", "a", "quota_2", &"x".repeat(63)] {
        assert!(is_kind_code(code), "{code}");
    }
    for code in [
        "",
        "Bounced",
        "2fast",
        "_private",
        "address bounced",
        "address-bounced",
        // A kind's name may have a `.`; a kind's code may not.
        "address.bounced",
        "ünïcode",
        &"x".repeat(64),
        "handler_failed",
        "cancelled",
    ] {
        assert!(!is_kind_code(code), "{code}");
    }
}

/// Effects of a kind's own that write nothing (they only pass [`NoEffects`] on) yet are not
/// `NoEffects` themselves.
struct Wrapped(NoEffects);

impl Effects for Wrapped {
    fn apply<'a>(
        self: Box<Self>,
        tx: &'a Transaction<'a>,
    ) -> BoxFuture<'a, Result<Option<Output>, JobError>> {
        Box::new(self.0).apply(tx)
    }
}

/// A typed kind, run by [`Marker`].
#[derive(serde::Serialize, serde::Deserialize)]
struct Mark {}

impl crate::Job for Mark {
    const KIND: &'static str = "test.mark";
}

/// Typed effects that would write.
#[derive(Default)]
struct Marked;

impl crate::Apply for Marked {
    async fn apply(self, _tx: &Transaction<'_>, _job: &JobContext) -> Result<(), JobError> {
        Ok(())
    }
}

/// Runs [`Mark`] jobs with effects `A`.
struct Marker<A>(std::marker::PhantomData<fn() -> A>);

impl<A: crate::Apply + Default> crate::Perform for Marker<A> {
    type Job = Mark;
    type Effects = A;

    async fn compute(&self, _job: Mark, _ctx: &JobContext) -> Result<A, JobError> {
        Ok(A::default())
    }
}

#[tokio::test]
async fn only_effects_that_cannot_write_skip_the_transaction() {
    // Untyped: no implementation but `NoEffects` skips it, whatever its `apply` does.
    assert!(!(Box::new(NoEffects) as Box<dyn Effects>).writes());
    assert!((Box::new(Wrapped(NoEffects)) as Box<dyn Effects>).writes());
    // Typed: only `type Effects = ()` skips it; any other type's `apply` runs.
    let ctx = ctx();
    for (registry, writes) in [
        (
            Registry::new().perform(Marker::<Marked>(Default::default())),
            true,
        ),
        (
            Registry::new().perform(Marker::<()>(Default::default())),
            false,
        ),
    ] {
        let handler = registry.get("test.mark").unwrap();
        let effects = handler.prepare(&ctx, serde_json::json!({})).await.unwrap();
        assert_eq!(effects.writes(), writes);
    }
}

#[tokio::test]
async fn typed_effects_share_the_jobs_context_instead_of_copying_it() {
    let ctx = ctx();
    let registry = Registry::new().perform(Marker::<Marked>(Default::default()));
    let handler = registry.get("test.mark").unwrap();
    let effects = handler.prepare(&ctx, serde_json::json!({})).await.unwrap();
    assert_eq!(
        Arc::strong_count(&ctx),
        2,
        "the effects hold the job's context"
    );
    drop(effects);
    assert_eq!(Arc::strong_count(&ctx), 1);
}

/// A job context for the tests, shared as the worker shares it.
fn ctx() -> Arc<JobContext> {
    Arc::new(JobContext {
        id: Uuid::nil(),
        kind: NOOP_KIND.to_owned(),
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

#[tokio::test(start_paused = true)]
async fn a_noop_job_pauses_as_its_payload_asks_within_the_bound() {
    let ctx = ctx();
    for (payload, pause) in [
        (serde_json::json!({}), Duration::ZERO),
        (
            serde_json::json!({"pause_ms": 250}),
            Duration::from_millis(250),
        ),
        (serde_json::json!({"pause_ms": "soon"}), Duration::ZERO),
        (serde_json::json!({"pause_ms": u64::MAX}), NOOP_PAUSE_MAX),
    ] {
        let started = tokio::time::Instant::now();
        let effects = Noop.prepare(&ctx, payload).await.unwrap();
        assert_eq!(started.elapsed(), pause);
        assert!(!effects.writes());
    }
}

#[tokio::test(start_paused = true)]
async fn a_noop_job_asked_to_fail_fails_permanently_with_a_source_and_a_detail() {
    let ctx = ctx();
    let error = match Noop
        .prepare(&ctx, serde_json::json!({"fail": true, "pause_ms": 10}))
        .await
    {
        Err(error) => error,
        Ok(_) => panic!("a noop job asked to fail succeeded"),
    };
    assert!(matches!(
        error,
        JobError::Permanent {
            code: Code::HandlerFailed,
            ..
        }
    ));
    assert_eq!(error.chain().links.len(), 1, "{:?}", error.chain());
    assert_eq!(error.chain().links[0].type_name, "std::io::error::Error");
    assert_eq!(error.detail(), Some(&Detail::new().field("asked", true)));
    for not_asked in [
        serde_json::json!({"fail": false}),
        serde_json::json!({"fail": "yes"}),
        serde_json::json!({"fail": 1}),
    ] {
        assert!(Noop.prepare(&ctx, not_asked).await.is_ok());
    }
}

#[test]
fn the_crates_errors_convert_with_a_stable_code_and_their_verdict() {
    use crate::error::Error;
    let refused = JobError::from(Error::Config(crate::ConfigError::Priority));
    match refused {
        JobError::Permanent { code, source, .. } => {
            assert_eq!(code, Code::HandlerFailed);
            assert!(source.is_some(), "the error is kept as the source");
        }
        other => panic!("unexpected {other:?}"),
    }
    for transient in [Error::Contended, Error::Unavailable(None)] {
        assert!(matches!(JobError::from(transient), JobError::Transient(_)));
    }
}
