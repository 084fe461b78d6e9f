//! The claim and the other hot statements: the claim walks its partial index in order, even on a
//! table full of terminal rows that was analyzed while empty or never analyzed at all; no hot
//! statement walks the history of terminal rows, on a worker session that plans like any other;
//! and every claim of a job advances its fencing token.

use crate::support::{insert_ended_jobs, insert_jobs, TestDb};
use durable_etl::codes::Code;
use durable_etl::jobs;
use durable_etl::worker::lease::{self, Lease};
use durable_etl::worker::{claimer, completer, heartbeat, rescuer};
use futures::StreamExt;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{AsyncMessage, GenericClient, NoTls};
use uuid::Uuid;

/// The claimant of this test.
const PLANNER: claimer::Claimant<'static> = claimer::Claimant {
    owner_id: "planner",
    owner_locked: false,
    lease: Duration::from_secs(30),
    heartbeat_interval: std::time::Duration::from_secs(4),
    alive_locked: false,
    kinds: crate::support::TEST_KINDS,
};

/// The owner digest [`insert_jobs`] gives every job (`ab` × 32).
const OWNER: [u8; 32] = [0xab; 32];

/// Terminal rows in the history of the hot-statement test.
const HISTORY: i64 = 200_000;

/// Deferred jobs of the claimed queue and kinds in the hot-statement test, due over the next
/// day at every priority.
const DEFERRED: i64 = 100_000;

/// Ended jobs of other owners, newer than all of [`OWNER`]'s, in the hot-statement test.
const OTHER_OWNERS_JOBS: i64 = 5_000;

/// The most rows any scan of a hot statement may examine on a table with [`HISTORY`] terminal
/// rows: far above what the statements touch (tens of rows), far below a walk of the history.
const EXAMINED_BOUND: f64 = 2_000.0;

/// A session with `config` that reports, through the returned channel, the plan of every
/// statement it runs, nested ones (SQL functions, foreign-key checks) included, with the rows
/// each node produced and removed (`auto_explain` at notice level).
async fn explained(
    config: tokio_postgres::Config,
) -> (tokio_postgres::Client, mpsc::UnboundedReceiver<String>) {
    let (session, mut connection) = config.connect(NoTls).await.unwrap();
    let (notices, plans) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notice(notice) = message {
                let _ = notices.send(notice.message().to_owned());
            }
        }
    });
    session
        .batch_execute(
            "LOAD 'auto_explain';
             SET auto_explain.log_min_duration = 0;
             SET auto_explain.log_level = 'notice';
             SET auto_explain.log_format = 'json';
             SET auto_explain.log_analyze = on;
             SET auto_explain.log_timing = off;
             SET auto_explain.log_nested_statements = on;",
        )
        .await
        .unwrap();
    (session, plans)
}

/// The plans reported since the last call. The connection task forwards a statement's notices
/// before its reply, so every plan of a statement that returned is already in the channel.
fn plans_since(plans: &mut mpsc::UnboundedReceiver<String>) -> Vec<Value> {
    let mut out = Vec::new();
    while let Ok(notice) = plans.try_recv() {
        if let Some(start) = notice.find('{') {
            out.push(serde_json::from_str(&notice[start..]).unwrap());
        }
    }
    out
}

/// Every plan node under `node`, depth first.
fn nodes<'a>(node: &'a Value, out: &mut Vec<&'a Value>) {
    out.push(node);
    for child in node["Plans"].as_array().into_iter().flatten() {
        nodes(child, out);
    }
}

/// Every node of every plan in `plans`.
fn all_nodes(plans: &[Value]) -> Vec<&Value> {
    let mut out = Vec::new();
    for plan in plans {
        nodes(&plan["Plan"], &mut out);
    }
    out
}

/// Asserts that `plans` (of the statement `what`) read the job tables only through index
/// conditions that keep them off the history: no sequential scan of a job table, and no scan
/// that examined (returned or filtered out) more than [`EXAMINED_BOUND`] rows.
fn assert_no_history_walk(what: &str, plans: &[Value]) {
    assert!(!plans.is_empty(), "{what}: no plan was reported");
    for node in all_nodes(plans) {
        let Some(relation) = node["Relation Name"].as_str() else {
            continue;
        };
        let kind = node["Node Type"].as_str().unwrap_or("");
        // The live job table (since migration 0008) holds only pending and running jobs, never
        // the history; while it is small the planner rightly scans it whole, and the examined
        // bound below still catches a scan that grows. `etl_queues` holds a row per configured
        // queue and `etl_queue_permits` a row per slot of a capped queue, never a job (empty
        // here: a scan is the right plan, and the examined bound catches one that grows), and
        // `etl_key_permits` a row per running job of a key-capped queue (whose freeing trigger
        // reads `etl_waiting_replicas`, a row per waiting replica); recovery reads
        // `etl_owner_beats`, a row per replica with a session; an owner's cancel writes
        // `etl_job_cancel_deferred`, a row per cancel recorded while a commit held its job,
        // cleared once applied or once the job ended.
        let small = [
            "etl_job_records",
            "etl_queues",
            "etl_queue_permits",
            "etl_key_permits",
            "etl_waiting_replicas",
            "etl_owner_beats",
            "etl_job_cancel_deferred",
        ]
        .contains(&relation);
        assert!(
            !(kind == "Seq Scan" && relation.starts_with("etl_") && !small),
            "{what}: sequential scan of {relation}:\n{plans:#?}"
        );
        let count = |key: &str| node[key].as_f64().unwrap_or(0.0);
        let examined = (count("Actual Rows")
            + count("Rows Removed by Filter")
            + count("Rows Removed by Index Recheck"))
            * count("Actual Loops").max(1.0);
        assert!(
            examined <= EXAMINED_BOUND,
            "{what}: {kind} on {relation} examined {examined} rows:\n{plans:#?}"
        );
    }
}

/// Every plan node under `node`, depth first, each with whether a row lock (`LockRows`) is
/// above it.
fn nodes_under_locks<'a>(node: &'a Value, locked: bool, out: &mut Vec<(&'a Value, bool)>) {
    out.push((node, locked));
    let locks = locked || node["Node Type"] == "LockRows";
    for child in node["Plans"].as_array().into_iter().flatten() {
        nodes_under_locks(child, locks, out);
    }
}

/// Asserts that `plans` (of a claim) walked the claim index in order: it names
/// `etl_job_records_claim_idx`, no node scans the job table another way (the settings table
/// `etl_queues` is small), and no node sorts what a probe locks
/// (the one sort allowed merges the probes' locked rows, above their locks).
fn assert_walks_the_pending_index(plans: &[Value]) {
    let mut nodes = Vec::new();
    for plan in plans {
        nodes_under_locks(&plan["Plan"], false, &mut nodes);
    }
    assert!(
        nodes
            .iter()
            .any(|(n, _)| n["Index Name"] == "etl_job_records_claim_idx"),
        "the claim must walk the claim index:\n{plans:#?}"
    );
    for (node, locked) in nodes {
        let kind = node["Node Type"].as_str().unwrap_or("");
        let jobs = node["Relation Name"] == "etl_job_records";
        assert!(
            !((jobs && ["Seq Scan", "Bitmap Heap Scan"].contains(&kind))
                || (locked && kind.contains("Sort"))),
            "index order needs no {kind}:\n{plans:#?}"
        );
    }
}

/// Claims 10 jobs on `session` and asserts the plan walked the pending index in order.
async fn claim_walks_the_pending_index(
    session: &tokio_postgres::Client,
    plans: &mut mpsc::UnboundedReceiver<String>,
) {
    plans_since(plans);
    let claimed = claimer::claim(session, PLANNER, 10).await.unwrap();
    assert_eq!(claimed.len(), 10);
    assert_walks_the_pending_index(&plans_since(plans));
    let asks = [(durable_etl::queue::DEFAULT_QUEUE, 10)];
    let uncapped = claimer::claim_uncapped(session, PLANNER, &asks).await;
    assert_eq!(uncapped.unwrap().jobs.len(), 10);
    assert_walks_the_pending_index(&plans_since(plans));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_uses_the_pending_index_even_when_the_table_was_analyzed_empty() {
    let db = TestDb::migrated().await;
    // A replica's claim session: the claim runs there and nowhere else in a replica.
    let config = durable_etl::worker::claimer::claim_pg_config(&db.config).unwrap();
    let (session, mut plans) = explained(config).await;
    session
        .batch_execute("ANALYZE etl_job_records")
        .await
        .unwrap();
    // Claims on the empty table: a cached generic plan would be born here.
    for _ in 0..10 {
        assert!(claimer::claim(&session, PLANNER, 10)
            .await
            .unwrap()
            .is_empty());
    }
    // The table fills: 100,000 terminal rows and 10,000 pending rows, never analyzed since.
    let filler = db.client().await;
    fill_history(&filler, 100_000).await;
    let payloads = vec![json!({}); 10_000];
    insert_jobs(&filler, "test.noop", &payloads, 3).await;
    claim_walks_the_pending_index(&session, &mut plans).await;
}

/// A table never analyzed (new, or truncated) that receives a bulk insert has no statistics:
/// the planner then guesses a handful of pending rows and, left to itself, prefers a bitmap scan
/// plus a sort of every pending row. A replica claims on its claim sessions, whose planner
/// switches pin the claim's plan, so it still claims through the index; its other sessions plan
/// with the server's defaults (no planner switch leaks into a group commit or a handler).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_session_claims_through_the_index_on_a_never_analyzed_table() {
    let db = TestDb::migrated().await;
    let config = durable_etl::worker::claimer::claim_pg_config(&db.config).unwrap();
    let (session, mut plans) = explained(config).await;
    let filler = db.client().await;
    filler
        .batch_execute("TRUNCATE etl_job_records CASCADE")
        .await
        .unwrap();
    insert_jobs(&filler, "test.noop", &vec![json!({}); 5_000], 3).await;
    claim_walks_the_pending_index(&session, &mut plans).await;
    let worker = durable_etl::db::pg_config(&db.config, "worker")
        .unwrap()
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap();
    let (pooled, connection) = worker;
    tokio::spawn(connection);
    for setting in ["enable_sort", "enable_bitmapscan"] {
        let value: String = pooled
            .query_one(&format!("SHOW {setting}"), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            value, "on",
            "{setting} leaks into the replica's other sessions"
        );
    }
}

/// Inserts `n` terminal jobs of [`OWNER`] with time-ordered ids (UUIDv7 layout, two days old),
/// oldest first: all `succeeded` but the 100 oldest, which are `cancelled` (so a listing of
/// cancelled jobs that filtered the owner's jobs one by one would walk all of them); every
/// succeeded one has its ledger row, and each retried once before it ended (an attempt history as
/// big as the history); then [`OTHER_OWNERS_JOBS`] newer ended jobs of ten other owners, and as
/// many newer pending jobs of theirs, due tomorrow.
async fn fill_history(client: &tokio_postgres::Client, n: i64) {
    insert_ended_jobs(
        client,
        "SELECT (lpad(to_hex((extract(epoch FROM now() - interval '2 days') * 1000)::int8 + g),
                      12, '0') || '70008' || lpad(to_hex(g), 15, '0'))::uuid AS id,
                decode(repeat('ab', 32), 'hex') AS owner_key,
                CASE WHEN g <= 100 THEN 'cancelled' ELSE 'succeeded' END AS status,
                CASE WHEN g <= 100 THEN 'cancelled' END AS failure_code,
                now() AS finished_at, NULL::uuid AS replaces_job_id
           FROM generate_series(1, $1::int8) g",
        &[&n],
    )
    .await;
    // Ten other owners' jobs, newer than any of this owner's (their ids a day ahead), so that a
    // listing that walked the primary key and filtered by owner would read all of them first.
    insert_ended_jobs(
        client,
        "SELECT (lpad(to_hex((extract(epoch FROM now() + interval '1 day') * 1000)::int8 + g),
                      12, '0') || '70008' || lpad(to_hex(g), 15, '0'))::uuid AS id,
                sha256((g % 10)::text::bytea) AS owner_key, 'succeeded' AS status,
                NULL::text AS failure_code, now() AS finished_at, NULL::uuid AS replaces_job_id
           FROM generate_series(1, $1::int8) g",
        &[&OTHER_OWNERS_JOBS],
    )
    .await;
    // Other owners' backlog: pending jobs due tomorrow (no claim takes them), newer than any of
    // this owner's, so that a listing of this owner's pending jobs that walked the live table's
    // primary key and filtered by owner would read all of them first.
    client
        .execute(
            "WITH g AS (
                 SELECT (lpad(to_hex((extract(epoch FROM now() + interval '2 days') * 1000)::int8
                                     + g), 12, '0') || '70008' || lpad(to_hex(g), 15, '0'))::uuid
                            AS id,
                        sha256((g % 10)::text::bytea) AS owner_key
                   FROM generate_series(1, $1::int8) g
             ), intake AS (
                 INSERT INTO etl_job_intake
                     (id, owner_key, idempotency_key_digest, request_fingerprint, kind,
                      max_attempts, run_at)
                 SELECT id, owner_key, sha256(id::text::bytea), sha256(id::text::bytea),
                        'test.noop', 3, now() + interval '1 day'
                   FROM g
             )
             INSERT INTO etl_job_records
                 (id, owner_key, kind, request_payload, max_attempts, run_at, sort_at)
             SELECT id, owner_key, 'test.noop', '{}', 3, now() + interval '1 day',
                    now() + interval '1 day'
               FROM g",
            &[&OTHER_OWNERS_JOBS],
        )
        .await
        .unwrap();
    // Each ended job retried once before it ended: an attempt history as big as the history.
    client
        .execute(
            "INSERT INTO etl_job_attempts (job_id, attempt, started_at, ended_at, ending, due_at)
             SELECT job_id, 1, finished_at - interval '2 minutes', finished_at - interval '1 minute',
                    'retried', finished_at - interval '1 minute'
               FROM etl_job_outcomes",
            &[],
        )
        .await
        .unwrap();
}

/// Runs `sql` with the job ids `$1` and claim ids `$2` (pairwise) and counts the rows it returns.
async fn rows_by_pairs(
    client: &impl GenericClient,
    sql: &str,
    ids: &[Uuid],
    claims: &[Uuid],
) -> usize {
    let params: [(&(dyn ToSql + Sync), Type); 2] =
        [(&ids, Type::UUID_ARRAY), (&claims, Type::UUID_ARRAY)];
    client.query_typed(sql, &params).await.unwrap().len()
}

/// Runs every hot statement once on `session` (the claim on `claimer`, a claim session, where a
/// replica runs it) and asserts none walked the history. `pass` names the statistics the tables
/// had.
async fn hot_statements_stay_off_the_history(
    session: &mut tokio_postgres::Client,
    plans: &mut mpsc::UnboundedReceiver<String>,
    claimer: (
        &tokio_postgres::Client,
        &mut mpsc::UnboundedReceiver<String>,
    ),
    pass: &str,
) {
    let check = |what: &str, plans: &mut mpsc::UnboundedReceiver<String>| {
        let seen = plans_since(plans);
        assert_no_history_walk(&format!("{pass}: {what}"), &seen);
        seen
    };
    let (claim_session, claim_plans) = claimer;
    plans_since(claim_plans);
    let claimed = claimer::claim(claim_session, PLANNER, 8).await.unwrap();
    assert_eq!(claimed.len(), 8, "{pass}");
    assert_walks_the_pending_index(&check("claim", claim_plans));
    claimer::next_due(&*session, &["default"], crate::support::TEST_KINDS)
        .await
        .unwrap();
    check("next due", plans);
    let claims: Vec<Uuid> = claimed.iter().map(|c| c.claim_id()).collect();
    let held = heartbeat::beat(&*session, PLANNER.owner_id, &claims, PLANNER.lease, true)
        .await
        .unwrap();
    assert_eq!(held.len(), 8, "{pass}");
    check("heartbeat", plans);

    // The group commit of the first four: lock under the fences, then succeed.
    let leases: Vec<Lease> = claimed.iter().map(|c| c.lease()).collect();
    let (ids, claim_ids) = lease::unzip(&leases[..4]);
    let tx = session.transaction().await.unwrap();
    let locked = rows_by_pairs(&tx, completer::LOCK_FENCED_SQL, &ids, &claim_ids).await;
    assert_eq!(locked, 4, "{pass}");
    // Inside a transaction block a statement's portal (and so its plan report) ends only when the
    // next statement starts.
    tx.batch_execute("SELECT 1").await.unwrap();
    check("group-commit lock", plans);
    let entries: Vec<_> = leases[..4]
        .iter()
        .map(|&lease| (lease, Default::default()))
        .collect();
    let succeeded = completer::succeed_many(&tx, &entries).await.unwrap();
    assert_eq!(succeeded.len(), 4, "{pass}");
    tx.commit().await.unwrap();
    check("success", plans);
    let ledger = rows_by_pairs(&*session, completer::LEDGER_BY_CLAIM_SQL, &ids, &claim_ids).await;
    assert_eq!(ledger, 4, "{pass}");
    check("ledger by claim", plans);

    let retried = completer::retry(&*session, leases[4], Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(retried, completer::Transition::Retried, "{pass}");
    check("retry", plans);
    let failed = completer::fail(&*session, leases[5], Code::HandlerFailed, None)
        .await
        .unwrap();
    assert_eq!(failed, completer::Transition::Failed(Code::HandlerFailed));
    check("fail", plans);
    assert_eq!(
        completer::release(&*session, &leases[6..7], &[leases[6].claim_id])
            .await
            .unwrap(),
        1
    );
    check("release", plans);

    // Recovery: one lease expired (leases[7]), then this owner's own leftovers.
    session
        .execute(
            "UPDATE etl_job_records SET lease_expires_at = now() - interval '1 second'
              WHERE id = $1",
            &[&leases[7].job_id],
        )
        .await
        .unwrap();
    plans_since(plans);
    let recovered = rescuer::recover(
        &*session,
        rescuer::Judgement {
            heartbeat_interval: Duration::from_secs(1),
            reachable_for: Duration::MAX,
        },
    )
    .await
    .unwrap();
    assert_eq!(recovered.expired, 1, "{pass}");
    check("recovery", plans);
    claimer::claim(&*session, PLANNER, 1).await.unwrap();
    plans_since(plans);
    assert_eq!(
        rescuer::recover_own(&*session, PLANNER.owner_id, false)
            .await
            .unwrap(),
        1
    );
    check("own recovery", plans);
    // The refund of what recovery took from a live replica: the expired lease's attempt and the
    // own recovery's (an incarnation since the epoch).
    let refunded = durable_etl::worker::refund::refund(
        &*session,
        PLANNER.owner_id,
        std::time::SystemTime::UNIX_EPOCH,
    )
    .await
    .unwrap();
    assert_eq!(refunded.attempts, 2, "{pass}");
    check("refund", plans);

    // The owner's views.
    let status = jobs::status(&*session, &OWNER, leases[0].job_id)
        .await
        .unwrap();
    assert_eq!(status.unwrap().status, "succeeded", "{pass}");
    check("status read", plans);
    let attempts = jobs::past_attempts(&*session, &OWNER, leases[4].job_id)
        .await
        .unwrap();
    assert_eq!(attempts.len(), 1, "{pass}: the retried attempt");
    check("attempt history read", plans);
    let replacements = jobs::replaced_by(&*session, &OWNER, leases[0].job_id)
        .await
        .unwrap();
    assert!(replacements.is_empty(), "{pass}");
    check("replacements read", plans);
    let all = jobs::Window::default();
    let newest = jobs::list(&*session, &OWNER, all, None, 50).await.unwrap();
    assert_eq!(newest.len(), 50, "{pass}");
    check("listing", plans);
    let cancelled = jobs::list(&*session, &OWNER, all, Some("cancelled"), 50)
        .await
        .unwrap();
    assert_eq!(cancelled.len(), 50, "{pass}");
    assert!(cancelled.iter().all(|j| j.status == "cancelled"), "{pass}");
    check("listing by status", plans);
    let next = jobs::list(
        &*session,
        &OWNER,
        all.after(cancelled.last().map(|j| j.id)),
        Some("cancelled"),
        50,
    )
    .await
    .unwrap();
    assert_eq!(next.len(), 50, "{pass}");
    check("listing by status, next page", plans);
    // The live states: none of the owner's jobs runs now, and an empty page reads no history.
    let running = jobs::list(&*session, &OWNER, all, Some("running"), 50)
        .await
        .unwrap();
    assert!(running.is_empty(), "{pass}: {running:?}");
    check("listing the running jobs (none)", plans);
    let pending = jobs::list(&*session, &OWNER, all, Some("pending"), 50)
        .await
        .unwrap();
    assert_eq!(pending.len(), 50, "{pass}");
    assert!(pending.iter().all(|j| j.status == "pending"), "{pass}");
    assert!(pending.windows(2).all(|w| w[0].id > w[1].id), "{pass}");
    check("listing the pending jobs", plans);
    submitted_windows_stay_off_the_rest_of_the_history(&*session, &check, plans, pass).await;
    let cancel = jobs::cancel(&*session, &OWNER, leases[4].job_id, Code::Cancelled)
        .await
        .unwrap();
    assert_eq!(cancel, jobs::Cancel::Cancelled, "{pass}");
    check("cancel", plans);
}

/// Listings of a submission window: 50 jobs from the middle of the history (any status, and
/// succeeded ones), and a window with none of the owner's jobs (a day long, between the history
/// and the live jobs). Both bounds are index conditions, so none walks the rest of the history.
async fn submitted_windows_stay_off_the_rest_of_the_history(
    session: &impl GenericClient,
    check: &impl Fn(&str, &mut mpsc::UnboundedReceiver<String>) -> Vec<Value>,
    plans: &mut mpsc::UnboundedReceiver<String>,
    pass: &str,
) {
    let oldest: Uuid = session
        .query_one("SELECT id FROM etl_job_intake ORDER BY id LIMIT 1", &[])
        .await
        .unwrap()
        .get(0);
    plans_since(plans);
    let first_ms = i64::try_from(oldest.as_u128() >> 80).unwrap();
    let at = |ms: i64| chrono::DateTime::from_timestamp_millis(ms).unwrap();
    let middle =
        jobs::Window::submitted(Some(at(first_ms + 100_000)), Some(at(first_ms + 100_050)));
    for status in [None, Some("succeeded")] {
        let page = jobs::list(session, &OWNER, middle, status, 200)
            .await
            .unwrap();
        assert_eq!(page.len(), 50, "{pass}: {status:?}");
        check(&format!("listing a submitted window, {status:?}"), plans);
    }
    let now = chrono::Utc::now();
    let quiet = jobs::Window::submitted(
        Some(now - chrono::Duration::days(1)),
        Some(now - chrono::Duration::hours(1)),
    );
    let none = jobs::list(session, &OWNER, quiet, None, 50).await.unwrap();
    assert!(none.is_empty(), "{pass}");
    check("listing an empty submitted window", plans);
}

/// Every hot statement on a worker session, on a table with 200,000 terminal rows: first never
/// analyzed (a bulk load before autovacuum's analyze), then analyzed. None of them walks the
/// history: the lock step of a group commit takes its rows through the primary key, the listing
/// by an ended status through the owner + status index, and the listing by a live status
/// through the live table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_hot_statement_walks_the_history_of_terminal_rows() {
    let db = TestDb::migrated().await;
    let config = durable_etl::db::pg_config(&db.config, "worker").unwrap();
    let (mut session, mut plans) = explained(config).await;
    let claim_config = durable_etl::worker::claimer::claim_pg_config(&db.config).unwrap();
    let (claim_session, mut claim_plans) = explained(claim_config).await;
    let filler = db.client().await;
    // Autovacuum must not analyze the table behind the first pass's back.
    filler
        .batch_execute(
            "SET auto_explain.log_min_duration = -1;
             ALTER TABLE etl_job_intake SET (autovacuum_enabled = false);
             ALTER TABLE etl_job_records SET (autovacuum_enabled = false);
             ALTER TABLE etl_job_outcomes SET (autovacuum_enabled = false);
             ALTER TABLE etl_job_attempts SET (autovacuum_enabled = false);",
        )
        .await
        .unwrap();
    fill_history(&filler, HISTORY).await;
    fill_deferred(&filler, DEFERRED).await;
    for pass in ["never analyzed", "analyzed", "analyzed, key-capped"] {
        if pass == "analyzed" {
            filler.batch_execute("ANALYZE").await.unwrap();
        }
        insert_jobs(&filler, "test.noop", &vec![json!({}); 100], 3).await;
        if pass == "analyzed, key-capped" {
            // The due jobs get 25 keys of 4 jobs each, under a key cap of 4: the claim counts
            // and inserts key permits, and every exit deletes them.
            durable_etl::queue::set_key_cap(&filler, "default", Some(4))
                .await
                .unwrap();
            filler
                .batch_execute(
                    "UPDATE etl_job_records j SET concurrency_key = 'key-' || (r.n % 25)
                       FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM etl_job_records
                              WHERE status = 'pending' AND run_at <= now()) r
                      WHERE j.id = r.id",
                )
                .await
                .unwrap();
        }
        let claimer = (&claim_session, &mut claim_plans);
        hot_statements_stay_off_the_history(&mut session, &mut plans, claimer, pass).await;
        if pass != "analyzed, key-capped" {
            // The claim without permits, which a replica sends for uncapped queues.
            plans_since(&mut claim_plans);
            let asks = [(durable_etl::queue::DEFAULT_QUEUE, 2)];
            let taken = claimer::claim_uncapped(&claim_session, PLANNER, &asks).await;
            let leases: Vec<Lease> = taken.unwrap().jobs.iter().map(|j| j.lease()).collect();
            assert_eq!(leases.len(), 2, "{pass}");
            let seen = plans_since(&mut claim_plans);
            assert_no_history_walk(&format!("{pass}: claim without permits"), &seen);
            assert_walks_the_pending_index(&seen);
            // Given back, so the next pass finds no leftover of this one.
            let released = completer::release(&claim_session, &leases, &[]).await;
            assert_eq!(released.unwrap(), 2, "{pass}");
        }
    }
}

/// Inserts `n` pending jobs of another owner than [`OWNER`] (ids time-ordered, newer than every
/// other job's) in the default queue, due over the next day (one every
/// 864 ms from now), with priorities 0 to 9 in turn and their virtual deadlines: what the claim
/// and the next-due read must pass over without walking.
async fn fill_deferred(client: &tokio_postgres::Client, n: i64) {
    client
        .execute(
            "WITH g AS (
                 SELECT (lpad(to_hex((extract(epoch FROM now() + interval '3 days') * 1000)::int8
                                     + g), 12, '0') || '70008' || lpad(to_hex(g), 15, '0'))::uuid
                            AS id,
                        (g % 10)::int2 AS priority,
                        now() + g * interval '864 milliseconds' AS run_at
                   FROM generate_series(1, $1::int8) g
             ), intake AS (
                 INSERT INTO etl_job_intake
                     (id, owner_key, idempotency_key_digest, request_fingerprint, kind,
                      max_attempts, run_at, priority)
                 SELECT id, sha256('deferred'::bytea), sha256(id::text::bytea),
                        sha256(id::text::bytea), 'test.noop', 3, run_at, priority
                   FROM g
             )
             INSERT INTO etl_job_records
                 (id, owner_key, kind, request_payload, max_attempts, run_at, priority, sort_at)
             SELECT id, sha256('deferred'::bytea), 'test.noop', '{}', 3, run_at, priority,
                    durable_etl_sort_at(run_at, priority)
               FROM g",
            &[&n],
        )
        .await
        .unwrap();
}

/// The fencing token of a job grows by one with every claim and is never given back: not by a
/// shutdown release (which refunds the attempt), a retry or a recovery. The handler's context
/// carries the token the row stores, and the claim stamps the owner's lock state and the renewal
/// time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fencing_token_grows_with_every_claim_and_never_goes_back() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let id = insert_jobs(&client, "test.noop", &[json!({})], 5).await[0];
    let stored = |row: tokio_postgres::Row| (row.get::<_, i64>(0), row.get::<_, i32>(1));
    let read = "SELECT fencing_token, attempts FROM etl_job_records WHERE id = $1";
    let mut seen = Vec::new();

    // A shutdown release gives the attempt back, never the token.
    let job = claimer::claim(&client, PLANNER, 1).await.unwrap().remove(0);
    seen.push(job.ctx.fencing_token);
    let released = completer::release(&client, &[job.lease()], &[]).await;
    assert_eq!(released.unwrap(), 1);
    assert_eq!(
        stored(client.query_one(read, &[&id]).await.unwrap()),
        (1, 0)
    );

    // A retry due at once.
    let job = claimer::claim(&client, PLANNER, 1).await.unwrap().remove(0);
    seen.push(job.ctx.fencing_token);
    let retried = completer::retry(&client, job.lease(), Duration::ZERO).await;
    assert_eq!(retried.unwrap(), completer::Transition::Retried);

    // A lease that expired, recovered.
    let job = claimer::claim(&client, PLANNER, 1).await.unwrap().remove(0);
    seen.push(job.ctx.fencing_token);
    client
        .execute(
            "UPDATE etl_job_records SET lease_expires_at = now() - interval '1 second'
              WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(
        rescuer::recover(
            &client,
            rescuer::Judgement {
                heartbeat_interval: Duration::from_secs(1),
                reachable_for: Duration::MAX
            }
        )
        .await
        .unwrap()
        .expired,
        1
    );

    // A lock-backed claimant: the claim stamps the lock state it is given, and the renewal time.
    let locked = claimer::Claimant {
        owner_locked: true,
        ..PLANNER
    };
    let job = claimer::claim(&client, locked, 1).await.unwrap().remove(0);
    seen.push(job.ctx.fencing_token);
    assert_eq!(seen, vec![1, 2, 3, 4], "one more per claim");
    let stamped = client
        .query_one(
            "SELECT lease_owner_locked, lease_renewed_at = started_at FROM etl_job_records
              WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!((stamped.get(0), stamped.get(1)), (true, Some(true)));
    assert_eq!(
        stored(client.query_one(read, &[&id]).await.unwrap()),
        (4, 3),
        "the token counts claims; attempts count only those charged"
    );
}
