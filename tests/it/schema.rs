//! The schema and its migrations: up/down/up, concurrent migrate, checksum refusal, the
//! release-compatibility check, the CHECK constraints and the enqueue trigger.

use crate::support::{
    catalog_snapshot, count, end_job, first_column, insert_ended_jobs, insert_job, insert_jobs,
    register_waiting, versions_above, Listener, TestDb, LEDGERS,
};
use durable_etl::codes::Code;
use durable_etl::error::{Error, SchemaError};
use durable_etl::schema;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

/// The versions this release knows from `first` on, in order. Numbers are not contiguous while a
/// parallel branch holds one back (0014 came before 0013 merged).
fn versions_from(first: i32) -> Vec<i32> {
    schema::MIGRATIONS
        .iter()
        .map(|m| m.version)
        .filter(|v| *v >= first)
        .collect()
}

#[tokio::test]
async fn up_down_up_restores_the_catalog_exactly() {
    let db = TestDb::empty().await;
    let mut client = db.client().await;
    let before = catalog_snapshot(&client).await;
    assert!(
        before.is_empty(),
        "a new database has no schema: {before:?}"
    );

    let up = schema::migrate_up(&mut client).await.unwrap();
    assert_eq!(up.changed, versions_from(1));
    assert_eq!(up.version, schema::latest_version());
    let migrated = catalog_snapshot(&client).await;
    assert!(migrated
        .iter()
        .any(|l| l.starts_with("table etl_job_records")));

    let down = schema::migrate_down_to(&mut client, 0).await.unwrap();
    assert_eq!(
        down.changed,
        versions_from(1).into_iter().rev().collect::<Vec<_>>()
    );
    assert_eq!(down.version, 0);
    assert_eq!(catalog_snapshot(&client).await, before);

    let again = schema::migrate_up(&mut client).await.unwrap();
    assert_eq!(again.changed, up.changed);
    assert_eq!(catalog_snapshot(&client).await, migrated);

    let noop = schema::migrate_up(&mut client).await.unwrap();
    assert!(noop.changed.is_empty());

    // Each intermediate version reached by `down` is exactly the schema its `up` scripts build.
    for target in versions_from(1).into_iter().rev().skip(1) {
        schema::migrate_down_to(&mut client, target).await.unwrap();
        let reference_db = TestDb::empty().await;
        let reference = reference_db.client().await;
        for m in schema::MIGRATIONS.iter().filter(|m| m.version <= target) {
            reference.batch_execute(m.up).await.unwrap();
        }
        assert_eq!(
            catalog_snapshot(&client).await,
            catalog_snapshot(&reference).await,
            "version {target}"
        );
    }
    schema::migrate_up(&mut client).await.unwrap();
    assert_eq!(catalog_snapshot(&client).await, migrated);
    let history: i64 = client
        .query_one("SELECT count(*) FROM durable_etl_schema_history", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(history, schema::MIGRATIONS.len() as i64);
}

#[tokio::test]
async fn four_concurrent_migrations_apply_each_version_exactly_once() {
    let db = TestDb::empty().await;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let mut client = db.client().await;
        tasks.push(tokio::spawn(async move {
            schema::migrate_up(&mut client).await.unwrap()
        }));
    }
    let mut applied = Vec::new();
    for task in tasks {
        let report = task.await.unwrap();
        assert_eq!(report.version, schema::latest_version());
        applied.extend(report.changed);
    }
    applied.sort_unstable();
    assert_eq!(applied, versions_from(1));
    let client = db.client().await;
    assert_eq!(
        schema::check_compatible(&client).await.unwrap(),
        schema::latest_version()
    );
}

#[tokio::test]
async fn a_changed_applied_migration_is_refused() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    client
        .execute(
            "UPDATE durable_etl_schema_history SET checksum = 'tampered' WHERE version = 1",
            &[],
        )
        .await
        .unwrap();
    let err = schema::migrate_up(&mut client).await.unwrap_err();
    assert!(matches!(
        err,
        Error::Schema(SchemaError::ChecksumMismatch { version: 1 })
    ));
    assert_eq!(err.code(), Code::MigrationChecksumMismatch);
    let err = schema::check_compatible(&client).await.unwrap_err();
    assert_eq!(err.code(), Code::MigrationChecksumMismatch);
    let err = schema::migrate_down_to(&mut client, 0).await.unwrap_err();
    assert_eq!(err.code(), Code::MigrationChecksumMismatch);
    // Nothing was reversed: the tables are still there.
    let tables: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE tablename = 'etl_job_records'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 1);
}

#[tokio::test]
async fn start_up_check_refuses_old_and_too_new_schemas() {
    let db = TestDb::empty().await;
    let mut client = db.client().await;
    let err = schema::check_compatible(&client).await.unwrap_err();
    assert!(matches!(
        err,
        Error::Schema(SchemaError::TooOld { found: 0, .. })
    ));
    assert_eq!(err.exit_code(), 4);

    schema::migrate_up(&mut client).await.unwrap();
    schema::migrate_down_to(&mut client, 0).await.unwrap();
    // The history table exists but is empty: still too old.
    let err = schema::check_compatible(&client).await.unwrap_err();
    assert_eq!(err.code(), Code::SchemaTooOld);

    schema::migrate_up(&mut client).await.unwrap();
    let latest = schema::latest_version();
    assert_eq!(schema::check_compatible(&client).await.unwrap(), latest);

    // A newer release applied an additive migration this release may still run against.
    client
        .execute(
            "INSERT INTO durable_etl_schema_history
                 (version, name, checksum, min_reader_version, applied_by_release)
             VALUES ($1, 'future_additive', 'x', $2, '99.0.0')",
            &[&(latest + 1), &latest],
        )
        .await
        .unwrap();
    assert_eq!(schema::check_compatible(&client).await.unwrap(), latest + 1);
    let report = schema::migrate_up(&mut client).await.unwrap();
    assert!(report.changed.is_empty());
    assert_eq!(report.version, latest + 1);
    let err = schema::migrate_down_to(&mut client, 0).await.unwrap_err();
    assert!(matches!(
        err,
        Error::Schema(SchemaError::UnknownVersion { .. })
    ));

    // And then a breaking one it cannot.
    client
        .execute(
            "INSERT INTO durable_etl_schema_history
                 (version, name, checksum, min_reader_version, applied_by_release)
             VALUES ($1, 'future_breaking', 'x', $1, '99.0.0')",
            &[&(latest + 2)],
        )
        .await
        .unwrap();
    let err = schema::check_compatible(&client).await.unwrap_err();
    assert!(matches!(err, Error::Schema(SchemaError::TooNew { .. })));
    assert_eq!(err.code(), Code::SchemaTooNew);
    assert_eq!(err.exit_code(), 4);
}

/// Runs `sql` (one INSERT) and returns how it was refused, if it was: the SQLSTATE and the
/// constraint it violated (the column, for a NULL in a NOT NULL column).
async fn refusal(client: &tokio_postgres::Client, sql: &str) -> Option<(SqlState, String)> {
    match client.batch_execute(sql).await {
        Ok(()) => None,
        Err(e) => {
            let db = e.as_db_error().unwrap();
            let name = db.constraint().or(db.column()).unwrap_or("");
            Some((db.code().clone(), name.to_owned()))
        }
    }
}

/// A CHECK violation of `constraint`, as [`refusal`] reports it.
fn check(constraint: &str) -> Option<(SqlState, String)> {
    Some((SqlState::CHECK_VIOLATION, constraint.to_owned()))
}

/// An insert of one live row with `status` and, if `leased`, a whole lease; its other columns
/// are valid.
fn live_row(status: &str, leased: bool) -> String {
    let lease = if leased {
        "'o', gen_random_uuid(), now() + interval '1 minute', now()"
    } else {
        "NULL, NULL, NULL, NULL"
    };
    format!(
        "INSERT INTO etl_job_records
             (id, owner_key, kind, request_payload, status, attempts, lease_owner_id,
              lease_claim_id, lease_expires_at, lease_renewed_at)
         VALUES (gen_random_uuid(), decode(repeat('ab', 32), 'hex'), 'test.noop', '{{}}',
                 '{status}', 1, {lease})"
    )
}

/// The five ledger columns of an outcome (claim, rows inserted, updated, unchanged, checksum).
const LEDGER: &str = "gen_random_uuid(), 1, 0, 0, decode(repeat('00', 32), 'hex')";

/// The five ledger columns of a success that keeps no ledger: its claim id only.
const CLAIM_ONLY: &str = "gen_random_uuid(), NULL, NULL, NULL, NULL";

/// The five ledger columns of an outcome, all NULL.
const NO_LEDGER: &str = "NULL, NULL, NULL, NULL, NULL";

/// An insert of one outcome of job `id` (an SQL expression) with `status`, `failure_code` (an
/// SQL expression) and the five `ledger` columns.
fn outcome_row(id: &str, status: &str, failure_code: &str, ledger: &str) -> String {
    format!(
        "INSERT INTO etl_job_outcomes
             (job_id, owner_key, status, attempts, run_at, failure_code, lease_claim_id,
              rows_inserted, rows_updated, rows_unchanged, data_checksum)
         VALUES ({id}, decode(repeat('ab', 32), 'hex'), '{status}', 1, now(), {failure_code},
                 {ledger})"
    )
}

/// The live table holds pending and running rows only, each with its payload, a running one
/// with its whole lease; an outcome says why a job that did not succeed ended, with a known
/// code, and carries a whole ledger exactly when the job succeeded; a job has one outcome.
#[tokio::test]
async fn check_constraints_reject_leaky_and_unknown_states() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let new = "gen_random_uuid()";

    assert_eq!(refusal(&client, &live_row("pending", false)).await, None);
    assert_eq!(refusal(&client, &live_row("running", true)).await, None);
    for ended in ["succeeded", "failed", "cancelled"] {
        assert_eq!(
            refusal(&client, &live_row(ended, false)).await,
            check("etl_job_records_status_check"),
            "{ended}"
        );
    }
    assert_eq!(
        refusal(&client, &live_row("paused", false)).await,
        check("etl_job_records_status_check")
    );
    assert_eq!(
        refusal(&client, &live_row("running", false)).await,
        check("etl_job_records_running_has_lease")
    );
    assert_eq!(
        refusal(&client, &live_row("pending", true)).await,
        check("etl_job_records_running_has_lease")
    );
    let without_payload = live_row("pending", false).replace("'{}'", "NULL");
    assert_eq!(
        refusal(&client, &without_payload).await,
        Some((SqlState::NOT_NULL_VIOLATION, "request_payload".to_owned()))
    );

    let once = uuid::Uuid::new_v4();
    let once_sql = format!("'{once}'");
    for (status, code, ledger, refused) in [
        ("succeeded", "NULL", LEDGER, None),
        // A kind that keeps no ledger: the claim, and no ledger at all (0017).
        ("succeeded", "NULL", CLAIM_ONLY, None),
        ("failed", "'record_invalid'", NO_LEDGER, None),
        ("cancelled", "'replaced'", NO_LEDGER, None),
        // A kind's own code (0018).
        ("failed", "'address_bounced'", NO_LEDGER, None),
        (
            "succeeded",
            "NULL",
            NO_LEDGER,
            check("etl_job_outcomes_ledger_only_if_succeeded"),
        ),
        (
            "succeeded",
            "NULL",
            "NULL, 1, 0, 0, decode(repeat('00', 32), 'hex')",
            check("etl_job_outcomes_ledger_only_if_succeeded"),
        ),
        (
            "succeeded",
            "NULL",
            "gen_random_uuid(), 1, NULL, 0, decode(repeat('00', 32), 'hex')",
            check("etl_job_outcomes_ledger_only_if_succeeded"),
        ),
        (
            "failed",
            "'handler_failed'",
            LEDGER,
            check("etl_job_outcomes_ledger_only_if_succeeded"),
        ),
        (
            "failed",
            "NULL",
            NO_LEDGER,
            check("etl_job_outcomes_failure_code_matches_status"),
        ),
        (
            "cancelled",
            "'handler_failed'",
            NO_LEDGER,
            check("etl_job_outcomes_failure_code_matches_status"),
        ),
        (
            "succeeded",
            "'handler_failed'",
            LEDGER,
            check("etl_job_outcomes_failure_code_matches_status"),
        ),
        (
            "failed",
            "'Disk on fire: /dev/sda1'",
            NO_LEDGER,
            check("durable_etl_identifier_check"),
        ),
        (
            "pending",
            "NULL",
            NO_LEDGER,
            check("etl_job_outcomes_status_check"),
        ),
        (
            "running",
            "NULL",
            NO_LEDGER,
            check("etl_job_outcomes_status_check"),
        ),
    ] {
        assert_eq!(
            refusal(&client, &outcome_row(new, status, code, ledger)).await,
            refused,
            "{status} {code} {ledger}"
        );
    }
    assert_eq!(
        refusal(
            &client,
            &outcome_row(&once_sql, "failed", "'handler_failed'", NO_LEDGER)
        )
        .await,
        None
    );
    assert_eq!(
        refusal(
            &client,
            &outcome_row(&once_sql, "succeeded", "NULL", LEDGER)
        )
        .await,
        Some((
            SqlState::UNIQUE_VIOLATION,
            "etl_job_outcomes_pkey".to_owned()
        )),
        "a job ends once"
    );
}

/// Every stored code of the crate's one list passes the outcomes' code check, and so does a
/// kind's own code; text that is no code (a message, a path, upper case, a space) never does.
#[tokio::test]
async fn the_failure_code_check_admits_codes_and_never_text() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let stored = Code::ALL.iter().filter(|c| c.is_stored_failure());
    for code in stored.map(|c| c.as_str()).chain(["address_bounced"]) {
        let row = outcome_row(
            "gen_random_uuid()",
            "failed",
            &format!("'{code}'"),
            NO_LEDGER,
        );
        assert_eq!(refusal(&client, &row).await, None, "{code}");
    }
    for text in [
        "duplicate key value violates unique constraint",
        "Handler_Failed",
        "/etc/passwd",
        "code with space",
        "",
    ] {
        let row = outcome_row(
            "gen_random_uuid()",
            "failed",
            &format!("'{text}'"),
            NO_LEDGER,
        );
        assert_eq!(
            refusal(&client, &row).await,
            check("durable_etl_identifier_check"),
            "{text}"
        );
    }
}

/// Names to try against a name check: the edges of each pattern (length 63 and 64, first
/// character, the set, upper case, non-ASCII, a trailing newline) and seeded random strings.
fn name_candidates() -> Vec<String> {
    let mut names: Vec<String> = [
        "a",
        "z",
        "welcome_email",
        "etl.load",
        "a9",
        "a_",
        "a.",
        "",
        "A",
        "Ab",
        "9a",
        "_a",
        ".a",
        "a-b",
        "a b",
        "ab\n",
        "\nab",
        "é",
        "aé",
        "a$",
        "a%",
        "a'b",
        "a\\b",
        "{a}",
        "a\tb",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        "a".repeat(63),
        "a".repeat(64),
        format!("{}é", "a".repeat(61)),
    ])
    .collect();
    // Mostly the sets' own characters, so that many random names pass and many fail.
    let alphabet: Vec<char> = "abcdz0189_.abcdz0189_.abcdz0189_.AZ- é\n$"
        .chars()
        .collect();
    let mut rng = fastrand::Rng::with_seed(19);
    for i in 0..300 {
        // Mostly short names; every tenth near the length bound, from the sets alone.
        let (len, pool) = if i % 10 == 0 {
            (rng.usize(60..67), &alphabet[..11])
        } else {
            (rng.usize(0..12), &alphabet[..])
        };
        names.push((0..len).map(|_| pool[rng.usize(..pool.len())]).collect());
    }
    names
}

/// 0019 (and 0018's code check), carried by 0026's domains: the checks that keep kinds, queues,
/// datasets and failure codes identifiers admit exactly what their regular expressions did,
/// judged by PostgreSQL's own regex on every candidate, through inserts (of a `text` parameter,
/// coerced to the column's domain) that only the check under test can refuse.
#[tokio::test]
async fn the_name_checks_admit_exactly_what_their_patterns_did() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let kind = "^[a-z][a-z0-9_.]{0,62}$";
    let code = "^[a-z][a-z0-9_]{0,62}$";
    let owner = "decode(repeat('ab', 32), 'hex')";
    // The kind and queue values of an insert that tests `column`: the parameter there, a valid
    // name in the other.
    let kind_and_queue = |column: &str| {
        if column == "kind" {
            ("$1::text", "'default'")
        } else {
            ("'noop'", "$1::text")
        }
    };
    let intake = |column: &str| {
        let (kind, queue) = kind_and_queue(column);
        format!(
            "INSERT INTO etl_job_intake (id, owner_key, idempotency_key_digest,
                 request_fingerprint, kind, max_attempts, run_at, queue)
             VALUES (gen_random_uuid(), {owner}, sha256(gen_random_uuid()::text::bytea),
                     sha256(''), {kind}, 1, now(), {queue})"
        )
    };
    let live = |column: &str| {
        let (kind, queue) = kind_and_queue(column);
        format!(
            "INSERT INTO etl_job_records (id, owner_key, kind, request_payload, queue)
             VALUES (gen_random_uuid(), {owner}, {kind}, '{{}}', {queue})"
        )
    };
    let cases = [
        ("durable_etl_name_check", kind, intake("kind")),
        ("durable_etl_name_check", kind, intake("queue")),
        ("durable_etl_name_check", kind, live("kind")),
        ("durable_etl_name_check", kind, live("queue")),
        (
            "durable_etl_identifier_check",
            code,
            format!(
                "INSERT INTO etl_target_rows (owner_key, dataset, record_key, record,
                     written_by_job)
                 VALUES ({owner}, $1::text, gen_random_uuid()::text, '{{}}', NULL)"
            ),
        ),
        (
            "durable_etl_identifier_check",
            code,
            format!(
                "INSERT INTO etl_job_outcomes (job_id, owner_key, status, attempts, run_at,
                     failure_code)
                 VALUES (gen_random_uuid(), {owner}, 'failed', 1, now(), $1::text)"
            ),
        ),
    ];
    let names = name_candidates();
    for (constraint, pattern, insert) in &cases {
        let mut admitted = 0;
        for name in &names {
            let by_pattern: bool = client
                .query_one("SELECT $1::text ~ $2::text", &[name, pattern])
                .await
                .unwrap()
                .get(0);
            let refused = match client.execute(insert.as_str(), &[name]).await {
                Ok(_) => None,
                Err(e) => e
                    .as_db_error()
                    .map(|d| (d.code().clone(), d.constraint().map(str::to_owned))),
            };
            let expected =
                (!by_pattern).then(|| (SqlState::CHECK_VIOLATION, Some(constraint.to_string())));
            assert_eq!(refused, expected, "{constraint} on {name:?}");
            admitted += usize::from(by_pattern);
        }
        let refused = names.len() - admitted;
        assert!(
            admitted >= 30 && refused >= 30,
            "{constraint}: {admitted} admitted, {refused} refused"
        );
    }
}

#[tokio::test]
async fn the_trigger_notifies_once_per_transaction_and_never_for_deferred_jobs() {
    let db = TestDb::migrated().await;
    let mut listener = Listener::start(&db, &["durable_etl_jobs", "test_sentinel"]).await;
    let mut client = db.client().await;
    register_waiting(&client, "listener").await;

    // One transaction, three due jobs in three statements plus a multi-row insert: one notification.
    let tx = client.transaction().await.unwrap();
    for _ in 0..3 {
        insert_job(&tx, "now()").await;
    }
    tx.commit().await.unwrap();
    // A deferred job alone: no notification.
    insert_job(&client, "now() + interval '1 hour'").await;
    // A second due transaction: one more.
    insert_job(&client, "now() - interval '1 second'").await;
    // A rolled-back transaction: none.
    let tx = client.transaction().await.unwrap();
    insert_job(&tx, "now()").await;
    tx.rollback().await.unwrap();
    client.batch_execute("NOTIFY test_sentinel").await.unwrap();

    let seen = listener.drain_until("test_sentinel").await;
    let wake = (
        "durable_etl_jobs".to_owned(),
        "t 1 default test.noop".to_owned(),
    );
    assert_eq!(seen, vec![wake.clone(), wake]);
    let jobs: i64 = client
        .query_one("SELECT count(*) FROM etl_job_records", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(jobs, 5);
    drop(listener.client);
}

/// 0017: a success may keep no ledger; going down gives such successes the zero ledger releases
/// before it wrote, so the stricter rule holds again, and going up again admits them anew.
#[tokio::test]
async fn migration_0017_admits_successes_without_a_ledger_and_round_trips() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let latest = catalog_snapshot(&client).await;
    let bare = uuid::Uuid::new_v4();
    let bare_sql = format!("'{bare}'");
    assert_eq!(
        refusal(
            &client,
            &outcome_row(&bare_sql, "succeeded", "NULL", CLAIM_ONLY)
        )
        .await,
        None
    );
    let loaded = "gen_random_uuid()";
    assert_eq!(
        refusal(&client, &outcome_row(loaded, "succeeded", "NULL", LEDGER)).await,
        None
    );

    let down = schema::migrate_down_to(&mut client, 16).await.unwrap();
    let above: Vec<i32> = versions_from(17).into_iter().rev().collect();
    assert_eq!((down.changed, down.version), (above, 16));
    let ledger: Vec<String> = first_column(
        &client,
        &format!(
            "SELECT (rows_inserted, rows_updated, rows_unchanged, encode(data_checksum, 'hex'))::text
               FROM etl_job_outcomes WHERE job_id = {bare_sql}"
        ),
    )
    .await;
    assert_eq!(ledger, [format!("(0,0,0,{})", "0".repeat(64))]);
    assert_eq!(
        refusal(
            &client,
            &outcome_row(loaded, "succeeded", "NULL", CLAIM_ONLY)
        )
        .await,
        check("etl_job_outcomes_ledger_iff_succeeded")
    );

    schema::migrate_up(&mut client).await.unwrap();
    assert_eq!(catalog_snapshot(&client).await, latest);
    assert_eq!(
        refusal(
            &client,
            &outcome_row(loaded, "succeeded", "NULL", CLAIM_ONLY)
        )
        .await,
        None
    );
}

/// 0018: a failed job may keep a code its kind declares, never text; going down turns such codes
/// into `handler_failed`, the code releases before it stored.
#[tokio::test]
async fn migration_0018_admits_kind_codes_and_going_down_stores_them_as_handler_failed() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let job = format!("'{}'", uuid::Uuid::new_v4());
    let kind_code = outcome_row(&job, "failed", "'address_bounced'", NO_LEDGER);
    assert_eq!(refusal(&client, &kind_code).await, None);
    schema::migrate_down_to(&mut client, 17).await.unwrap();
    let codes: Vec<String> = first_column(
        &client,
        &format!("SELECT failure_code FROM etl_job_outcomes WHERE job_id = {job}"),
    )
    .await;
    assert_eq!(codes, ["handler_failed"]);
    let again = outcome_row(
        "gen_random_uuid()",
        "failed",
        "'address_bounced'",
        NO_LEDGER,
    );
    assert_eq!(
        refusal(&client, &again).await,
        check("etl_job_outcomes_failure_code_check")
    );
    schema::migrate_up(&mut client).await.unwrap();
    assert_eq!(refusal(&client, &again).await, None);
}

/// 0009: an enqueue notifies only while a replica waits (or when its transaction is stricter
/// than READ COMMITTED, whose older snapshot may miss a registration), and holds the enqueue
/// barrier until it commits; the down script restores the trigger that notifies whoever waits.
#[tokio::test]
async fn migration_0009_makes_enqueues_notify_only_while_a_replica_waits_and_round_trips() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let other = db.client().await;
    let mut listener = Listener::start(&db, &["durable_etl_jobs", "test_sentinel"]).await;
    let latest = catalog_snapshot(&client).await;
    let barrier_free = || async {
        other
            .query_one(
                "SELECT pg_try_advisory_xact_lock(1684370540, hashtext('default'))",
                &[],
            )
            .await
            .unwrap()
            .get::<_, bool>(0)
    };

    // Nobody waits: no notification, but the queue's barrier is held until the commit.
    let tx = client.transaction().await.unwrap();
    insert_due_job_of_8(&tx).await;
    assert!(!barrier_free().await, "an open enqueue holds the barrier");
    tx.commit().await.unwrap();
    assert!(barrier_free().await);
    // A REPEATABLE READ enqueue notifies anyway.
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .start()
        .await
        .unwrap();
    insert_due_job_of_8(&tx).await;
    tx.commit().await.unwrap();
    // Somebody waits: the next enqueue notifies; gone again: it does not.
    register_waiting(&client, "a").await;
    insert_due_job_of_8(&client).await;
    client
        .batch_execute("DELETE FROM etl_waiting_replicas")
        .await
        .unwrap();
    insert_due_job_of_8(&client).await;

    let down = schema::migrate_down_to(&mut client, 8).await.unwrap();
    let from_9 = versions_from(9);
    let reversed: Vec<i32> = from_9.iter().rev().copied().collect();
    assert_eq!((down.changed, down.version), (reversed, 8));
    let table: Vec<Option<String>> =
        first_column(&client, "SELECT to_regclass('etl_waiting_replicas')::text").await;
    assert_eq!(table, [None]);
    // At 8, every enqueue notifies.
    insert_due_job_of_8(&client).await;
    let up = schema::migrate_up(&mut client).await.unwrap();
    assert_eq!((up.changed, up.version), (from_9, schema::latest_version()));
    assert_eq!(catalog_snapshot(&client).await, latest);

    client.batch_execute("NOTIFY test_sentinel").await.unwrap();
    let wake = |payload: &str| ("durable_etl_jobs".to_owned(), payload.to_owned());
    assert_eq!(
        listener.drain_until("test_sentinel").await,
        vec![wake("q default"), wake("t 1 default test.noop"), wake("")],
        "the REPEATABLE READ enqueue, the one while a replica waited, and the one at 8"
    );
    assert_eq!(declared_min_reader(&client, 9).await, 8);
}

/// `versions`, less those above 27: what a test that starts at 27 changes going down.
fn at_most_27(versions: Vec<i32>) -> Vec<i32> {
    versions.into_iter().filter(|v| *v <= 27).collect()
}

/// Records `owner` as a waiting replica of a release before 0024: no queues, kinds or token.
async fn register_untokened(client: &tokio_postgres::Client, owner: &str) {
    client
        .execute(
            "INSERT INTO etl_waiting_replicas (owner_id) VALUES ($1::text)",
            &[&owner],
        )
        .await
        .unwrap();
}

/// Inserts one due pending job of kind `test.noop` in the layout of versions 8 to 19 (no
/// virtual deadline, no queue): its intake row and its live row, in one statement.
async fn insert_due_job_of_8(client: &impl tokio_postgres::GenericClient) {
    client
        .execute(
            "WITH intake AS (
                 INSERT INTO etl_job_intake
                     (id, owner_key, idempotency_key_digest, request_fingerprint, kind,
                      max_attempts, run_at)
                 VALUES (gen_random_uuid(), decode(repeat('07', 32), 'hex'),
                         sha256(gen_random_uuid()::text::bytea), sha256(''), 'test.noop', 5,
                         now())
                 RETURNING id, owner_key, kind, max_attempts, run_at
             )
             INSERT INTO etl_job_records (id, owner_key, kind, request_payload, max_attempts, run_at)
             SELECT id, owner_key, kind, '{}'::jsonb, max_attempts, run_at FROM intake",
            &[],
        )
        .await
        .unwrap();
}

/// The `min_reader_version` the history records for `version`.
async fn declared_min_reader(client: &tokio_postgres::Client, version: i32) -> i32 {
    client
        .query_one(
            "SELECT min_reader_version FROM durable_etl_schema_history WHERE version = $1",
            &[&version],
        )
        .await
        .unwrap()
        .get(0)
}

/// Inserts one pending job of kind `test.noop` due at the `run_at` SQL expression into the wide
/// job table of versions 1 to 7 (one row per job, before 0008 split it); returns its id.
async fn insert_wide_job(
    client: &impl tokio_postgres::GenericClient,
    run_at_sql: &str,
) -> uuid::Uuid {
    let id = uuid::Uuid::now_v7();
    client
        .execute(
            &format!(
                "INSERT INTO etl_job_records
                    (id, owner_key, idempotency_key_digest, request_fingerprint, kind,
                     request_payload, run_at)
                 VALUES ($1, decode(repeat('07', 32), 'hex'), sha256($1::uuid::text::bytea),
                         decode(repeat('07', 32), 'hex'), 'test.noop', '{{}}'::jsonb,
                         {run_at_sql})"
            ),
            &[&id],
        )
        .await
        .unwrap();
    id
}

/// One due job inserted in a transaction that opted out of the trigger's NOTIFY: into the wide
/// table of versions before 0008 if `wide`, else into the current layout.
async fn insert_opted_out(client: &mut tokio_postgres::Client, wide: bool) {
    let tx = client.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL durable_etl.notify = 'off'")
        .await
        .unwrap();
    if wide {
        insert_wide_job(&tx, "now()").await;
    } else {
        insert_job(&tx, "now()").await;
    }
    tx.commit().await.unwrap();
}

/// Migration 0005 changes only the trigger function, so that a transaction with
/// `durable_etl.notify = 'off'` does not notify; at 4 it notifies whatever the setting says.
/// 5 → 4 → 5 restores the catalog exactly, and 0005 keeps releases that know 4 running.
#[tokio::test]
async fn migration_0005_lets_a_transaction_skip_the_trigger_notify_and_round_trips() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let mut listener = Listener::start(&db, &["durable_etl_jobs", "test_sentinel"]).await;
    let latest = catalog_snapshot(&client).await;
    schema::migrate_down_to(&mut client, 5).await.unwrap();
    let at_5 = catalog_snapshot(&client).await;
    insert_opted_out(&mut client, true).await;

    let down = schema::migrate_down_to(&mut client, 4).await.unwrap();
    assert_eq!((down.changed, down.version), (vec![5], 4));
    let at_4 = catalog_snapshot(&client).await;
    let changed: Vec<&String> = at_5.iter().filter(|l| !at_4.contains(l)).collect();
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert!(changed[0]
        .starts_with("function CREATE OR REPLACE FUNCTION public.durable_etl_notify_enqueue()"));
    insert_opted_out(&mut client, true).await;

    let up = schema::migrate_up(&mut client).await.unwrap();
    let latest_version = schema::latest_version();
    assert_eq!((up.changed, up.version), (versions_from(5), latest_version));
    assert_eq!(catalog_snapshot(&client).await, latest);
    register_waiting(&client, "listener").await;
    insert_opted_out(&mut client, false).await;
    insert_job(&client, "now()").await;

    client.batch_execute("NOTIFY test_sentinel").await.unwrap();
    assert_eq!(
        listener.drain_until("test_sentinel").await,
        vec![
            ("durable_etl_jobs".to_owned(), String::new()),
            (
                "durable_etl_jobs".to_owned(),
                "t 1 default test.noop".to_owned()
            )
        ],
        "only the opted-out insert at version 4 and the plain insert at the latest notified"
    );
    assert_eq!(declared_min_reader(&client, 5).await, 4);
}

#[tokio::test]
async fn owner_lock_key_is_stable_and_spreads_owner_ids() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let rows = client
        .query(
            "SELECT durable_etl_owner_lock_key('replica-a'), durable_etl_owner_lock_key('replica-a'),
                    durable_etl_owner_lock_key('replica-b')",
            &[],
        )
        .await
        .unwrap();
    let (a1, a2, b): (i64, i64, i64) = (rows[0].get(0), rows[0].get(1), rows[0].get(2));
    assert_eq!(a1, a2);
    assert_ne!(a1, b);
}

/// The claim of a release that knows only migrations 0001 and 0002, as it shipped.
const CLAIM_SQL_0002: &str = "
WITH due AS (
    SELECT id FROM etl_job_records
     WHERE status = 'pending' AND run_at <= now()
     ORDER BY run_at, id LIMIT $1
     FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE etl_job_records AS j
   SET status = 'running', attempts = j.attempts + 1, lease_claim_id = gen_random_uuid(),
       lease_owner_id = $2, lease_owner_locked = $4,
       lease_expires_at = now() + $3 * interval '1 millisecond', started_at = now(),
       updated_at = now()
  FROM due
 WHERE j.id = due.id
RETURNING j.id";

/// Migration 0003 is not readable by releases that know less: their claims would advance no
/// fencing token and stamp no renewal time. It says so in the history (an older release refuses
/// to start), and an older replica still running when it is applied can claim nothing.
#[tokio::test]
async fn releases_older_than_0003_refuse_it_and_cannot_claim_under_it() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    assert_eq!(declared_min_reader(&client, 3).await, 3);
    let readers = schema::MIGRATIONS.iter().map(|m| m.min_reader_version);
    assert!(
        readers.max() >= Some(3),
        "a release knowing 2 gets schema_too_new"
    );

    let id = insert_job(&client, "now() - interval '1 second'").await;
    let err = client
        .query_typed(
            CLAIM_SQL_0002,
            &[
                (&10i64, Type::INT8),
                (&"old-replica", Type::TEXT),
                (&30_000i64, Type::INT8),
                (&true, Type::BOOL),
            ],
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::CHECK_VIOLATION));
    assert_eq!(
        err.as_db_error().unwrap().constraint(),
        Some("etl_job_records_running_has_renewal")
    );
    let status: String = client
        .query_one("SELECT status FROM etl_job_records WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "pending");
}

/// The SQL block of the retention runbook in `docs/operations.md`, verbatim.
fn retention_runbook() -> String {
    let doc = include_str!("../../docs/operations.md");
    let marker = doc
        .find("the_retention_runbook_deletes_old_jobs_as_written")
        .expect("the runbook names its test");
    let start = marker + doc[marker..].find("```sql\n").unwrap() + "```sql\n".len();
    let end = start + doc[start..].find("```").unwrap();
    doc[start..end].to_owned()
}

/// Inserts one ended job of the test owner with `status`, `finished_at` (an SQL expression) and
/// the job it replaces; returns its id. Failed and cancelled jobs get a code, succeeded ones a
/// ledger.
async fn job_finished(
    client: &tokio_postgres::Client,
    status: &str,
    finished_at: &str,
    replaces: Option<uuid::Uuid>,
) -> uuid::Uuid {
    let id = uuid::Uuid::now_v7();
    insert_ended_jobs(
        client,
        &format!(
            "SELECT $1::uuid AS id, decode(repeat('ab', 32), 'hex') AS owner_key,
                    $2::text AS status,
                    CASE $2 WHEN 'cancelled' THEN 'replaced'
                            WHEN 'failed' THEN 'handler_failed' END AS failure_code,
                    {finished_at} AS finished_at, $3::uuid AS replaces_job_id"
        ),
        &[&id, &status, &replaces],
    )
    .await;
    id
}

/// Writes target row `key` as job `job` (insert or overwrite).
async fn write_target(client: &tokio_postgres::Client, key: &str, job: uuid::Uuid) {
    client
        .execute(
            "INSERT INTO etl_target_rows (owner_key, dataset, record_key, record, written_by_job)
             VALUES (decode(repeat('ab', 32), 'hex'), 'orders', $1, '{}', $2)
             ON CONFLICT (owner_key, dataset, record_key)
             DO UPDATE SET written_by_job = EXCLUDED.written_by_job",
            &[&key, &job],
        )
        .await
        .unwrap();
}

/// The retention runbook, run exactly as `docs/operations.md` prints it, deletes every ended
/// job older than its cutoff (its outcome, with its ledger, its intake row and its attempt
/// history), in several batches, whatever names them: target rows it wrote (they keep their
/// data, without a writer) and jobs that replaced it (old and recent). Recent and live jobs stay.
#[tokio::test]
async fn the_retention_runbook_deletes_old_jobs_as_written() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let old = "now() - interval '31 days'";
    let recent = "now() - interval '1 day'";
    // Succeeded jobs that wrote target rows, one overwriting another's row, one recent.
    let first = job_finished(&client, "succeeded", old, None).await;
    write_target(&client, "a", first).await;
    write_target(&client, "b", first).await;
    let second = job_finished(&client, "succeeded", old, None).await;
    write_target(&client, "b", second).await;
    let kept = job_finished(&client, "succeeded", recent, None).await;
    write_target(&client, "c", kept).await;
    // An old replacement chain, and an old job replaced by a recent one.
    let replaced = job_finished(&client, "cancelled", old, None).await;
    let middle = job_finished(&client, "cancelled", old, Some(replaced)).await;
    job_finished(&client, "succeeded", old, Some(middle)).await;
    let replaced_recently = job_finished(&client, "cancelled", old, None).await;
    let replacer = job_finished(&client, "succeeded", recent, Some(replaced_recently)).await;
    // More old jobs than one batch holds, and an active job.
    insert_ended_jobs(
        &client,
        "SELECT gen_random_uuid() AS id, decode(repeat('cd', 32), 'hex') AS owner_key,
                'failed' AS status, 'handler_failed' AS failure_code,
                now() - interval '40 days' AS finished_at, NULL::uuid AS replaces_job_id
           FROM generate_series(1, 2500)",
        &[],
    )
    .await;
    let pending = insert_job(&client, "now()").await;
    // Attempt history: an old job's (deleted with it), a recent one's and the live job's (kept).
    for job in [first, kept, pending] {
        client
            .execute(
                "INSERT INTO etl_job_attempts (job_id, attempt, started_at, ending, due_at)
                 VALUES ($1, 1, now() - interval '32 days', 'retried', now())",
                &[&job],
            )
            .await
            .unwrap();
    }

    client.batch_execute(&retention_runbook()).await.unwrap();
    let attempts: Vec<uuid::Uuid> = first_column(
        &client,
        "SELECT job_id FROM etl_job_attempts ORDER BY job_id",
    )
    .await;
    assert_eq!(
        attempts,
        vec![kept, pending],
        "an old job's attempts go with it"
    );

    let remaining: Vec<uuid::Uuid> =
        first_column(&client, "SELECT id FROM etl_job_intake ORDER BY id").await;
    assert_eq!(remaining, vec![kept, replacer, pending]);
    let ended: Vec<uuid::Uuid> = first_column(
        &client,
        "SELECT job_id FROM etl_job_outcomes ORDER BY job_id",
    )
    .await;
    assert_eq!(ended, vec![kept, replacer]);
    let live: Vec<uuid::Uuid> = first_column(&client, "SELECT id FROM etl_job_records").await;
    assert_eq!(live, vec![pending]);
    assert_eq!(count(&client, LEDGERS).await, 2, "kept's and replacer's");
    let targets: Vec<(String, Option<uuid::Uuid>)> = client
        .query(
            "SELECT record_key, written_by_job FROM etl_target_rows ORDER BY record_key",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        targets,
        vec![
            ("a".to_owned(), None),
            ("b".to_owned(), None),
            ("c".to_owned(), Some(kept))
        ]
    );
    let replaces: Option<uuid::Uuid> = client
        .query_one(
            "SELECT replaces_job_id FROM etl_job_intake WHERE id = $1",
            &[&replacer],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(replaces, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_waits_for_the_migration_lock_beyond_the_session_timeouts() {
    let db = TestDb::empty().await;
    // Session limits far shorter than the other migration below.
    let short = durable_etl::config::DatabaseConfig {
        lock_timeout: std::time::Duration::from_millis(100),
        statement_timeout: std::time::Duration::from_millis(200),
        ..db.config.clone()
    };
    let mut holder = db.client().await;
    let slow = holder.transaction().await.unwrap();
    slow.execute(
        "SELECT pg_advisory_xact_lock($1)",
        &[&schema::MIGRATION_LOCK_KEY],
    )
    .await
    .unwrap();
    let mut client = durable_etl::db::connect(&short, "migrate").await.unwrap();
    let waiting = tokio::spawn(async move { schema::migrate_up(&mut client).await });
    // Well past both limits, the second migrate is still queued behind the first.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert!(!waiting.is_finished(), "{:?}", waiting.await.unwrap().err());
    slow.commit().await.unwrap();
    let report = waiting.await.unwrap().unwrap();
    assert_eq!(report.version, schema::latest_version());
}

/// Inserts one job that succeeded into the wide job table of versions 1 to 7 (payload cleared,
/// finished now) with its ledger row in `etl_job_responses` (3 rows inserted); returns its id.
async fn insert_wide_succeeded(client: &tokio_postgres::Client) -> uuid::Uuid {
    let job = insert_wide_job(client, "now()").await;
    client
        .batch_execute(&format!(
            "UPDATE etl_job_records
                SET status = 'succeeded', attempts = 1, request_payload = NULL,
                    started_at = now(), finished_at = now(), updated_at = now()
              WHERE id = '{job}';
             {}",
            ledger_row(job)
        ))
        .await
        .unwrap();
    job
}

/// An insert of a ledger row of job `job` into the `etl_job_responses` of versions 1 to 7.
fn ledger_row(job: uuid::Uuid) -> String {
    format!(
        "INSERT INTO etl_job_responses
             (job_id, lease_claim_id, rows_inserted, rows_updated, rows_unchanged, data_checksum)
         VALUES ('{job}', gen_random_uuid(), 3, 0, 0, decode(repeat('00', 32), 'hex'))"
    )
}

/// Migration 0006 takes the ledger's foreign key away (its check cost a quarter of a success's
/// server CPU) but keeps what it did on delete: deleting jobs deletes their ledger rows, whatever
/// deletes them. Its down path puts the key back, dropping ledger rows whose job is gone first.
/// Tested at version 7, the last with that ledger table; 0008 carries the ledger that is left
/// into the outcome of its job, and back.
#[tokio::test]
async fn the_ledger_follows_deleted_jobs_without_a_foreign_key_and_gets_it_back_going_down() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    schema::migrate_down_to(&mut client, 7).await.unwrap();
    let keys: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_constraint
              WHERE conrelid = 'etl_job_responses'::regclass AND contype = 'f'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(keys, 0, "the ledger has no foreign key");
    // Three succeeded jobs with ledger rows; one DELETE of two of them takes both rows.
    let mut jobs = Vec::new();
    for _ in 0..3 {
        jobs.push(insert_wide_succeeded(&client).await);
    }
    client
        .execute(
            "DELETE FROM etl_job_records WHERE id = ANY($1)",
            &[&jobs[..2].to_vec()],
        )
        .await
        .unwrap();
    let left: Vec<uuid::Uuid> = first_column(&client, "SELECT job_id FROM etl_job_responses").await;
    assert_eq!(left, [jobs[2]]);
    // 0008 makes the row that is left its job's outcome, and going back makes it a row again.
    schema::migrate_up(&mut client).await.unwrap();
    let ledgers: Vec<(uuid::Uuid, String, Option<i32>)> = client
        .query("SELECT id, status, rows_inserted FROM etl_jobs", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(ledgers, [(jobs[2], "succeeded".to_owned(), Some(3))]);
    schema::migrate_down_to(&mut client, 7).await.unwrap();
    let left: Vec<uuid::Uuid> = first_column(&client, "SELECT job_id FROM etl_job_responses").await;
    assert_eq!(left, [jobs[2]]);
    // A TRUNCATE fires no DELETE trigger and leaves the row behind; going down drops it and
    // restores the key, which refuses a ledger row without its job again.
    client
        .batch_execute("TRUNCATE etl_job_records CASCADE")
        .await
        .unwrap();
    assert_eq!(count(&client, "etl_job_responses").await, 1);
    schema::migrate_down_to(&mut client, 5).await.unwrap();
    assert_eq!(count(&client, "etl_job_responses").await, 0);
    let refused = client
        .batch_execute(&ledger_row(uuid::Uuid::new_v4()))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some(&SqlState::FOREIGN_KEY_VIOLATION));
}

/// `etl_jobs` shows one row per job in every state, with the documented columns and no other:
/// never the payload, the idempotency-key digest or the request fingerprint.
#[tokio::test]
async fn the_jobs_view_shows_every_job_and_nothing_private() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let columns: Vec<String> = first_column(
        &client,
        "SELECT column_name::text FROM information_schema.columns
          WHERE table_name = 'etl_jobs' ORDER BY ordinal_position",
    )
    .await;
    assert_eq!(
        columns,
        [
            "id",
            "owner_key",
            "kind",
            "status",
            "attempts",
            "max_attempts",
            "run_at",
            "created_at",
            "updated_at",
            "started_at",
            "finished_at",
            "failure_code",
            "failure_record_index",
            "lease_owner_id",
            "lease_claim_id",
            "lease_expires_at",
            "replaces_job_id",
            "cancel_requested",
            "rows_inserted",
            "rows_updated",
            "rows_unchanged",
            "data_checksum",
            "queue",
            "priority",
            "output"
        ]
    );
    // A pending job, a running one with a cancel request, and one that ran and succeeded.
    let pending = insert_job(&client, "now() + interval '1 hour'").await;
    let running = insert_job(&client, "now()").await;
    let succeeded = insert_job(&client, "now()").await;
    client
        .batch_execute(&format!(
            "UPDATE etl_job_records
                SET status = 'running', attempts = 1, lease_owner_id = 'o',
                    lease_claim_id = gen_random_uuid(), lease_expires_at = now() + interval '1 minute',
                    lease_renewed_at = now(), started_at = now()
              WHERE id IN ('{running}', '{succeeded}');
             UPDATE etl_job_records SET cancel_code = 'cancelled' WHERE id = '{running}';"
        ))
        .await
        .unwrap();
    end_job(&client, succeeded, "succeeded", None, Some((3, 1, 0))).await;
    // An outcome written in the four ledger columns (as releases before 0033 do) reads as the
    // same output document the ETL kind records now.
    let output: serde_json::Value = client
        .query_one("SELECT output FROM etl_jobs WHERE id = $1", &[&succeeded])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        (
            &output["rows_inserted"],
            &output["rows_updated"],
            &output["rows_unchanged"]
        ),
        (
            &serde_json::json!(3),
            &serde_json::json!(1),
            &serde_json::json!(0)
        )
    );
    assert_eq!(output["checksum"].as_str().map(str::len), Some(64));
    let rows = client
        .query(
            "SELECT id, status, cancel_requested, lease_owner_id IS NOT NULL, rows_inserted
               FROM etl_jobs ORDER BY status",
            &[],
        )
        .await
        .unwrap();
    let seen: Vec<(uuid::Uuid, String, bool, bool, Option<i32>)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    assert_eq!(
        seen,
        [
            (pending, "pending".to_owned(), false, false, None),
            (running, "running".to_owned(), true, true, None),
            (succeeded, "succeeded".to_owned(), false, false, Some(3)),
        ]
    );
}

/// Every row of `sql`'s single text column, in order.
async fn text_rows(client: &tokio_postgres::Client, sql: &str) -> Vec<String> {
    first_column(client, sql).await
}

/// Every job as `etl_jobs` shows it, one text row each, by id (the columns of versions 7 to 19).
const VIEW_ROWS: &str = "SELECT (id, owner_key, kind, status, attempts, max_attempts, run_at,
        created_at, updated_at, started_at, finished_at, failure_code, failure_record_index,
        lease_owner_id, lease_claim_id, lease_expires_at, replaces_job_id, cancel_requested,
        rows_inserted, rows_updated, rows_unchanged, data_checksum)::text
   FROM etl_jobs ORDER BY id";

/// What the intake of a job holds, from `table` (the wide table of version 7 or the intake of
/// 8), by id.
fn intake_rows(table: &str) -> String {
    format!(
        "SELECT (id, owner_key, idempotency_key_digest, request_fingerprint, kind, max_attempts,
                 run_at, replaces_job_id, created_at)::text
           FROM {table} ORDER BY id"
    )
}

/// The rows of the wide job table of version 7, by id, but for what 0008 does not keep: the
/// legacy cancel request column (it becomes a request row), and the fencing token, lock flag and
/// renewal time of ended jobs.
const WIDE_ROWS: &str = "
    SELECT (id, owner_key, idempotency_key_digest, request_fingerprint, kind, request_payload,
            status, attempts, max_attempts, run_at, lease_owner_id, lease_claim_id,
            lease_expires_at, replaces_job_id, failure_code, failure_record_index, created_at,
            updated_at, started_at, finished_at,
            CASE WHEN status IN ('pending', 'running')
                 THEN (fencing_token, lease_owner_locked, lease_renewed_at)::text END)::text
      FROM etl_job_records ORDER BY id";

/// The ledger rows of version 7 but their commit time, by job.
const LEDGER_ROWS_7: &str = "
    SELECT (job_id, lease_claim_id, rows_inserted, rows_updated, rows_unchanged,
            data_checksum)::text
      FROM etl_job_responses ORDER BY job_id";

/// Migration 0008 moves every job of the wide table: each gets its intake row; pending and
/// running ones keep their live row and payload; succeeded, failed and cancelled ones become
/// outcomes (with the ledger of the succeeded one, under its claim) and lose their row; a legacy
/// cancel request on a live row becomes a request row; target rows and replacements keep their
/// links. `etl_jobs` shows the same jobs before and after. Going down to 7 gives the wide rows
/// back: terminal payloads NULL, the ledger row back in `etl_job_responses`.
#[tokio::test]
async fn migration_0008_moves_live_and_ended_jobs_and_back() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    schema::migrate_down_to(&mut client, 7).await.unwrap();
    let pending = insert_wide_job(&client, "now() + interval '1 hour'").await;
    let running = insert_wide_job(&client, "now() - interval '1 minute'").await;
    let succeeded = insert_wide_job(&client, "now() - interval '2 minutes'").await;
    let failed = insert_wide_job(&client, "now() - interval '3 minutes'").await;
    let cancelled = insert_wide_job(&client, "now() - interval '4 minutes'").await;
    let claim = uuid::Uuid::new_v4();
    client
        .batch_execute(&format!(
            "UPDATE etl_job_records SET request_payload = '{{\"n\": 1}}',
                    replaces_job_id = '{cancelled}'
              WHERE id = '{pending}';
             UPDATE etl_job_records
                SET request_payload = '{{\"n\": 2}}', status = 'running', attempts = 1,
                    fencing_token = 1, lease_owner_id = 'o', lease_claim_id = gen_random_uuid(),
                    lease_expires_at = now() + interval '1 minute', lease_renewed_at = now(),
                    lease_owner_locked = true, started_at = now(),
                    cancel_requested_at = now()
              WHERE id = '{running}';
             UPDATE etl_job_records
                SET request_payload = NULL, status = 'succeeded', attempts = 1,
                    fencing_token = 1, started_at = now() - interval '90 seconds',
                    finished_at = now() - interval '80 seconds',
                    updated_at = now() - interval '80 seconds'
              WHERE id = '{succeeded}';
             INSERT INTO etl_job_responses
                 (job_id, lease_claim_id, rows_inserted, rows_updated, rows_unchanged,
                  data_checksum)
             VALUES ('{succeeded}', '{claim}', 3, 1, 2, decode(repeat('5a', 32), 'hex'));
             INSERT INTO etl_target_rows (owner_key, dataset, record_key, record, written_by_job)
             VALUES (decode(repeat('07', 32), 'hex'), 'orders', 'a', '{{}}', '{succeeded}');
             UPDATE etl_job_records
                SET request_payload = NULL, status = 'failed', attempts = 2, max_attempts = 2,
                    fencing_token = 2, failure_code = 'record_invalid', failure_record_index = 4,
                    started_at = now() - interval '70 seconds',
                    finished_at = now() - interval '60 seconds',
                    updated_at = now() - interval '60 seconds'
              WHERE id = '{failed}';
             UPDATE etl_job_records
                SET request_payload = NULL, status = 'cancelled', failure_code = 'replaced',
                    finished_at = now() - interval '50 seconds',
                    updated_at = now() - interval '50 seconds'
              WHERE id = '{cancelled}';"
        ))
        .await
        .unwrap();
    let view = text_rows(&client, VIEW_ROWS).await;
    let intake = text_rows(&client, &intake_rows("etl_job_records")).await;
    let wide = text_rows(&client, WIDE_ROWS).await;
    let ledger = text_rows(&client, LEDGER_ROWS_7).await;
    assert_eq!((view.len(), ledger.len()), (5, 1));

    let up = schema::migrate_up(&mut client).await.unwrap();
    assert_eq!(up.changed, versions_from(8));
    assert_eq!(text_rows(&client, VIEW_ROWS).await, view);
    assert_eq!(
        text_rows(&client, &intake_rows("etl_job_intake")).await,
        intake
    );
    let live: Vec<(uuid::Uuid, serde_json::Value)> = client
        .query(
            "SELECT id, request_payload FROM etl_job_records ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        live,
        [
            (pending, serde_json::json!({"n": 1})),
            (running, serde_json::json!({"n": 2}))
        ],
        "live jobs keep their payload; ended ones have no live row"
    );
    let outcomes: Vec<(uuid::Uuid, String, Option<String>, Option<uuid::Uuid>)> = client
        .query(
            "SELECT job_id, status, failure_code, lease_claim_id FROM etl_job_outcomes
              ORDER BY job_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        outcomes,
        [
            (succeeded, "succeeded".to_owned(), None, Some(claim)),
            (
                failed,
                "failed".to_owned(),
                Some("record_invalid".to_owned()),
                None
            ),
            (
                cancelled,
                "cancelled".to_owned(),
                Some("replaced".to_owned()),
                None
            ),
        ]
    );
    let requests: Vec<uuid::Uuid> = first_column(
        &client,
        "SELECT id FROM etl_job_records WHERE cancel_code = 'cancelled'",
    )
    .await;
    assert_eq!(
        requests,
        [running],
        "the legacy cancel request is the live row's (0008, then 0013)"
    );
    let writer: Vec<Option<uuid::Uuid>> =
        first_column(&client, "SELECT written_by_job FROM etl_target_rows").await;
    assert_eq!(writer, [Some(succeeded)]);
    let referenced: Vec<String> = first_column(
        &client,
        "SELECT confrelid::regclass::text FROM pg_constraint
          WHERE conname = 'etl_target_rows_written_by_job_fkey'",
    )
    .await;
    assert_eq!(referenced, ["etl_job_intake"]);

    let down = schema::migrate_down_to(&mut client, 7).await.unwrap();
    assert_eq!(
        down.changed,
        versions_from(8).into_iter().rev().collect::<Vec<_>>()
    );
    assert_eq!(text_rows(&client, VIEW_ROWS).await, view);
    assert_eq!(text_rows(&client, WIDE_ROWS).await, wide);
    assert_eq!(
        count(
            &client,
            "etl_job_records WHERE status IN ('succeeded', 'failed', 'cancelled')
               AND request_payload IS NULL"
        )
        .await,
        3,
        "terminal rows are back without their payload"
    );
    assert_eq!(text_rows(&client, LEDGER_ROWS_7).await, ledger);
}

/// Registers `owner` as a replica of release 24 or later waits: with wake token `token`, for any
/// queue and the kinds given (NULL: any), in its row if it has one (parked or not: 0027).
async fn register_with_token(
    client: &tokio_postgres::Client,
    owner: &str,
    token: i64,
    kinds: Option<&[&str]>,
) {
    client
        .execute(
            "INSERT INTO etl_waiting_replicas (owner_id, kinds, wake_token) VALUES ($1::text, $2, $3)
                 ON CONFLICT (owner_id) DO UPDATE
                SET queues = NULL, kinds = EXCLUDED.kinds, wake_token = EXCLUDED.wake_token,
                    refreshed_at = now()",
            &[&owner, &kinds, &token],
        )
        .await
        .unwrap();
}

/// 0024: an enqueue takes (deletes; parks since 0027) one waiting row per due job of a kind that row's replica
/// runs, longest waiting first, and notifies that row's wake token; a row without a token (a
/// release before 0024) is woken by the empty NOTIFY and kept; a deferred job takes nothing. The
/// down script restores the trigger that notifies whoever waits and drops the two columns.
#[tokio::test]
async fn migration_0024_wakes_waiting_replicas_by_token_one_per_job_and_round_trips() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let mut listener = Listener::start(&db, &["durable_etl_jobs", "test_sentinel"]).await;
    let latest = catalog_snapshot(&client).await;
    // The behaviour under test is this migration's, as it was until 0028 replaced it.
    schema::migrate_down_to(&mut client, 27).await.unwrap();

    register_with_token(&client, "a", 11, None).await;
    client.batch_execute("SELECT pg_sleep(0.01)").await.unwrap();
    register_with_token(&client, "b", 22, None).await;
    register_with_token(&client, "other-kind", 33, Some(&["test.other"])).await;
    // A deferred job takes nobody.
    insert_job(&client, "now() + interval '1 hour'").await;
    assert_eq!(waiting_owners(&client).await, ["a", "b", "other-kind"]);
    // One due job: the longest waiting replica that runs its kind.
    insert_job(&client, "now()").await;
    assert_eq!(waiting_owners(&client).await, ["b", "other-kind"]);
    // Two due jobs in one statement: both replicas that run them.
    register_with_token(&client, "a", 11, None).await;
    insert_jobs(&client, "test.noop", &vec![serde_json::json!({}); 2], 5).await;
    assert_eq!(waiting_owners(&client).await, ["other-kind"]);
    // A row without a token (a release before 0024) is woken by the empty NOTIFY and kept.
    register_untokened(&client, "old").await;
    insert_job(&client, "now()").await;
    assert_eq!(waiting_owners(&client).await, ["old", "other-kind"]);

    let down = schema::migrate_down_to(&mut client, 23).await.unwrap();
    assert_eq!(
        (down.changed, down.version),
        (at_most_27(versions_above(23, true)), 23)
    );
    let columns: Vec<String> = first_column(
        &client,
        "SELECT attname::text FROM pg_attribute
          WHERE attrelid = 'etl_waiting_replicas'::regclass AND attname IN ('wake_token', 'kinds')",
    )
    .await;
    assert!(columns.is_empty(), "{columns:?}");
    // At 23, a waiting replica is notified and keeps its row.
    insert_job(&client, "now()").await;
    assert_eq!(waiting_owners(&client).await, ["old", "other-kind"]);
    let up = schema::migrate_up(&mut client).await.unwrap();
    assert_eq!(
        (up.changed, up.version),
        (versions_above(23, false), schema::latest_version())
    );
    assert_eq!(catalog_snapshot(&client).await, latest);

    client.batch_execute("NOTIFY test_sentinel").await.unwrap();
    let mut payloads: Vec<String> = listener
        .drain_until("test_sentinel")
        .await
        .into_iter()
        .map(|(_, payload)| payload)
        .collect();
    assert_eq!(
        payloads.first().map(String::as_str),
        Some("11"),
        "the longest waiting"
    );
    payloads.sort();
    assert_eq!(
        payloads,
        ["", "", "11", "11", "22"],
        "a, then a and b, then the empty wake of the row without a token, and one at 23"
    );
    assert_eq!(declared_min_reader(&client, 24).await, 22);
}

/// The owner ids of the waiting rows (not parked: 0027), in order.
async fn waiting_owners(client: &tokio_postgres::Client) -> Vec<String> {
    first_column(
        client,
        "SELECT owner_id FROM etl_waiting_replicas
          WHERE queues IS DISTINCT FROM '{}' ORDER BY owner_id",
    )
    .await
}

/// The owner ids of the parked rows (0027), in order.
async fn parked_owners(client: &tokio_postgres::Client) -> Vec<String> {
    first_column(
        client,
        "SELECT owner_id FROM etl_waiting_replicas
          WHERE queues = '{}' AND kinds = '{}' ORDER BY owner_id",
    )
    .await
}

/// The intake rows and pending live rows of the database.
async fn enqueued_rows(client: &tokio_postgres::Client) -> (i64, i64) {
    (
        count(client, "etl_job_intake").await,
        count(client, "etl_job_records WHERE status = 'pending'").await,
    )
}

/// Enqueues `n` due jobs of `test.noop` with `payload` and no idempotency key through the
/// library (its unkeyed path), in one statement.
async fn enqueue_unkeyed(client: &tokio_postgres::Client, n: usize, payload: serde_json::Value) {
    let secret = durable_etl::digest::Secret::new(vec![7u8; 32]).unwrap();
    let jobs = (0..n)
        .map(|_| durable_etl::jobs::enqueue::Submission {
            payload: payload.clone(),
            idempotency_key: None,
            max_attempts: 5,
            run_at: None,
            replaces: None,
            queue: None,
            priority: 0,
            concurrency_key: None,
            dated: false,
            retain: None,
        })
        .collect();
    let done = durable_etl::jobs::enqueue::submit(client, &secret, &[1u8; 32], "test.noop", jobs)
        .await
        .unwrap();
    assert_eq!(done.len(), n);
    assert!(done.iter().all(|e| !e.replayed));
}

/// Migration 0025 moves the unkeyed insert into `durable_etl_enqueue_unkeyed`: the library's
/// unkeyed enqueue is then one call of it that inserts the intake and live rows and wakes a
/// waiting replica as the statement did; going down drops the function (the library of 24 sends
/// the insert itself), and up again restores the catalog exactly.
#[tokio::test]
async fn migration_0025_runs_the_unkeyed_enqueue_in_a_function_and_round_trips() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let latest = catalog_snapshot(&client).await;
    // The behaviour under test is this migration's, as it was until 0028 replaced it.
    schema::migrate_down_to(&mut client, 27).await.unwrap();
    let mut listener = Listener::start(&db, &["durable_etl_jobs", "test_sentinel"]).await;
    register_with_token(&client, "a", 11, None).await;
    enqueue_unkeyed(&client, 3, serde_json::json!({"n": 1})).await;
    assert_eq!(enqueued_rows(&client).await, (3, 3));
    assert_eq!(
        count(
            &client,
            "etl_job_records WHERE request_payload = '{\"n\": 1}'"
        )
        .await,
        3,
        "every job keeps its payload"
    );
    assert!(
        waiting_owners(&client).await.is_empty(),
        "the waiting replica was taken"
    );

    let down = schema::migrate_down_to(&mut client, 24).await.unwrap();
    assert_eq!(
        (down.changed, down.version),
        (at_most_27(versions_above(24, true)), 24)
    );
    let functions: Vec<String> = first_column(
        &client,
        "SELECT proname::text FROM pg_proc WHERE proname = 'durable_etl_enqueue_unkeyed'",
    )
    .await;
    assert!(functions.is_empty(), "{functions:?}");
    let up = schema::migrate_up(&mut client).await.unwrap();
    assert_eq!(
        (up.changed, up.version),
        (versions_above(24, false), schema::latest_version())
    );
    assert_eq!(catalog_snapshot(&client).await, latest);
    enqueue_unkeyed(&client, 2, serde_json::json!({})).await;
    assert_eq!(enqueued_rows(&client).await, (5, 5));

    client.batch_execute("NOTIFY test_sentinel").await.unwrap();
    let payloads: Vec<String> = listener
        .drain_until("test_sentinel")
        .await
        .into_iter()
        .map(|(_, payload)| payload)
        .collect();
    assert_eq!(
        payloads,
        ["11"],
        "the call woke the waiting replica by its token"
    );
    assert_eq!(declared_min_reader(&client, 25).await, 22);
}

/// The columns 0026 moves onto its domains, with their domains.
const DOMAIN_COLUMNS: [(&str, &str, &str); 20] = [
    ("etl_job_intake", "owner_key", "durable_etl_digest"),
    (
        "etl_job_intake",
        "idempotency_key_digest",
        "durable_etl_digest",
    ),
    (
        "etl_job_intake",
        "request_fingerprint",
        "durable_etl_digest",
    ),
    ("etl_job_intake", "kind", "durable_etl_name"),
    ("etl_job_intake", "max_attempts", "durable_etl_max_attempts"),
    ("etl_job_intake", "queue", "durable_etl_name"),
    ("etl_job_intake", "priority", "durable_etl_priority"),
    ("etl_job_records", "owner_key", "durable_etl_digest"),
    ("etl_job_records", "kind", "durable_etl_name"),
    (
        "etl_job_records",
        "max_attempts",
        "durable_etl_max_attempts",
    ),
    ("etl_job_records", "lease_owner_id", "durable_etl_owner_id"),
    ("etl_job_records", "queue", "durable_etl_name"),
    ("etl_job_records", "priority", "durable_etl_priority"),
    (
        "etl_job_records",
        "concurrency_key",
        "durable_etl_concurrency_key",
    ),
    ("etl_job_outcomes", "owner_key", "durable_etl_digest"),
    ("etl_job_outcomes", "failure_code", "durable_etl_identifier"),
    ("etl_job_outcomes", "data_checksum", "durable_etl_digest"),
    ("etl_target_rows", "owner_key", "durable_etl_digest"),
    ("etl_target_rows", "dataset", "durable_etl_identifier"),
    ("etl_waiting_replicas", "owner_id", "durable_etl_owner_id"),
];

/// The type of `table.column` as `format_type` names it.
async fn column_type(client: &tokio_postgres::Client, table: &str, column: &str) -> String {
    client
        .query_one(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute
              WHERE attrelid = $1::text::regclass AND attname = $2",
            &[&table, &column],
        )
        .await
        .unwrap()
        .get(0)
}

/// Whether casting `value` (an SQL expression of the domain's base type) to `domain` is refused
/// by the domain's check, `{domain}_check`; panics on any other error.
async fn domain_refuses(client: &tokio_postgres::Client, domain: &str, value: &str) -> bool {
    match client
        .batch_execute(&format!("SELECT ({value})::{domain}"))
        .await
    {
        Ok(()) => false,
        Err(e) => {
            let db = e.as_db_error().unwrap();
            assert_eq!(db.code(), &SqlState::CHECK_VIOLATION, "{domain}: {value}");
            assert_eq!(db.constraint(), Some(format!("{domain}_check").as_str()));
            true
        }
    }
}

/// Migration 0026 moves every one-column check of the tables a job passes through onto a
/// domain: each column is of its domain, no table keeps the CHECK it replaced, each domain
/// admits and refuses at the edges what the CHECK did (the names: see
/// `the_name_checks_admit_exactly_what_their_patterns_did`), and a value written to a column is
/// checked. Going down puts the columns back on their base types with their CHECKs (a bad value
/// is refused by the table again) and drops the domains; up again restores the catalog exactly,
/// and the jobs survive both.
#[tokio::test]
async fn migration_0026_checks_one_column_values_by_domain_and_round_trips() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let latest = catalog_snapshot(&client).await;
    for (table, column, domain) in DOMAIN_COLUMNS {
        assert_eq!(
            column_type(&client, table, column).await,
            domain,
            "{table}.{column}"
        );
    }
    let single_column_checks: Vec<String> = first_column(
        &client,
        "SELECT conname::text FROM pg_constraint
          WHERE contype = 'c' AND array_length(conkey, 1) = 1
            AND conrelid IN ('etl_job_intake'::regclass, 'etl_job_outcomes'::regclass,
                             'etl_target_rows'::regclass, 'etl_waiting_replicas'::regclass)
          ORDER BY 1",
    )
    .await;
    assert_eq!(
        single_column_checks,
        [
            "etl_job_outcomes_attempts_check",
            "etl_job_outcomes_failure_record_index_check",
            "etl_job_outcomes_rows_inserted_check",
            "etl_job_outcomes_rows_unchanged_check",
            "etl_job_outcomes_rows_updated_check",
            "etl_job_outcomes_status_check",
        ],
        "only the outcome's counters and status keep a one-column CHECK"
    );
    let edges = [
        ("durable_etl_digest", "sha256(''::bytea)", false),
        (
            "durable_etl_digest",
            "substring(sha256(''::bytea) from 2)",
            true,
        ),
        (
            "durable_etl_digest",
            "sha256(''::bytea) || '\\x00'::bytea",
            true,
        ),
        ("durable_etl_priority", "0::int2", false),
        ("durable_etl_priority", "9::int2", false),
        ("durable_etl_priority", "(-1)::int2", true),
        ("durable_etl_priority", "10::int2", true),
        ("durable_etl_max_attempts", "1", false),
        ("durable_etl_max_attempts", "100", false),
        ("durable_etl_max_attempts", "0", true),
        ("durable_etl_max_attempts", "101", true),
        ("durable_etl_owner_id", "repeat('é', 128)", false),
        ("durable_etl_owner_id", "''", true),
        ("durable_etl_owner_id", "repeat('a', 129)", true),
        ("durable_etl_concurrency_key", "repeat('a', 255)", false),
        ("durable_etl_concurrency_key", "''", true),
        ("durable_etl_concurrency_key", "repeat('é', 128)", true),
    ];
    for (domain, value, refused) in edges {
        assert_eq!(
            domain_refuses(&client, domain, value).await,
            refused,
            "{domain}: {value}"
        );
    }
    // A value written to a column is checked by its domain.
    enqueue_unkeyed(&client, 2, serde_json::json!({})).await;
    let err = client
        .batch_execute("UPDATE etl_job_records SET priority = 10")
        .await
        .unwrap_err();
    assert_eq!(
        err.as_db_error().unwrap().constraint(),
        Some("durable_etl_priority_check")
    );

    let down = schema::migrate_down_to(&mut client, 25).await.unwrap();
    assert_eq!((down.changed, down.version), (versions_above(25, true), 25));
    for (table, column, _) in DOMAIN_COLUMNS {
        let base = column_type(&client, table, column).await;
        assert!(
            ["bytea", "text", "integer", "smallint"].contains(&base.as_str()),
            "{base}"
        );
    }
    let domains: Vec<String> = first_column(
        &client,
        "SELECT typname::text FROM pg_type WHERE typtype = 'd' AND typname LIKE 'durable_etl_%'",
    )
    .await;
    assert!(domains.is_empty(), "{domains:?}");
    let err = client
        .batch_execute("UPDATE etl_job_records SET priority = 10")
        .await
        .unwrap_err();
    assert_eq!(
        err.as_db_error().unwrap().constraint(),
        Some("etl_job_records_priority_check")
    );
    let up = schema::migrate_up(&mut client).await.unwrap();
    assert_eq!(
        (up.changed, up.version),
        (versions_above(25, false), schema::latest_version())
    );
    assert_eq!(catalog_snapshot(&client).await, latest);
    assert_eq!(enqueued_rows(&client).await, (2, 2));
    assert_eq!(declared_min_reader(&client, 26).await, 23);
}

/// Runs `cycles` wakes of replica `cycled`: it registers, and an enqueue of one due job takes its
/// row. Returns the pages of the waiting table afterwards.
async fn wake_cycles(client: &tokio_postgres::Client, cycles: usize) -> i64 {
    for _ in 0..cycles {
        register_with_token(client, "cycled", 7, None).await;
        insert_job(client, "now()").await;
    }
    client
        .query_one(
            "SELECT pg_relation_size('etl_waiting_replicas') / current_setting('block_size')::int8",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Whether `durable_etl_wake_for_freed` (a permit of the default queue freed outside a
/// completion) notifies, as seen by `listener` before a sentinel.
async fn freed_permit_wakes(client: &tokio_postgres::Client, listener: &mut Listener) -> bool {
    client
        .batch_execute("SELECT durable_etl_wake_for_freed('default'); NOTIFY test_sentinel")
        .await
        .unwrap();
    !listener.drain_until("test_sentinel").await.is_empty()
}

/// Migration 0027: a take parks the woken replica's row (empty queues and kinds) instead of
/// deleting it; a parked row is woken by no enqueue and no freed permit, and registering again
/// updates it in place. So 700 wakes keep the table on one page, where the delete and insert of
/// 0026 spread them over at least three (no vacuum runs in between). Down deletes the parked rows
/// and restores the delete; up again restores the catalog exactly.
#[tokio::test]
async fn migration_0027_parks_a_woken_row_in_place_and_round_trips() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let latest = catalog_snapshot(&client).await;
    // The behaviour under test is this migration's, as it was until 0028 replaced it.
    schema::migrate_down_to(&mut client, 27).await.unwrap();
    let mut listener = Listener::start(&db, &["durable_etl_jobs", "test_sentinel"]).await;

    register_with_token(&client, "a", 11, None).await;
    insert_job(&client, "now()").await;
    assert_eq!(parked_owners(&client).await, ["a"]);
    assert!(waiting_owners(&client).await.is_empty());
    let token: i64 = client
        .query_one("SELECT wake_token FROM etl_waiting_replicas", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(token, 11, "a parked row keeps its token");
    client.batch_execute("NOTIFY test_sentinel").await.unwrap();
    let woken: Vec<String> = listener
        .drain_until("test_sentinel")
        .await
        .into_iter()
        .map(|(_, payload)| payload)
        .collect();
    assert_eq!(woken, ["11"]);
    // A parked row is woken by nothing.
    insert_job(&client, "now()").await;
    assert!(!freed_permit_wakes(&client, &mut listener).await);
    // Registering again un-parks it in place; a freed permit then wakes it.
    register_with_token(&client, "a", 11, None).await;
    assert!(parked_owners(&client).await.is_empty());
    assert!(freed_permit_wakes(&client, &mut listener).await);
    // 0027 kept the table on about one page through these wakes; 0028 no longer writes the
    // table from enqueues at all, so that figure is history and not checked here (under a
    // loaded machine a prune is skipped now and then, and the count is noise).
    wake_cycles(&client, 700).await;
    assert_eq!(
        parked_owners(&client).await,
        ["a", "cycled"],
        "the first wake took the longest waiting, a"
    );
    register_with_token(&client, "a", 11, None).await;

    let down = schema::migrate_down_to(&mut client, 26).await.unwrap();
    assert_eq!(
        (down.changed, down.version),
        (at_most_27(versions_above(26, true)), 26)
    );
    let left: Vec<String> =
        first_column(&client, "SELECT owner_id FROM etl_waiting_replicas").await;
    assert_eq!(left, ["a"], "no parked row is left");
    // At 26 a take deletes the row, and every wake leaves a dead row behind.
    assert!(wake_cycles(&client, 700).await >= 3, "spread over pages");
    let left: Vec<String> =
        first_column(&client, "SELECT owner_id FROM etl_waiting_replicas").await;
    assert!(left.is_empty(), "every take deleted its row: {left:?}");
    let up = schema::migrate_up(&mut client).await.unwrap();
    assert_eq!(
        (up.changed, up.version),
        (versions_above(26, false), schema::latest_version())
    );
    assert_eq!(catalog_snapshot(&client).await, latest);
    assert_eq!(declared_min_reader(&client, 27).await, 27);
}

/// The payloads `durable_etl_wake(queue, kind, jobs)` sends from one transaction of `client` at
/// `isolation`, sorted, as `listener` sees them; and whether that transaction held queue `q`'s
/// enqueue barrier (another session's exclusive try failed) before it committed.
async fn wake_of(
    client: &mut tokio_postgres::Client,
    listener: &mut Listener,
    (isolation, call): (&str, &str),
) -> (Vec<String>, bool) {
    let transaction = client.transaction().await.unwrap();
    transaction
        .batch_execute(&format!(
            "SET TRANSACTION ISOLATION LEVEL {isolation}; SELECT durable_etl_wake({call})"
        ))
        .await
        .unwrap();
    let barrier_free: bool = listener
        .client
        .query_one(
            "SELECT pg_try_advisory_xact_lock(1684370540, hashtext('q'))",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    transaction.commit().await.unwrap();
    listener
        .client
        .batch_execute("NOTIFY test_sentinel")
        .await
        .unwrap();
    let mut woken: Vec<String> = listener
        .drain_until("test_sentinel")
        .await
        .into_iter()
        .map(|(_, payload)| payload)
        .collect();
    woken.sort();
    (woken, !barrier_free)
}

/// 0028's rules, which 0029 keeps in one read: `durable_etl_wake` names up to `jobs` waiting
/// replicas of the queue and kind by token (never a parked one, nor one of another queue or
/// kind) and holds no barrier; for no kind it wakes the whole queue once; with nobody to wake, or
/// the queue paused, it wakes nobody and holds the queue's enqueue barrier to its commit; under
/// REPEATABLE READ it wakes the whole queue.
async fn assert_wake_rules(client: &mut tokio_postgres::Client, listener: &mut Listener) {
    let t = |tokens: &[i64]| -> Vec<String> {
        tokens
            .iter()
            .map(|token| format!("t {token} q k"))
            .collect()
    };
    let rc = "READ COMMITTED";
    assert_eq!(
        wake_of(client, listener, (rc, "'q', 'k', 1")).await,
        (vec![], true)
    );
    client
        .batch_execute(
            "INSERT INTO etl_waiting_replicas (owner_id, queues, kinds, wake_token) VALUES
                 ('a', '{q}', '{k}', 1), ('b', '{q,r}', '{j,k}', 2), ('c', '{q}', '{j}', 3),
                 ('d', '{r}', '{k}', 4), ('e', '{}', '{}', 5)",
        )
        .await
        .unwrap();
    let (one, barrier) = wake_of(client, listener, (rc, "'q', 'k', 1")).await;
    assert!(one == t(&[1]) || one == t(&[2]), "one of a and b: {one:?}");
    assert!(!barrier);
    assert_eq!(
        wake_of(client, listener, (rc, "'q', 'k', 5")).await,
        (t(&[1, 2]), false)
    );
    assert_eq!(
        wake_of(client, listener, (rc, "'q', NULL, 3")).await,
        (vec!["q q".to_string()], false)
    );
    assert_eq!(
        wake_of(client, listener, (rc, "'s', NULL, 1")).await,
        (vec![], false),
        "nobody waits for s (its barrier is not q's)"
    );
    assert_eq!(
        wake_of(client, listener, ("REPEATABLE READ", "'s', 'k', 1")).await,
        (vec!["q s".to_string()], false)
    );
    client
        .batch_execute("INSERT INTO etl_queues (queue, paused) VALUES ('q', true)")
        .await
        .unwrap();
    assert_eq!(
        wake_of(client, listener, (rc, "'q', 'k', 1")).await,
        (vec![], true)
    );
    assert_eq!(
        wake_of(client, listener, (rc, "'q', NULL, 1")).await,
        (vec![], true)
    );
    client
        .batch_execute("DELETE FROM etl_queues; DELETE FROM etl_waiting_replicas")
        .await
        .unwrap();
}

/// Migration 0029: `durable_etl_wake` reads in one statement what 0028 read in two or three, by
/// the same rules (checked at both versions); down restores 0028's function and up again the
/// catalog exactly.
#[tokio::test]
async fn migration_0029_wakes_by_0028s_rules_in_one_read_and_round_trips() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let latest = catalog_snapshot(&client).await;
    let mut listener = Listener::start(&db, &["durable_etl_jobs", "test_sentinel"]).await;
    assert_wake_rules(&mut client, &mut listener).await;

    let down = schema::migrate_down_to(&mut client, 28).await.unwrap();
    assert_eq!((down.changed, down.version), (versions_above(28, true), 28));
    assert_wake_rules(&mut client, &mut listener).await;

    let up = schema::migrate_up(&mut client).await.unwrap();
    assert_eq!(
        (up.changed, up.version),
        (versions_above(28, false), schema::latest_version())
    );
    assert_eq!(catalog_snapshot(&client).await, latest);
    assert_eq!(declared_min_reader(&client, 29).await, 28);
}

/// The library's `migrate` refuses a missing database, as `durable-etl migrate` does without
/// `--create-database` (`database_refused`, nothing created); `db::ensure_database` creates it,
/// after which `migrate` applies every migration.
#[tokio::test]
async fn the_library_refuses_a_missing_database_until_ensure_database_creates_it() {
    let name = format!(
        "{}lib_{}",
        crate::support::TEST_DB_PREFIX,
        uuid::Uuid::new_v4().simple()
    );
    let config = durable_etl::config::DatabaseConfig::new(format!(
        "postgres://postgres@127.0.0.1:5432/{name}"
    ));
    let refused = schema::migrate(&config).await.unwrap_err();
    assert_eq!(refused.code(), Code::DatabaseRefused, "{refused}");
    assert!(matches!(refused, Error::Refused { .. }), "{refused}");
    assert!(!crate::bench::exists(&name).await, "created unasked");
    assert!(durable_etl::db::ensure_database(&config).await.unwrap());
    let report = schema::migrate(&config).await.unwrap();
    assert_eq!(report.version, schema::latest_version());
    let admin = crate::support::connect(&crate::support::admin_config()).await;
    let drop = format!(
        "DROP DATABASE {} WITH (FORCE)",
        durable_etl::db::quote_ident(&name)
    );
    admin.batch_execute(&drop).await.unwrap();
}
