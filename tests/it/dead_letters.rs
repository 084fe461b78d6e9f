//! Dead letters and their replay, against a real server: every `failed` ending writes exactly
//! one letter and no other ending does; listings are owner-scoped, filtered and paged; a letter
//! replays into exactly one job however many replays race, repeat or are cut; a body replays
//! only when it is the job's; retained payloads are sealed, pruned on time, and unreadable once
//! their key is rotated or their secret destroyed; no plaintext payload survives a terminal
//! transition, in any table or in the WAL the transition wrote.

use crate::support::{binary, count, eventually, expire_and_recover, first_column, TestDb};
use durable_etl::dead_letters::{
    retention, DeadLetters, LetterFilter, PayloadKey, Retention, REPLAY_CHUNK,
};
use durable_etl::{
    shutdown, Apply, DatabaseConfig, EnqueueOptions, Job, JobContext, JobError, JobState, Jobs,
    Perform, Registry, Secret, Worker, WorkerConfig,
};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tokio_postgres::{Client, Transaction};
use uuid::Uuid;

/// The deployment's secret in these tests.
fn secret() -> Secret {
    Secret::new("dead-letter-secret-0123456789").unwrap()
}

/// The payload key `id` of the tests' secret.
fn key(id: &str) -> PayloadKey {
    PayloadKey::derive(&secret(), id).unwrap()
}

/// A mail to send: it fails as `fail` says, unless the `repaired` table names its `to`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Mail {
    /// The recipient (a canary in the privacy tests).
    to: String,
    /// `ok`, `permanent`, `transient` or `slow` (waits for a row in `released`, then fails).
    fail: String,
}

impl Job for Mail {
    const KIND: &'static str = "test.dl_mail";
    const CODES: &'static [&'static str] = &["mailbox_gone"];
    const MAX_ATTEMPTS: i32 = 2;
    const QUEUE: &'static str = "mail";

    fn retry_delay(_attempt: i32) -> Option<Duration> {
        Some(Duration::from_millis(1))
    }
}

/// Sends mails: records each sent one in `sent`.
struct Mailer {
    /// A client to read `repaired` and `released` with.
    pool: durable_etl::db::Pool,
}

impl Perform for Mailer {
    type Job = Mail;
    type Effects = Sent;

    async fn compute(&self, job: Mail, _ctx: &JobContext) -> Result<Sent, JobError> {
        let conn = self.pool.get().await.map_err(JobError::transient)?;
        let repaired: i64 = conn
            .query_one("SELECT count(*) FROM repaired WHERE who = $1", &[&job.to])
            .await?
            .get(0);
        if repaired > 0 || job.fail == "ok" {
            return Ok(Sent(job.to));
        }
        if job.fail == "slow" {
            while conn
                .query_one("SELECT count(*) FROM released", &[])
                .await?
                .get::<_, i64>(0)
                == 0
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        match job.fail.as_str() {
            "transient" => Err(JobError::transient(std::io::Error::other("smtp busy"))),
            _ => Err(JobError::failed("mailbox_gone")),
        }
    }
}

/// A mail's effect: its row in `sent`.
struct Sent(String);

impl Apply for Sent {
    async fn apply(self, tx: &Transaction<'_>, _job: &JobContext) -> Result<(), JobError> {
        tx.execute("INSERT INTO sent (who) VALUES ($1)", &[&self.0])
            .await?;
        Ok(())
    }
}

/// A kind no replica of these tests runs, for letters made by hand.
#[derive(Debug, Serialize, Deserialize)]
struct Idle {
    /// Anything.
    n: i64,
}

impl Job for Idle {
    const KIND: &'static str = "test.dl_idle";
}

/// A migrated database with the tests' tables.
async fn database() -> (TestDb, Client) {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    tables(&client).await;
    (db, client)
}

/// Creates the tests' tables: mails sent, recipients repaired, slow mails released.
async fn tables(client: &Client) {
    client
        .batch_execute(
            "CREATE TABLE sent (who text NOT NULL);
             CREATE TABLE repaired (who text NOT NULL);
             CREATE TABLE released (at timestamptz NOT NULL DEFAULT now())",
        )
        .await
        .unwrap();
}

/// A worker that runs mails on `db`.
async fn mailer(db: &TestDb, owner_id: &str) -> Worker {
    mailer_on(&db.config, owner_id).await
}

/// A worker that runs mails on the database of `config`.
async fn mailer_on(config: &DatabaseConfig, owner_id: &str) -> Worker {
    let worker = WorkerConfig {
        owner_id: owner_id.into(),
        poll_interval: Duration::from_millis(100),
        queues: durable_etl::queue::parse("default,mail").unwrap(),
        ..WorkerConfig::default()
    };
    let pool = || async { durable_etl::db::connect_pool(config, "test").await.unwrap() };
    let registry = Registry::new().perform(Mailer { pool: pool().await });
    Worker::start(pool().await, config, worker, registry)
        .await
        .unwrap()
}

/// Runs `worker` until no job is live, then stops it.
async fn drain(worker: Worker, client: &Client) {
    let (stop, until) = shutdown::manual();
    let replica = tokio::spawn(worker.run(until));
    eventually("every job to end", || async {
        count(client, "etl_job_records").await == 0
    })
    .await;
    stop.request(shutdown::Stage::Draining);
    replica.await.unwrap().unwrap();
}

/// Enqueues one mail for `jobs`' owner with idempotency key `key`.
async fn mail(client: &Client, jobs: &Jobs, to: &str, fail: &str, key: &str) -> Uuid {
    let options = EnqueueOptions {
        idempotency_key: Some(key),
        ..EnqueueOptions::default()
    };
    let job = Mail {
        to: to.into(),
        fail: fail.into(),
    };
    jobs.enqueue(client, &job, options).await.unwrap().id
}

/// Makes `n` open letters of kind `test.dl_idle` for `owner` by hand (intake rows, failed
/// outcomes and letters), in queue `queue` with code `code`, failed one second apart ending
/// now; returns their ids, oldest first.
async fn letters_by_hand(client: &Client, owner: &[u8; 32], n: i64, queue: &str, code: &str) {
    client
        .execute(
            "WITH made AS (
                 SELECT gen_random_uuid() AS id, now() - (g * interval '1 second') AS at
                   FROM generate_series(1, $2::int8) AS g
             ), intake AS (
                 INSERT INTO etl_job_intake (id, owner_key, idempotency_key_digest,
                        request_fingerprint, kind, max_attempts, run_at, queue)
                 SELECT id, $1::bytea, sha256(id::text::bytea), sha256(id::text::bytea),
                        'test.dl_idle', 5, at, $3::text
                   FROM made RETURNING id
             ), outcome AS (
                 INSERT INTO etl_job_outcomes (job_id, owner_key, status, attempts, run_at,
                        failure_code, finished_at)
                 SELECT id, $1::bytea, 'failed', 5, at, $4::text, at FROM made
             )
             INSERT INTO etl_dead_letters (job_id, owner_key, queue, kind, code, attempts,
                    failed_at)
             SELECT m.id, $1::bytea, $3::text, 'test.dl_idle', $4::text, 5, m.at
               FROM made m JOIN intake i ON i.id = m.id",
            &[&&owner[..], &n, &queue, &code],
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn every_failed_ending_writes_one_letter_and_no_other_ending_does() {
    let (db, client) = database().await;
    let jobs = Jobs::new(secret(), "tenant-a");
    let ok = mail(&client, &jobs, "ok@x", "ok", "k-ok").await;
    let permanent = mail(&client, &jobs, "gone@x", "permanent", "k-perm").await;
    let transient = mail(&client, &jobs, "busy@x", "transient", "k-busy").await;
    let cancelled = mail(&client, &jobs, "never@x", "ok", "k-cancel").await;
    jobs.cancel(&client, cancelled).await.unwrap();
    // A payload its kind cannot decode: `invalid_payload`.
    let invalid = crate::support::insert_jobs(
        &client,
        Mail::KIND,
        &[serde_json::json!({"not": "a mail"})],
        3,
    )
    .await[0];
    drain(mailer(&db, "letters").await, &client).await;

    // A lease that expires on the last attempt: `lease_expired_exhausted`, by recovery.
    let stuck =
        crate::support::insert_jobs(&client, "test.dl_stuck", &[serde_json::json!({})], 1).await[0];
    crate::support::running_under(&client, stuck, "gone").await;
    assert_eq!(expire_and_recover(&client).await, 1);

    let letters: Vec<(Uuid, String, String, String, i32)> = client
        .query(
            "SELECT job_id, queue, kind, code, attempts FROM etl_dead_letters ORDER BY code",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    assert_eq!(
        letters,
        [
            (
                transient,
                "mail".into(),
                Mail::KIND.into(),
                "attempts_exhausted".into(),
                2
            ),
            (
                invalid,
                "default".into(),
                Mail::KIND.into(),
                "invalid_payload".into(),
                1
            ),
            (
                stuck,
                "default".into(),
                "test.dl_stuck".into(),
                "lease_expired_exhausted".into(),
                1
            ),
            (
                permanent,
                "mail".into(),
                Mail::KIND.into(),
                "mailbox_gone".into(),
                1
            ),
        ]
    );
    // One letter per failed outcome, none for the succeeded or the cancelled job.
    let failed: i64 = client
        .query_one(
            "SELECT count(*) FROM etl_job_outcomes WHERE status = 'failed'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(failed, 4);
    for id in [ok, cancelled] {
        assert!(jobs
            .dead_letters()
            .get(&client, id)
            .await
            .unwrap()
            .is_none());
    }
    let letter = jobs
        .dead_letters()
        .get(&client, permanent)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(letter.code, "mailbox_gone");
    assert!(!letter.retained, "nothing is retained by default");
    assert_eq!(count(&client, "etl_retained_payloads").await, 0);
}

#[tokio::test]
async fn listings_are_owner_scoped_filtered_paged_and_counted() {
    let (_db, client) = database().await;
    let (alice, bob) = (Jobs::new(secret(), "alice"), Jobs::new(secret(), "bob"));
    letters_by_hand(&client, &alice.owner_key(), 7, "mail", "mailbox_gone").await;
    letters_by_hand(
        &client,
        &alice.owner_key(),
        3,
        "bills",
        "attempts_exhausted",
    )
    .await;
    letters_by_hand(&client, &bob.owner_key(), 4, "mail", "mailbox_gone").await;
    let all = DeadLetters::all_owners(secret());
    let none = LetterFilter::default();

    // Pages of 4 walk alice's 10 letters newest first, each once.
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = alice
            .dead_letters()
            .list(&client, &none, after, 4)
            .await
            .unwrap();
        assert!(page.letters.len() <= 4);
        seen.extend(page.letters.iter().map(|l| (l.failed_at, l.job_id)));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen.len(), 10);
    assert!(
        seen.windows(2).all(|w| w[0] > w[1]),
        "newest first, no repeats"
    );

    let mail = LetterFilter {
        queue: Some("mail"),
        ..LetterFilter::default()
    };
    let page = |h: DeadLetters, f: LetterFilter<'static>| {
        let client = &client;
        async move { h.list(client, &f, None, 100).await.unwrap().letters.len() }
    };
    assert_eq!(page(alice.dead_letters(), mail).await, 7);
    assert_eq!(page(bob.dead_letters(), none).await, 4);
    assert_eq!(page(all.clone(), mail).await, 11);
    let code = LetterFilter {
        code: Some("attempts_exhausted"),
        ..LetterFilter::default()
    };
    assert_eq!(page(all.clone(), code).await, 3);
    let kind = LetterFilter {
        kind: Some("test.other"),
        ..LetterFilter::default()
    };
    assert_eq!(page(all.clone(), kind).await, 0);
    // A time window: the letters of alice's mail that failed 2 to 4 seconds ago (both ends).
    let now = chrono::Utc::now();
    let window = LetterFilter {
        queue: Some("mail"),
        since: Some(now - chrono::Duration::milliseconds(4500)),
        until: Some(now - chrono::Duration::milliseconds(1500)),
        ..LetterFilter::default()
    };
    assert_eq!(page(alice.dead_letters(), window).await, 3);
    // An operator narrowed to bob sees bob's; an owner cannot widen its own handle.
    assert_eq!(
        page(all.clone().narrowed_to(bob.owner_key()), none).await,
        4
    );
    assert_eq!(
        page(alice.dead_letters().narrowed_to(bob.owner_key()), none).await,
        10
    );

    let counts = all.counts(&client, &none).await.unwrap();
    let counts: Vec<(String, String, i64)> = counts
        .into_iter()
        .map(|c| (c.queue, c.code, c.count))
        .collect();
    assert_eq!(
        counts,
        [
            ("mail".into(), "mailbox_gone".into(), 11),
            ("bills".into(), "attempts_exhausted".into(), 3)
        ]
    );

    // Discards: bob cannot touch alice's letter; alice discards one, then all of her mail.
    let first = alice
        .dead_letters()
        .list(&client, &mail, None, 1)
        .await
        .unwrap()
        .letters[0]
        .job_id;
    assert!(!bob.dead_letters().discard(&client, first).await.unwrap());
    assert!(alice.dead_letters().discard(&client, first).await.unwrap());
    assert!(!alice.dead_letters().discard(&client, first).await.unwrap());
    assert_eq!(
        count(
            &client,
            &format!("etl_job_outcomes WHERE job_id = '{first}'")
        )
        .await,
        1,
        "the job's outcome stays"
    );
    assert_eq!(
        alice
            .dead_letters()
            .discard_matching(&client, &mail)
            .await
            .unwrap(),
        6
    );
    assert_eq!(
        page(all.clone(), none).await,
        7,
        "bob's 4 and alice's bills stay"
    );
}

#[tokio::test]
async fn a_letter_replays_with_its_body_or_its_retained_payload_and_the_job_then_succeeds() {
    let (db, client) = database().await;
    let plain = Jobs::new(secret(), "tenant-r");
    let keeping =
        Jobs::new(secret(), "tenant-r").retaining(Retention::new(key("k1")).queue("mail"));
    let unkept = mail(&client, &plain, "a@x", "permanent", "k-a").await;
    let kept = mail(&client, &keeping, "b@x", "permanent", "k-b").await;
    assert_eq!(count(&client, "etl_retained_payloads").await, 1);
    drain(mailer(&db, "replays").await, &client).await;
    let letters = keeping.dead_letters();

    // Without a body and nothing retained: refused, nothing written.
    let by = "test:replayer";
    let mut conn = db.client().await;
    let refused = letters
        .replay(&mut conn, unkept, by, None)
        .await
        .unwrap_err();
    assert_eq!(refused.code().as_str(), "payload_not_retained");
    // Another body than the job's: refused.
    let wrong = serde_json::json!({"to": "evil@x", "fail": "permanent"});
    let refused = letters
        .replay(&mut conn, unkept, by, Some(&wrong))
        .await
        .unwrap_err();
    assert_eq!(refused.code().as_str(), "replay_body_mismatch");
    assert_eq!(count(&client, "etl_job_records").await, 0);

    // The job's own body, sent again: one new job, linked from the letter.
    client
        .execute("INSERT INTO repaired VALUES ('a@x'), ('b@x')", &[])
        .await
        .unwrap();
    let body = serde_json::json!({"to": "a@x", "fail": "permanent"});
    let again = letters
        .replay(&mut conn, unkept, by, Some(&body))
        .await
        .unwrap();
    assert!(again.made);
    // The retained payload, without a body.
    let retained = letters.replay(&mut conn, kept, by, None).await.unwrap();
    assert!(retained.made);
    // Repeated: the same jobs, none made.
    assert_eq!(
        letters
            .replay(&mut conn, unkept, by, Some(&body))
            .await
            .unwrap(),
        durable_etl::dead_letters::Replayed {
            job_id: again.job_id,
            made: false
        }
    );
    assert!(
        !letters
            .replay(&mut conn, kept, by, None)
            .await
            .unwrap()
            .made
    );
    // The letter's payload went with its replay; the new job keeps its own, under k1.
    let retained_jobs: Vec<Uuid> =
        first_column(&client, "SELECT job_id FROM etl_retained_payloads").await;
    assert_eq!(retained_jobs, [retained.job_id]);
    let letter = letters.get(&client, kept).await.unwrap().unwrap();
    assert_eq!(letter.replayed_job_id, Some(retained.job_id));
    assert!(letter.replayed_at.is_some());
    let replayed_by: Vec<String> = first_column(
        &client,
        "SELECT replayed_by FROM etl_dead_letters WHERE replayed_by IS NOT NULL",
    )
    .await;
    assert_eq!(replayed_by, [by, by]);
    // A replayed letter is no longer open.
    assert!(letters
        .list(&client, &LetterFilter::default(), None, 10)
        .await
        .unwrap()
        .letters
        .is_empty());

    drain(mailer(&db, "replays-2").await, &client).await;
    for id in [again.job_id, retained.job_id] {
        let status = plain.status(&client, id).await.unwrap().unwrap();
        assert_eq!(status.status, JobState::Succeeded);
    }
    let sent: Vec<String> = first_column(&client, "SELECT who FROM sent ORDER BY who").await;
    assert_eq!(sent, ["a@x", "b@x"], "each replay ran once");
    // Another owner cannot replay or see them.
    let other = Jobs::new(secret(), "tenant-x").dead_letters();
    let hidden = other.replay(&mut conn, kept, by, None).await.unwrap_err();
    assert_eq!(hidden.code().as_str(), "not_found");
    // A `by` out of bounds is refused.
    let long = "x".repeat(129);
    let refused = letters
        .replay(&mut conn, kept, &long, None)
        .await
        .unwrap_err();
    assert_eq!(refused.code().as_str(), "request_invalid");
}

#[tokio::test]
async fn racing_replays_of_one_letter_make_one_job() {
    let (db, client) = database().await;
    let jobs = Jobs::new(secret(), "racer").retaining(Retention::new(key("k1")).kind(Mail::KIND));
    let id = mail(&client, &jobs, "race@x", "permanent", "k-race").await;
    drain(mailer(&db, "racers").await, &client).await;
    let mut racers = Vec::new();
    for i in 0..8 {
        let (db_config, letters) = (db.config.clone(), jobs.dead_letters());
        racers.push(tokio::spawn(async move {
            let mut conn = crate::support::connect(&db_config.url.parse().unwrap()).await;
            let by = format!("racer-{i}");
            letters.replay(&mut conn, id, &by, None).await.unwrap()
        }));
    }
    let mut made = 0;
    let mut ids = std::collections::HashSet::new();
    for racer in racers {
        let done = racer.await.unwrap();
        made += usize::from(done.made);
        ids.insert(done.job_id);
    }
    assert_eq!(
        (made, ids.len()),
        (1, 1),
        "one replay made it; all answer its job"
    );
    assert_eq!(count(&client, "etl_job_records").await, 1);
}

/// Ends every live job `failed` (`attempts_exhausted`) by hand, the way the fenced failure
/// does: its outcome and its letter, in one statement.
async fn fail_all_by_hand(client: &Client) {
    client
        .execute(
            &format!(
                "WITH ended AS (DELETE FROM etl_job_records j RETURNING {}),
                 outcome AS ({}) {}",
                "j.id, j.owner_key, j.attempts, j.run_at, j.started_at, j.lease_claim_id",
                "INSERT INTO etl_job_outcomes (job_id, owner_key, status, attempts, run_at,
                        failure_code) SELECT id, owner_key, 'failed', attempts, run_at,
                        'attempts_exhausted' FROM ended
                  RETURNING job_id, status, owner_key, failure_code, attempts, finished_at",
                "INSERT INTO etl_dead_letters (job_id, owner_key, queue, kind, code, attempts,
                        failed_at)
                 SELECT o.job_id, o.owner_key, i.queue, i.kind, o.failure_code, o.attempts,
                        o.finished_at
                   FROM outcome o JOIN etl_job_intake i ON i.id = o.job_id"
            ),
            &[],
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_bulk_replay_keeps_each_letters_owner_kind_queue_priority_and_bound() {
    let (db, client) = database().await;
    let policy = Retention::new(key("k1")).kind(Idle::KIND).kind(Mail::KIND);
    let (a, b) = (
        Jobs::new(secret(), "owner-a").retaining(policy.clone()),
        Jobs::new(secret(), "owner-b").retaining(policy),
    );
    let urgent = EnqueueOptions {
        priority: Some(1),
        max_attempts: Some(7),
        ..EnqueueOptions::default()
    };
    for n in 0..3 {
        a.enqueue(&client, &Idle { n }, EnqueueOptions::default())
            .await
            .unwrap();
        b.enqueue(&client, &Idle { n }, urgent).await.unwrap();
        let to = format!("m{n}@x");
        b.enqueue(
            &client,
            &Mail {
                to,
                fail: "ok".into(),
            },
            EnqueueOptions::default(),
        )
        .await
        .unwrap();
    }
    let shape = "SELECT owner_key, kind, queue, priority, max_attempts FROM etl_job_intake";
    let before: Vec<String> = first_column(
        &client,
        &format!("SELECT string_agg(t::text, ';' ORDER BY t::text) FROM ({shape}) t"),
    )
    .await;
    fail_all_by_hand(&client).await;
    let done = DeadLetters::all_owners(secret())
        .with_key(key("k1"))
        .replay_matching(&mut db.client().await, &LetterFilter::default(), "ops")
        .await
        .unwrap();
    assert_eq!(done.made, 9);
    // The new jobs, each as its letter's job was.
    let after: Vec<String> = first_column(
        &client,
        &format!(
            "SELECT string_agg(t::text, ';' ORDER BY t::text) FROM ({shape}
              WHERE id IN (SELECT replayed_job_id FROM etl_dead_letters)) t"
        ),
    )
    .await;
    assert_eq!(after, before);
    let pairs: i64 = client
        .query_one(
            "SELECT count(*) FROM etl_dead_letters l
               JOIN etl_job_intake o ON o.id = l.job_id
               JOIN etl_job_intake n ON n.id = l.replayed_job_id
              WHERE (o.owner_key, o.kind, o.queue, o.priority, o.max_attempts)
                  = (n.owner_key, n.kind, n.queue, n.priority, n.max_attempts)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(pairs, 9, "each new job is its own letter's");
}

#[tokio::test]
async fn racing_and_cut_bulk_replays_make_exactly_one_job_per_letter() {
    let (db, client) = database().await;
    let jobs = Jobs::new(secret(), "bulk").retaining(Retention::new(key("k1")).kind(Idle::KIND));
    let letters_wanted = 3 * REPLAY_CHUNK + 17;
    let batch: Vec<(Idle, EnqueueOptions)> = (0..letters_wanted)
        .map(|n| (Idle { n }, EnqueueOptions::default()))
        .collect();
    let ids: Vec<Uuid> = jobs
        .enqueue_many_with(&client, batch.iter().map(|(j, o)| (j, *o)))
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    fail_all_by_hand(&client).await;
    assert_eq!(count(&client, "etl_dead_letters").await, letters_wanted);

    // A bulk replay cut mid-way (its backend terminated once some chunks committed).
    let mut victim = db.client().await;
    let pid: i32 = victim
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let letters = jobs.dead_letters();
    let cut = tokio::spawn({
        let letters = letters.clone();
        async move {
            letters
                .replay_matching(&mut victim, &LetterFilter::default(), "cut")
                .await
        }
    });
    eventually("a chunk of the cut replay to commit", || async {
        count(
            &client,
            "etl_dead_letters WHERE replayed_job_id IS NOT NULL",
        )
        .await
            > 0
    })
    .await;
    client
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    let cut = cut.await.unwrap();
    let replayed_before = count(
        &client,
        "etl_dead_letters WHERE replayed_job_id IS NOT NULL",
    )
    .await;
    assert!(
        cut.is_err() || replayed_before == letters_wanted,
        "the cut replay failed, unless it had finished"
    );

    // Three bulk replays race over the rest.
    let mut racers = Vec::new();
    for i in 0..3 {
        let (db_config, letters) = (db.config.clone(), letters.clone());
        racers.push(tokio::spawn(async move {
            let mut conn = crate::support::connect(&db_config.url.parse().unwrap()).await;
            letters
                .replay_matching(&mut conn, &LetterFilter::default(), &format!("bulk-{i}"))
                .await
                .unwrap()
        }));
    }
    let mut made = 0;
    for racer in racers {
        let done = racer.await.unwrap();
        assert_eq!((done.not_retained, done.unreadable), (0, 0));
        made += done.made;
    }
    assert_eq!(
        i64::try_from(made).unwrap() + replayed_before,
        letters_wanted,
        "every letter was made a job once, by the cut replay or one racer"
    );
    // Each letter names a distinct new job, and there are exactly as many new jobs.
    let distinct: i64 = client
        .query_one(
            "SELECT count(DISTINCT replayed_job_id) FROM etl_dead_letters",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(distinct, letters_wanted);
    assert_eq!(count(&client, "etl_job_records").await, letters_wanted);
    let originals: Vec<Uuid> = first_column(
        &client,
        "SELECT job_id FROM etl_dead_letters ORDER BY job_id",
    )
    .await;
    let mut ids = ids;
    ids.sort();
    assert_eq!(originals, ids);
    // The new jobs keep their payloads under k1; the letters' went with their replays.
    assert_eq!(
        count(&client, "etl_retained_payloads").await,
        letters_wanted
    );
    // Nothing is left to replay.
    let done = letters
        .replay_matching(&mut db.client().await, &LetterFilter::default(), "again")
        .await
        .unwrap();
    assert_eq!(done.made, 0);
}

#[tokio::test]
async fn retained_payloads_are_pruned_on_time_and_unreadable_under_another_key() {
    let (db, client) = database().await;
    let policy = Retention::new(key("k1"))
        .queue("mail")
        .ttl(Duration::from_secs(3600));
    let jobs = Jobs::new(secret(), "keeper").retaining(policy);
    let failed = mail(&client, &jobs, "f@x", "permanent", "k-f").await;
    let old = mail(&client, &jobs, "o@x", "permanent", "k-o").await;
    let succeeded = mail(&client, &jobs, "s@x", "ok", "k-s").await;
    let live = jobs
        .enqueue(
            &client,
            &Mail {
                to: "l@x".into(),
                fail: "ok".into(),
            },
            EnqueueOptions {
                run_at: Some(chrono::Utc::now() + chrono::Duration::hours(1)),
                ..EnqueueOptions::default()
            },
        )
        .await
        .unwrap()
        .id;
    assert_eq!(count(&client, "etl_retained_payloads").await, 4);
    drain_due(&db, &client).await;
    // `old` failed longer ago than its hour: its payload is no longer used, even before
    // maintenance deletes it.
    client
        .batch_execute(&format!(
            "UPDATE etl_job_outcomes SET finished_at = now() - interval '61 minutes'
              WHERE job_id = '{old}';
             UPDATE etl_dead_letters SET failed_at = now() - interval '61 minutes'
              WHERE job_id = '{old}'"
        ))
        .await
        .unwrap();
    let mut conn = db.client().await;
    let letters = jobs.dead_letters();
    assert!(!letters.get(&client, old).await.unwrap().unwrap().retained);
    assert!(
        letters
            .get(&client, failed)
            .await
            .unwrap()
            .unwrap()
            .retained
    );
    let expired = letters.replay(&mut conn, old, "t", None).await.unwrap_err();
    assert_eq!(expired.code().as_str(), "payload_not_retained");
    assert_eq!(
        retention::prune(&client).await.unwrap(),
        2,
        "old and succeeded"
    );
    let kept: Vec<Uuid> = first_column(
        &client,
        "SELECT job_id FROM etl_retained_payloads ORDER BY job_id",
    )
    .await;
    let mut want = vec![failed, live];
    want.sort();
    assert_eq!(kept, want, "a live job's and an unexpired letter's stay");
    assert!(!kept.contains(&succeeded));
    assert_eq!(retention::prune(&client).await.unwrap(), 0);

    // Rotated key: the payload sealed under k1 does not open under k2.
    let rotated = DeadLetters::for_owner(secret(), "keeper").with_key(key("k2"));
    let refused = rotated
        .replay(&mut conn, failed, "t", None)
        .await
        .unwrap_err();
    assert_eq!(refused.code().as_str(), "payload_unreadable");
    let bulk = rotated
        .replay_matching(&mut conn, &LetterFilter::default(), "t")
        .await
        .unwrap();
    assert_eq!((bulk.made, bulk.unreadable, bulk.not_retained), (0, 1, 1));
    // Destroyed secret: the same key id under another secret opens nothing either (an
    // operator's view: under another secret, the owner's digest is another too).
    let other = Secret::new("another-secret-0123456789").unwrap();
    let destroyed =
        DeadLetters::all_owners(other.clone()).with_key(PayloadKey::derive(&other, "k1").unwrap());
    let bulk = destroyed
        .replay_matching(&mut conn, &LetterFilter::default(), "t")
        .await
        .unwrap();
    assert_eq!((bulk.made, bulk.unreadable), (0, 1));
    // A handle without a key cannot bulk-replay.
    let keyless = DeadLetters::for_owner(secret(), "keeper");
    let refused = keyless
        .replay_matching(&mut conn, &LetterFilter::default(), "t")
        .await
        .unwrap_err();
    assert_eq!(refused.code().as_str(), "config_invalid");
    // The right key still opens it, once.
    let done = jobs
        .dead_letters()
        .replay(&mut conn, failed, "t", None)
        .await
        .unwrap();
    assert!(done.made);
    assert_eq!(
        count(&client, "etl_dead_letters WHERE replayed_job_id IS NULL").await,
        1
    );
}

/// Runs a mailer until no due job is live.
async fn drain_due(db: &TestDb, client: &Client) {
    let (stop, until) = shutdown::manual();
    let replica = tokio::spawn(mailer(db, "due").await.run(until));
    eventually("every due job to end", || async {
        count(client, "etl_job_records WHERE run_at <= now()").await == 0
    })
    .await;
    stop.request(shutdown::Stage::Draining);
    replica.await.unwrap().unwrap();
}

/// The WAL file name and byte position of the server's flushed WAL.
async fn wal_at(client: &Client) -> (String, i64) {
    let row = client
        .query_one(
            "SELECT pg_walfile_name(l), (l - '0/0'::pg_lsn)::int8 FROM pg_current_wal_flush_lsn() l",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// The plan of a listing of owner `owner`'s open letters of `queue` with `code` (each ignored
/// when `None`), as `EXPLAIN` prints it.
async fn listing_plan(
    client: &Client,
    owner: Option<&[u8]>,
    queue: Option<&str>,
    code: Option<&str>,
) -> String {
    let none_t: Option<chrono::DateTime<chrono::Utc>> = None;
    let none_id: Option<Uuid> = None;
    let (limit, kind): (i64, Option<&str>) = (51, None);
    let rows = client
        .query(
            &format!("EXPLAIN {}", durable_etl::dead_letters::LIST_SQL),
            &[
                &owner, &queue, &kind, &code, &none_t, &none_t, &none_t, &none_id, &limit,
            ],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every row of every table of the test's database, as text.
async fn every_row(client: &Client) -> String {
    let tables: Vec<String> = first_column(
        client,
        "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public'",
    )
    .await;
    let mut all = String::new();
    for table in tables {
        let rows = client
            .query(&format!("SELECT t::text FROM {table} t"), &[])
            .await
            .unwrap();
        for row in rows {
            all.push_str(row.get::<_, &str>(0));
            all.push('\n');
        }
    }
    all
}

#[tokio::test]
async fn no_plaintext_payload_survives_a_failure_in_a_table_or_in_the_wal_it_wrote() {
    // A private server without full-page images, so the WAL holds each record's own bytes.
    let cluster = crate::support::Cluster::start_with("full_page_writes = off");
    let url = cluster.url("letters");
    assert!(binary(&url, &["migrate", "--create-database"])
        .status()
        .unwrap()
        .success());
    let config = DatabaseConfig {
        url: url.clone(),
        ..DatabaseConfig::default()
    };
    let client = crate::support::connect(&url.parse().unwrap()).await;
    tables(&client).await;
    let canary = "CANARY-dead-letter-7c1f";
    let jobs = Jobs::new(secret(), "private").retaining(Retention::new(key("k1")).queue("mail"));
    let before_enqueue = wal_at(&client).await;
    let id = mail(&client, &jobs, canary, "slow", "k-canary").await;
    let (stop, until) = shutdown::manual();
    let replica = tokio::spawn(mailer_on(&config, "private").await.run(until));
    eventually("the job to run", || async {
        count(&client, "etl_job_records WHERE status = 'running'").await == 1
    })
    .await;
    let before_end = wal_at(&client).await;
    client
        .execute("INSERT INTO released DEFAULT VALUES", &[])
        .await
        .unwrap();
    eventually("the job to fail", || async {
        count(&client, "etl_dead_letters").await == 1
    })
    .await;
    stop.request(shutdown::Stage::Draining);
    replica.await.unwrap().unwrap();
    client.execute("CHECKPOINT", &[]).await.unwrap();
    let after_end = wal_at(&client).await;

    let rows = every_row(&client).await;
    assert!(
        rows.contains(&id.to_string()),
        "the dump reads the job's rows"
    );
    assert!(
        !rows.contains(canary),
        "no table holds the payload in plaintext"
    );
    let sealed: Vec<u8> = client
        .query_one(
            "SELECT sealed FROM etl_retained_payloads WHERE job_id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(sealed.len() > canary.len());

    let wal = |from: &(String, i64), to: &(String, i64)| cluster.wal_bytes(from.1, to.1);
    let enqueued = wal(&before_enqueue, &before_end);
    let canary_bytes = canary.as_bytes();
    let holds = |bytes: &[u8]| bytes.windows(canary_bytes.len()).any(|w| w == canary_bytes);
    assert!(
        holds(&enqueued),
        "the search finds the canary in the live row's own WAL (the control)"
    );
    let ended = wal(&before_end, &after_end);
    assert!(!ended.is_empty());
    assert!(
        !holds(&ended),
        "the failure, its letter and what followed wrote no plaintext payload to the WAL"
    );
    let _ = &before_enqueue.0;
}

#[tokio::test]
async fn a_listing_walks_an_index_at_a_million_letters_scale() {
    let (_db, client) = database().await;
    let crowd = Jobs::new(secret(), "crowd").owner_key();
    let owner = Jobs::new(secret(), "plans").owner_key();
    letters_by_hand(&client, &crowd, 200_000, "mail", "mailbox_gone").await;
    letters_by_hand(&client, &owner, 2_000, "bills", "attempts_exhausted").await;
    client.batch_execute("ANALYZE").await.unwrap();
    let owner_param: Option<&[u8]> = Some(&owner[..]);
    for (owner, queue, code, index) in [
        (None, None, None, "etl_dead_letters_open_idx"),
        (owner_param, None, None, "etl_dead_letters_owner_idx"),
        (None, Some("bills"), None, "etl_dead_letters_queue_idx"),
        (
            None,
            None,
            Some("attempts_exhausted"),
            "etl_dead_letters_code_idx",
        ),
    ] {
        let plan = listing_plan(&client, owner, queue, code).await;
        assert!(plan.contains(index), "{index}: {plan}");
        assert!(!plan.contains("Seq Scan on etl_dead_letters"), "{plan}");
        assert!(!plan.contains("Sort"), "a walk in order, no sort: {plan}");
    }
}

#[tokio::test]
async fn a_replica_deletes_the_payloads_no_longer_kept_when_it_starts() {
    let (db, client) = database().await;
    let jobs = Jobs::new(secret(), "pruned").retaining(Retention::new(key("k1")).queue("mail"));
    let id = mail(&client, &jobs, "ok@x", "ok", "k-ok").await;
    // The job succeeds (ended by hand: a replica's own first pass could prune its payload at
    // once, before this test looks); its payload is left for maintenance.
    crate::support::end_job(&client, id, "succeeded", None, Some((1, 0, 0))).await;
    assert_eq!(count(&client, "etl_retained_payloads").await, 1);
    // A replica deletes it at its first maintenance tick (and then once a minute).
    let (stop, until) = shutdown::manual();
    let replica = tokio::spawn(mailer(&db, "pruner").await.run(until));
    eventually("the replica to delete the payload", || async {
        count(&client, "etl_retained_payloads").await == 0
    })
    .await;
    stop.request(shutdown::Stage::Draining);
    replica.await.unwrap().unwrap();
}
