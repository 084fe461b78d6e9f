//! Racing migrations with a crash: three `durable-etl migrate` processes on an empty database,
//! one SIGKILLed in the middle of a migration's DDL.

use crate::support::{catalog_snapshot, count, eventually, signal, Processes, TestDb};
use std::process::{Child, Command, Stdio};

/// Starts `durable-etl migrate` on `db`.
fn migrate(db: &TestDb) -> Child {
    Command::new(env!("CARGO_BIN_EXE_durable-etl"))
        .env("DATABASE_URL", &db.config.url)
        .env("RUST_LOG", "warn")
        .arg("migrate")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The first migrator stalls in its third DDL command (an event trigger sleeps there, once:
/// sequences ignore rollback) and is SIGKILLed while the two others wait for the migration
/// lock. They finish the work; a final `migrate` finds nothing to do; the schema equals the
/// normal migrated schema and each version is recorded once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_racing_migrations_with_one_killed_mid_ddl_leave_the_normal_schema() {
    let db = TestDb::empty().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE SCHEMA chaos;
             CREATE SEQUENCE chaos.ddl_seen;
             CREATE FUNCTION chaos.stall() RETURNS event_trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF nextval('chaos.ddl_seen') = 3 THEN PERFORM pg_sleep(60); END IF;
             END $$;
             CREATE EVENT TRIGGER stall_migration ON ddl_command_end
                 EXECUTE FUNCTION chaos.stall()",
        )
        .await
        .unwrap();
    let mut migrators = Processes(vec![migrate(&db)]);
    eventually("the first migrator to stall mid-DDL", || {
        let client = &client;
        async move {
            count(
                client,
                "pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep'",
            )
            .await
                == 1
        }
    })
    .await;
    migrators.0.push(migrate(&db));
    migrators.0.push(migrate(&db));
    eventually("the others to wait for the migration lock", || {
        let client = &client;
        async move {
            count(
                client,
                "pg_locks WHERE locktype = 'advisory' AND NOT granted
                   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            )
            .await
                == 2
        }
    })
    .await;
    signal(&migrators.0[0], "KILL");
    migrators.0[0].wait().unwrap();
    for other in &mut migrators.0[1..] {
        assert_eq!(other.wait().unwrap().code(), Some(0));
    }
    assert_eq!(migrate(&db).wait().unwrap().code(), Some(0));
    client
        .batch_execute("DROP EVENT TRIGGER stall_migration; DROP SCHEMA chaos CASCADE")
        .await
        .unwrap();
    let normal = TestDb::migrated().await;
    assert_eq!(
        catalog_snapshot(&client).await,
        catalog_snapshot(&normal.client().await).await
    );
    assert_eq!(
        count(&client, "durable_etl_schema_history").await,
        durable_etl::schema::MIGRATIONS.len() as i64
    );
    assert_eq!(
        count(
            &client,
            "(SELECT DISTINCT version FROM durable_etl_schema_history) v"
        )
        .await,
        durable_etl::schema::MIGRATIONS.len() as i64
    );
}
