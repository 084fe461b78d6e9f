//! The schema and its migrations: up/down/up, concurrent migrate, checksum refusal, the
//! release-compatibility check, the CHECK constraints and the enqueue trigger.

use crate::support::{catalog_snapshot, count, first_column, insert_job, Listener, TestDb};
use durable_etl::codes::Code;
use durable_etl::error::{Error, SchemaError};
use durable_etl::schema;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

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
    assert_eq!(
        up.changed,
        (1..=schema::latest_version()).collect::<Vec<_>>()
    );
    assert_eq!(up.version, schema::latest_version());
    let migrated = catalog_snapshot(&client).await;
    assert!(migrated
        .iter()
        .any(|l| l.starts_with("table etl_job_records")));

    let down = schema::migrate_down_to(&mut client, 0).await.unwrap();
    assert_eq!(
        down.changed,
        (1..=schema::latest_version()).rev().collect::<Vec<_>>()
    );
    assert_eq!(down.version, 0);
    assert_eq!(catalog_snapshot(&client).await, before);

    let again = schema::migrate_up(&mut client).await.unwrap();
    assert_eq!(again.changed, up.changed);
    assert_eq!(catalog_snapshot(&client).await, migrated);

    let noop = schema::migrate_up(&mut client).await.unwrap();
    assert!(noop.changed.is_empty());

    // Each intermediate version reached by `down` is exactly the schema its `up` scripts build.
    for target in (1..schema::latest_version()).rev() {
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
    assert_eq!(history, i64::from(schema::latest_version()));
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
    assert_eq!(applied, (1..=schema::latest_version()).collect::<Vec<_>>());
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

/// Inserts a row with the given column overrides and returns the constraint it violated, if any.
async fn violated_constraint(client: &tokio_postgres::Client, set: &str) -> Option<String> {
    let sql = format!(
        "INSERT INTO etl_job_records
            (id, owner_key, idempotency_key_digest, request_fingerprint, kind,
             request_payload, status, failure_code, finished_at)
         SELECT gen_random_uuid(), decode(repeat('ab', 32), 'hex'), decode(md5(random()::text) || md5(random()::text), 'hex'),
                decode(repeat('ef', 32), 'hex'), 'test.noop', v.payload, v.status, v.failure_code,
                v.finished_at
           FROM (SELECT '{{}}'::jsonb AS payload, 'pending'::text AS status,
                        NULL::text AS failure_code, NULL::timestamptz AS finished_at) d,
                LATERAL (SELECT {set}) v"
    );
    match client.batch_execute(&sql).await {
        Ok(()) => None,
        Err(e) => {
            assert_eq!(e.code(), Some(&SqlState::CHECK_VIOLATION));
            Some(
                e.as_db_error()
                    .unwrap()
                    .constraint()
                    .unwrap_or("")
                    .to_owned(),
            )
        }
    }
}

#[tokio::test]
async fn check_constraints_reject_leaky_and_unknown_states() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let ok = "d.payload AS payload, d.status AS status, d.failure_code AS failure_code, d.finished_at AS finished_at";
    assert_eq!(violated_constraint(&client, ok).await, None);
    let terminal_with_payload = "d.payload AS payload, 'failed' AS status, 'record_invalid' AS failure_code, now() AS finished_at";
    assert_eq!(
        violated_constraint(&client, terminal_with_payload)
            .await
            .as_deref(),
        Some("etl_job_records_terminal_payload_cleared")
    );
    let terminal_cleared = "NULL::jsonb AS payload, 'failed' AS status, 'record_invalid' AS failure_code, now() AS finished_at";
    assert_eq!(violated_constraint(&client, terminal_cleared).await, None);
    let unknown_code = "NULL::jsonb AS payload, 'failed' AS status, 'disk_on_fire' AS failure_code, now() AS finished_at";
    assert_eq!(
        violated_constraint(&client, unknown_code).await.as_deref(),
        Some("etl_job_records_failure_code_check")
    );
    let failed_without_code =
        "NULL::jsonb AS payload, 'failed' AS status, NULL AS failure_code, now() AS finished_at";
    assert_eq!(
        violated_constraint(&client, failed_without_code)
            .await
            .as_deref(),
        Some("etl_job_records_failure_code_matches_status")
    );
    let terminal_unfinished = "NULL::jsonb AS payload, 'succeeded' AS status, NULL AS failure_code, NULL::timestamptz AS finished_at";
    assert_eq!(
        violated_constraint(&client, terminal_unfinished)
            .await
            .as_deref(),
        Some("etl_job_records_finished_iff_terminal")
    );
    let running_without_lease = "d.payload AS payload, 'running' AS status, NULL AS failure_code, NULL::timestamptz AS finished_at";
    assert_eq!(
        violated_constraint(&client, running_without_lease)
            .await
            .as_deref(),
        Some("etl_job_records_running_has_lease")
    );
    let unknown_status = "d.payload AS payload, 'paused' AS status, NULL AS failure_code, NULL::timestamptz AS finished_at";
    assert_eq!(
        violated_constraint(&client, unknown_status)
            .await
            .as_deref(),
        Some("etl_job_records_status_check")
    );
}

#[tokio::test]
async fn stored_failure_codes_are_exactly_the_enumerated_list() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let def: String = client
        .query_one(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint
              WHERE conname = 'etl_job_records_failure_code_check'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let mut in_db: Vec<&str> = def.split('\'').skip(1).step_by(2).collect();
    in_db.sort_unstable();
    let mut in_code: Vec<&str> = Code::ALL
        .iter()
        .filter(|c| c.is_stored_failure())
        .map(|c| c.as_str())
        .collect();
    in_code.sort_unstable();
    assert_eq!(in_db, in_code);
}

#[tokio::test]
async fn the_trigger_notifies_once_per_transaction_and_never_for_deferred_jobs() {
    let db = TestDb::migrated().await;
    let mut listener = Listener::start(&db, &["durable_etl_jobs", "test_sentinel"]).await;
    let mut client = db.client().await;

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
    assert_eq!(
        seen,
        vec![
            ("durable_etl_jobs".to_owned(), String::new()),
            ("durable_etl_jobs".to_owned(), String::new()),
        ]
    );
    let jobs: i64 = client
        .query_one("SELECT count(*) FROM etl_job_records", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(jobs, 5);
    drop(listener.client);
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

/// One due job inserted in a transaction that opted out of the trigger's NOTIFY.
async fn insert_opted_out(client: &mut tokio_postgres::Client) {
    let tx = client.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL durable_etl.notify = 'off'")
        .await
        .unwrap();
    insert_job(&tx, "now()").await;
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
    insert_opted_out(&mut client).await;

    let down = schema::migrate_down_to(&mut client, 4).await.unwrap();
    assert_eq!((down.changed, down.version), (vec![5], 4));
    let at_4 = catalog_snapshot(&client).await;
    let changed: Vec<&String> = at_5.iter().filter(|l| !at_4.contains(l)).collect();
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert!(changed[0]
        .starts_with("function CREATE OR REPLACE FUNCTION public.durable_etl_notify_enqueue()"));
    insert_opted_out(&mut client).await;

    let up = schema::migrate_up(&mut client).await.unwrap();
    let latest_version = schema::latest_version();
    assert_eq!(
        (up.changed, up.version),
        ((5..=latest_version).collect::<Vec<_>>(), latest_version)
    );
    assert_eq!(catalog_snapshot(&client).await, latest);
    insert_opted_out(&mut client).await;
    insert_job(&client, "now()").await;

    client.batch_execute("NOTIFY test_sentinel").await.unwrap();
    assert_eq!(
        listener.drain_until("test_sentinel").await,
        vec![("durable_etl_jobs".to_owned(), String::new()); 2],
        "only the opted-out insert at version 4 and the plain insert at 5 notified"
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

/// Inserts one job of the test owner with `status`, `finished_at` (an SQL expression) and the
/// job it replaces; returns its id. Terminal jobs get their code and no payload.
async fn job_finished(
    client: &tokio_postgres::Client,
    status: &str,
    finished_at: &str,
    replaces: Option<uuid::Uuid>,
) -> uuid::Uuid {
    let id = uuid::Uuid::now_v7();
    client
        .execute(
            &format!(
                "INSERT INTO etl_job_records
                     (id, owner_key, idempotency_key_digest, request_fingerprint, kind, status,
                      request_payload, failure_code, finished_at, replaces_job_id)
                 SELECT $1, decode(repeat('ab', 32), 'hex'), sha256($1::uuid::text::bytea),
                        sha256($1::uuid::text::bytea), 'test.noop', $2::text,
                        CASE WHEN $2 = 'pending' THEN '{{}}'::jsonb END,
                        CASE $2 WHEN 'cancelled' THEN 'replaced'
                                WHEN 'failed' THEN 'handler_failed' END,
                        {finished_at}, $3"
            ),
            &[&id, &status, &replaces],
        )
        .await
        .unwrap();
    if status == "succeeded" {
        client
            .execute(
                "INSERT INTO etl_job_responses
                     (job_id, lease_claim_id, rows_inserted, rows_updated, rows_unchanged,
                      data_checksum)
                 VALUES ($1, gen_random_uuid(), 1, 0, 0, sha256($1::uuid::text::bytea))",
                &[&id],
            )
            .await
            .unwrap();
    }
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

/// The retention runbook, run exactly as `docs/operations.md` prints it, deletes every terminal
/// job older than its cutoff, in several batches, whatever names them: target rows it wrote
/// (they keep their data, without a writer), jobs that replaced it (old and recent), and its
/// ledger row. Recent and active jobs stay.
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
    // More old jobs than one batch holds, and active jobs.
    client
        .execute(
            "INSERT INTO etl_job_records
                 (id, owner_key, idempotency_key_digest, request_fingerprint, kind, status,
                  failure_code, finished_at)
             SELECT gen_random_uuid(), decode(repeat('cd', 32), 'hex'), sha256(g::text::bytea),
                    sha256(g::text::bytea), 'test.noop', 'failed', 'handler_failed',
                    now() - interval '40 days'
               FROM generate_series(1, 2500) g",
            &[],
        )
        .await
        .unwrap();
    let pending = job_finished(&client, "pending", "NULL", None).await;

    client.batch_execute(&retention_runbook()).await.unwrap();

    let remaining: Vec<uuid::Uuid> = client
        .query("SELECT id FROM etl_job_records ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(remaining, vec![kept, replacer, pending]);
    assert_eq!(
        count(&client, "etl_job_responses").await,
        2,
        "kept's and replacer's"
    );
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
            "SELECT replaces_job_id FROM etl_job_records WHERE id = $1",
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

/// Migration 0006 takes the ledger's foreign key away (its check cost a quarter of a success's
/// server CPU) but keeps what it did on delete: deleting jobs deletes their ledger rows, whatever
/// deletes them. Its down path puts the key back, dropping ledger rows whose job is gone first.
#[tokio::test]
async fn the_ledger_follows_deleted_jobs_without_a_foreign_key_and_gets_it_back_going_down() {
    let db = TestDb::migrated().await;
    let mut client = db.client().await;
    let ledger_row = |job: uuid::Uuid| {
        format!(
            "INSERT INTO etl_job_responses
                 (job_id, lease_claim_id, rows_inserted, rows_updated, rows_unchanged, data_checksum)
             VALUES ('{job}', gen_random_uuid(), 0, 0, 0, decode(repeat('00', 32), 'hex'))"
        )
    };
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
        let job = insert_job(&client, "now()").await;
        client.batch_execute(&ledger_row(job)).await.unwrap();
        jobs.push(job);
    }
    client
        .execute(
            "DELETE FROM etl_job_records WHERE id = ANY($1)",
            &[&jobs[..2].to_vec()],
        )
        .await
        .unwrap();
    let left: Vec<uuid::Uuid> = client
        .query("SELECT job_id FROM etl_job_responses", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
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
            "data_checksum"
        ]
    );
    // A pending job, a running one with a cancel request, a succeeded one with its ledger row.
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
             INSERT INTO etl_job_cancel_requests (job_id) VALUES ('{running}');
             UPDATE etl_job_records
                SET status = 'succeeded', request_payload = NULL, finished_at = now(),
                    lease_owner_id = NULL, lease_claim_id = NULL, lease_expires_at = NULL,
                    lease_renewed_at = NULL
              WHERE id = '{succeeded}';
             INSERT INTO etl_job_responses
                 (job_id, lease_claim_id, rows_inserted, rows_updated, rows_unchanged, data_checksum)
             VALUES ('{succeeded}', gen_random_uuid(), 3, 1, 0, decode(repeat('00', 32), 'hex'));"
        ))
        .await
        .unwrap();
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
