//! The template-database harness, shared by the integration suite (through `support`) and the
//! library's own unit tests (included by `src/lib.rs` under `cfg(test)`): an isolated database
//! per test, cloned from a migrated template.
//!
//! Invariants:
//! - Every test database is a fresh `CREATE DATABASE … TEMPLATE` of a template migrated once per
//!   set of migrations (its name carries their checksums), so tests run in parallel, in one process
//!   or many (nextest), without seeing each other's rows.
//! - A test database is dropped `WITH (FORCE)` when its guard drops, unless the test is panicking:
//!   then it is kept and its name printed, for inspection (`.ci/run` sweeps leftovers).
//! - The server is `DATABASE_URL` when set, else the local server at 127.0.0.1:5432.

use durable_etl::config::DatabaseConfig;
use durable_etl::db::quote_ident;
use durable_etl::schema;
use sha2::{Digest, Sha256};
use tokio_postgres::{Client, NoTls};

/// Prefix of every database the tests create.
pub const TEST_DB_PREFIX: &str = "durable_etl_test_";

/// Advisory-lock key serialising template creation across test processes.
const TEMPLATE_LOCK_KEY: i64 = 0x6475_7261_626c_6574;

/// The server URL the tests use, pointing at the maintenance database `postgres`.
pub fn admin_config() -> tokio_postgres::Config {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let mut config: tokio_postgres::Config = url.parse().expect("DATABASE_URL must parse");
    config.dbname("postgres");
    config
}

/// Opens a client on `config`, driving its connection on a spawned task.
pub async fn connect(config: &tokio_postgres::Config) -> Client {
    let (client, connection) = config.connect(NoTls).await.expect("connect to PostgreSQL");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// How many statements `client`'s session prepared at the protocol level (not by `PREPARE`).
/// The library's unit tests use it; the integration suite does not.
#[allow(dead_code)]
pub async fn named_statements(client: &Client) -> i64 {
    client
        .query_typed_one(
            "SELECT count(*) FROM pg_prepared_statements WHERE NOT from_sql",
            &[],
        )
        .await
        .expect("count the prepared statements")
        .get(0)
}

/// The URL of database `name` on the test server.
fn url_of(name: &str) -> String {
    let admin = admin_config();
    let host = match admin.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    let port = admin.get_ports().first().copied().unwrap_or(5432);
    let user = admin.get_user().unwrap_or("postgres");
    format!("postgres://{user}@{host}:{port}/{name}")
}

/// The name of the template for this set of migrations.
fn template_name() -> String {
    let mut hasher = Sha256::new();
    for m in schema::MIGRATIONS {
        hasher.update(m.checksum());
    }
    format!(
        "{TEST_DB_PREFIX}tpl_{}",
        &hex::encode(hasher.finalize())[..12]
    )
}

/// Makes sure the migrated template exists, creating it under a cross-process advisory lock.
async fn ensure_template(admin: &Client) -> String {
    let name = template_name();
    admin
        .execute("SELECT pg_advisory_lock($1)", &[&TEMPLATE_LOCK_KEY])
        .await
        .unwrap();
    let ready = admin
        .query_opt(
            "SELECT datistemplate FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .await
        .unwrap()
        .map(|r| r.get::<_, bool>(0));
    if ready != Some(true) {
        let q = quote_ident(&name);
        // Separate statements: a multi-statement batch would be one transaction block.
        for sql in [
            format!("DROP DATABASE IF EXISTS {q} WITH (FORCE)"),
            format!("CREATE DATABASE {q}"),
        ] {
            admin.batch_execute(&sql).await.unwrap();
        }
        {
            let mut client = connect(&url_of(&name).parse().unwrap()).await;
            schema::migrate_up(&mut client)
                .await
                .expect("migrate template");
        }
        // Wait until the migrating session is gone: a template must have no connections.
        admin
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
                &[&name],
            )
            .await
            .unwrap();
        admin
            .batch_execute(&format!("ALTER DATABASE {q} IS_TEMPLATE true"))
            .await
            .unwrap();
    }
    admin
        .execute("SELECT pg_advisory_unlock($1)", &[&TEMPLATE_LOCK_KEY])
        .await
        .unwrap();
    name
}

/// An isolated database, dropped when the guard drops (kept if the test panics).
pub struct TestDb {
    /// The database name.
    pub name: String,
    /// A configuration pointing at it.
    pub config: DatabaseConfig,
}

impl TestDb {
    /// A fresh database with the current schema.
    pub async fn migrated() -> TestDb {
        let admin = connect(&admin_config()).await;
        let template = ensure_template(&admin).await;
        TestDb::create(&admin, Some(&template)).await
    }

    /// A fresh, empty database (no schema at all).
    pub async fn empty() -> TestDb {
        let admin = connect(&admin_config()).await;
        TestDb::create(&admin, None).await
    }

    /// Creates the database, from `template` if given.
    async fn create(admin: &Client, template: Option<&str>) -> TestDb {
        let name = format!("{TEST_DB_PREFIX}{}", uuid::Uuid::new_v4().simple());
        let sql = match template {
            Some(t) => format!(
                "CREATE DATABASE {} TEMPLATE {}",
                quote_ident(&name),
                quote_ident(t)
            ),
            None => format!("CREATE DATABASE {}", quote_ident(&name)),
        };
        admin.batch_execute(&sql).await.unwrap();
        let config = DatabaseConfig {
            url: url_of(&name),
            ..DatabaseConfig::default()
        };
        TestDb { name, config }
    }

    /// A new client on this database (a plain session, outside any pool).
    pub async fn client(&self) -> Client {
        connect(&self.config.url.parse().unwrap()).await
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test failed: keeping database {} for inspection", self.name);
            return;
        }
        let name = self.name.clone();
        // Drop may run inside a runtime, which cannot block; a thread with its own runtime can.
        let dropper = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let admin = connect(&admin_config()).await;
                admin
                    .batch_execute(&format!(
                        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                        quote_ident(&name)
                    ))
                    .await
                    .unwrap();
            });
        });
        let _ = dropper.join();
    }
}

/// Inserts one due pending job per payload, of `kind`, with `max_attempts` (intake rows and live
/// rows, in one statement); returns their ids in insertion order.
pub async fn insert_jobs(
    client: &impl tokio_postgres::GenericClient,
    kind: &str,
    payloads: &[serde_json::Value],
    max_attempts: i32,
) -> Vec<uuid::Uuid> {
    let ids: Vec<uuid::Uuid> = payloads.iter().map(|_| uuid::Uuid::now_v7()).collect();
    client
        .execute(
            "WITH intake AS (
                 INSERT INTO etl_job_intake
                     (id, owner_key, idempotency_key_digest, request_fingerprint, kind,
                      max_attempts, run_at)
                 SELECT t.id, decode(repeat('ab', 32), 'hex'), sha256(t.id::text::bytea),
                        sha256(t.id::text::bytea), $2::text, $4::int4, now() - interval '1 second'
                   FROM unnest($1::uuid[]) AS t(id)
             )
             INSERT INTO etl_job_records
                 (id, owner_key, kind, request_payload, max_attempts, run_at)
             SELECT t.id, decode(repeat('ab', 32), 'hex'), $2::text, t.payload, $4::int4,
                    now() - interval '1 second'
               FROM unnest($1::uuid[], $3::jsonb[]) AS t(id, payload)",
            &[&ids, &kind, &payloads, &max_attempts],
        )
        .await
        .unwrap();
    ids
}
