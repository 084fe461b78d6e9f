//! Test support: the template-database harness (`test_db`), a private cluster (`cluster`), a
//! private Citus cluster (`citus`), PgBouncer (`pooler`), the real binary's processes
//! (`binary`), and helpers that observe the database (catalog snapshots, notifications).

#[path = "support/binary.rs"]
mod binary;
#[path = "support/citus.rs"]
mod citus;
#[path = "support/cluster.rs"]
mod cluster;
#[path = "support/pooler.rs"]
mod pooler;
#[path = "support/test_db.rs"]
mod test_db;

pub use binary::{api_key, binary, counter, post_load, submit_load, text_of, until_serving};
pub use citus::Citus;
pub use cluster::{Cluster, Replicated, Replication};
use futures::StreamExt;
pub use pooler::Pooler;
pub use test_db::{admin_config, connect, insert_jobs, TestDb, TEST_DB_PREFIX};
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, NoTls};

/// Every kind the suite's jobs have: what a test that claims by hand (as a replica would) claims.
pub const TEST_KINDS: &[&str] = &[
    "etl.load",
    "noop",
    "test",
    "test.hangs",
    "test.noop",
    "test.scripted",
    "test.welcome",
];

/// A replica `owner_id` that claims jobs by hand and then does nothing: no owner lock, no alive
/// lock, leases of `lease`.
pub fn stalled_claimant(
    owner_id: &str,
    lease: std::time::Duration,
) -> durable_etl::worker::claimer::Claimant<'_> {
    durable_etl::worker::claimer::Claimant {
        owner_id,
        owner_locked: false,
        lease,
        heartbeat_interval: std::time::Duration::from_secs(4),
        alive_locked: false,
        kinds: TEST_KINDS,
    }
}

/// A session of `db` that holds job `id`'s live row (`FOR NO KEY UPDATE`, as a group commit
/// holds it while the job's effects apply) in an open transaction, until it is sent `ROLLBACK`.
pub async fn hold_job_row(db: &TestDb, id: uuid::Uuid) -> Client {
    let holder = db.client().await;
    holder
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM etl_job_records WHERE id = '{id}' FOR NO KEY UPDATE"
        ))
        .await
        .unwrap();
    holder
}

/// The schema of `public`, as sorted text lines: tables and their options, columns, constraints,
/// indexes, triggers and functions. The migration history table is left out.
pub async fn catalog_snapshot(client: &Client) -> Vec<String> {
    let rows = client
        .query(
            "SELECT 'table ' || c.relname || ' ' || coalesce(array_to_string(c.reloptions, ','), '')
               FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
             UNION ALL
             SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
                    || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
                    || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
               FROM pg_attribute a
               JOIN pg_class c ON c.oid = a.attrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace
               LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
              WHERE n.nspname = 'public' AND a.attnum > 0 AND NOT a.attisdropped AND c.relkind = 'r'
             UNION ALL
             SELECT 'constraint ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
               FROM pg_constraint WHERE connamespace = 'public'::regnamespace
             UNION ALL
             SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = 'public'
             UNION ALL
             SELECT 'trigger ' || pg_get_triggerdef(t.oid)
               FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
              WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal
             UNION ALL
             SELECT 'function ' || pg_get_functiondef(p.oid)
               FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace",
            &[],
        )
        .await
        .unwrap();
    let mut lines: Vec<String> = rows
        .iter()
        .map(|r| r.get::<_, String>(0))
        .filter(|line| !line.contains("durable_etl_schema_history"))
        .collect();
    lines.sort();
    lines
}

/// A session that LISTENs and forwards every notification it receives as (channel, payload).
pub struct Listener {
    /// The listening session.
    pub client: Client,
    /// Notifications in arrival order.
    pub notifications: mpsc::UnboundedReceiver<(String, String)>,
}

impl Listener {
    /// Opens a session on `db` that listens on each of `channels`.
    pub async fn start(db: &TestDb, channels: &[&str]) -> Listener {
        let config: tokio_postgres::Config = db.config.url.parse().unwrap();
        let (client, mut connection) = config.connect(NoTls).await.unwrap();
        let (tx, notifications) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(n) = message {
                    let _ = tx.send((n.channel().to_owned(), n.payload().to_owned()));
                }
            }
        });
        for channel in channels {
            client
                .batch_execute(&format!("LISTEN {channel}"))
                .await
                .unwrap();
        }
        Listener {
            client,
            notifications,
        }
    }

    /// Every notification up to (not including) the next one on `sentinel`, which the caller
    /// sends after everything it wants to observe has committed: notifications are delivered in
    /// commit order, so this sees all earlier ones without sleeping.
    pub async fn drain_until(&mut self, sentinel: &str) -> Vec<(String, String)> {
        let mut seen = Vec::new();
        loop {
            let next = tokio::time::timeout(
                std::time::Duration::from_secs(30),
                self.notifications.recv(),
            )
            .await
            .expect("sentinel notification within 30 s")
            .expect("listener alive");
            if next.0 == sentinel {
                return seen;
            }
            seen.push(next);
        }
    }
}

/// Records `owner` as a replica that waits for work of queue `default` and every test kind
/// (migrations 0009, 0024, 0028), with wake token 1, as an idle replica does: while one waits,
/// enqueues of those notify it (`t 1 default <kind>`).
pub async fn register_waiting(client: &impl tokio_postgres::GenericClient, owner: &str) {
    let kinds: Vec<&str> = TEST_KINDS.to_vec();
    client
        .execute(
            "INSERT INTO etl_waiting_replicas (owner_id, queues, kinds, wake_token)
             VALUES ($1::text, '{default}', $2::text[], 1)",
            &[&owner, &kinds],
        )
        .await
        .unwrap();
}

/// Inserts one pending job of kind `test.noop` due at the `run_at` SQL expression: its intake
/// row and its live row (payload `{}`), in one statement on `client`.
pub async fn insert_job(
    client: &impl tokio_postgres::GenericClient,
    run_at_sql: &str,
) -> uuid::Uuid {
    let id = uuid::Uuid::now_v7();
    let digest = vec![7u8; 32];
    client
        .execute(
            &format!(
                "WITH intake AS (
                     INSERT INTO etl_job_intake
                         (id, owner_key, idempotency_key_digest, request_fingerprint, kind,
                          max_attempts, run_at)
                     VALUES ($1, $2::bytea, $3::bytea, $2::bytea, 'test.noop', 5, {run_at_sql})
                     RETURNING id, owner_key, kind, max_attempts, run_at
                 )
                 INSERT INTO etl_job_records
                     (id, owner_key, kind, request_payload, max_attempts, run_at, sort_at)
                 SELECT id, owner_key, kind, '{{}}'::jsonb, max_attempts, run_at, run_at
                   FROM intake"
            ),
            &[&id, &digest, &id.as_bytes().repeat(2)],
        )
        .await
        .unwrap();
    id
}

/// Inserts ended jobs of kind `test.noop`, in one statement: an intake row and an outcome row
/// per row of `rows_sql`, a query (with `params`) returning the columns `id` (uuid), `owner_key`
/// (bytea), `status` and `failure_code` (text), `finished_at` (timestamptz) and
/// `replaces_job_id` (uuid). Each job was accepted and first due a day before it finished, ran
/// once, and, if it succeeded, has a ledger (one row inserted, under a claim of its own).
/// Returns the ids.
pub async fn insert_ended_jobs(
    client: &impl tokio_postgres::GenericClient,
    rows_sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Vec<uuid::Uuid> {
    first_column_of(
        client
            .query(
                &format!(
                    "WITH ended AS (
                         SELECT e.*, e.finished_at - interval '1 day' AS accepted_at
                           FROM ({rows_sql}) AS e
                     ), intake AS (
                         INSERT INTO etl_job_intake
                             (id, owner_key, idempotency_key_digest, request_fingerprint, kind,
                              max_attempts, run_at, replaces_job_id, created_at)
                         SELECT id, owner_key, sha256(id::text::bytea), sha256(id::text::bytea),
                                'test.noop', 5, accepted_at, replaces_job_id, accepted_at
                           FROM ended
                     )
                     INSERT INTO etl_job_outcomes
                         (job_id, owner_key, status, attempts, run_at, lease_claim_id,
                          failure_code, rows_inserted, rows_updated, rows_unchanged,
                          data_checksum, started_at, finished_at)
                     SELECT id, owner_key, status, 1, accepted_at,
                            CASE WHEN status = 'succeeded' THEN gen_random_uuid() END,
                            failure_code,
                            CASE WHEN status = 'succeeded' THEN 1 END,
                            CASE WHEN status = 'succeeded' THEN 0 END,
                            CASE WHEN status = 'succeeded' THEN 0 END,
                            CASE WHEN status = 'succeeded' THEN sha256(id::text::bytea) END,
                            finished_at, finished_at
                       FROM ended
                     RETURNING job_id"
                ),
                params,
            )
            .await
            .unwrap(),
    )
}

/// Ends live job `id` by hand the way a terminal transition does: deletes its live row and
/// appends its outcome with `status` and `failure_code`, in one statement. `ledger` (rows
/// inserted, updated, unchanged) is the response ledger of a `succeeded` outcome, under the
/// row's claim if it is running, else under a new one.
pub async fn end_job(
    client: &impl tokio_postgres::GenericClient,
    id: uuid::Uuid,
    status: &str,
    failure_code: Option<&str>,
    ledger: Option<(i32, i32, i32)>,
) {
    let (inserted, updated, unchanged) = match ledger {
        Some((i, u, n)) => (Some(i), Some(u), Some(n)),
        None => (None, None, None),
    };
    let ended = client
        .execute(
            "WITH ended AS (DELETE FROM etl_job_records WHERE id = $1 RETURNING *)
             INSERT INTO etl_job_outcomes
                 (job_id, owner_key, status, attempts, run_at, lease_claim_id, failure_code,
                  rows_inserted, rows_updated, rows_unchanged, data_checksum, started_at)
             SELECT id, owner_key, $2::text, attempts, run_at,
                    CASE WHEN $4::int4 IS NOT NULL
                         THEN coalesce(lease_claim_id, gen_random_uuid()) END,
                    $3::text, $4, $5, $6,
                    CASE WHEN $4::int4 IS NOT NULL THEN sha256(id::text::bytea) END, started_at
               FROM ended",
            &[&id, &status, &failure_code, &inserted, &updated, &unchanged],
        )
        .await
        .unwrap();
    assert_eq!(ended, 1, "job {id} had a live row");
}

/// A pool on `db` for a worker (role `test`).
pub async fn pool(db: &TestDb) -> durable_etl::db::Pool {
    durable_etl::db::connect_pool(&db.config, "test")
        .await
        .unwrap()
}

/// Ages every running lease past its expiry and runs one recovery pass (judging owners by a
/// 4 s heartbeat, every one reachable); returns how many expired leases it recovered.
pub async fn expire_and_recover(client: &Client) -> u64 {
    client
        .batch_execute(
            "UPDATE etl_job_records SET lease_expires_at = now() - interval '1 second'
              WHERE status = 'running'",
        )
        .await
        .unwrap();
    let judgement = durable_etl::worker::rescuer::Judgement {
        heartbeat_interval: std::time::Duration::from_secs(4),
        reachable_for: std::time::Duration::MAX,
    };
    durable_etl::worker::rescuer::recover(client, judgement)
        .await
        .unwrap()
        .expired
}

/// Starts `count` replicas of 8 slots serving queue `queue` and polling once a minute (so jobs
/// flow only as wakeups bring them), owners `{queue}-0`, `{queue}-1`, …, each running the
/// registry `registry` gives.
pub async fn start_queue_replicas(
    db: &TestDb,
    queue: &str,
    count: usize,
    registry: impl Fn() -> durable_etl::job::handler::Registry,
) -> Vec<durable_etl::Replica> {
    let mut replicas = Vec::new();
    for i in 0..count {
        replicas.push(start_queue_replica(db, queue, &format!("{queue}-{i}"), registry()).await);
    }
    replicas
}

/// Starts one replica of 8 slots serving queue `queue` and polling once a minute, owner
/// `owner_id`, running `registry`.
pub async fn start_queue_replica(
    db: &TestDb,
    queue: &str,
    owner_id: &str,
    registry: durable_etl::job::handler::Registry,
) -> durable_etl::Replica {
    let config = durable_etl::WorkerConfig {
        owner_id: owner_id.to_owned(),
        slots: 8,
        poll_interval: std::time::Duration::from_secs(60),
        queues: durable_etl::queue::parse(queue).unwrap(),
        ..durable_etl::WorkerConfig::default()
    };
    durable_etl::Worker::start(pool(db).await, &db.config, config, registry)
        .await
        .unwrap()
        .spawn()
}

/// One job's lifecycle columns, as `etl_jobs` shows them, and whether it has a live row.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    /// `status`.
    pub status: String,
    /// `attempts`.
    pub attempts: i32,
    /// `failure_code`.
    pub failure_code: Option<String>,
    /// `failure_record_index`.
    pub failure_record_index: Option<i32>,
    /// Whether the job has a live row in `etl_job_records` (the only row that holds its
    /// payload): true while it is pending or running, false once it ended.
    pub live: bool,
    /// Whether the lease columns are all NULL.
    pub lease_cleared: bool,
    /// `lease_claim_id`.
    pub lease_claim_id: Option<uuid::Uuid>,
}

/// Reads job `id`'s lifecycle columns.
pub async fn job_row(client: &impl tokio_postgres::GenericClient, id: uuid::Uuid) -> JobRow {
    let row = client
        .query_one(
            "SELECT v.status, v.attempts, v.failure_code, v.failure_record_index,
                    EXISTS (SELECT 1 FROM etl_job_records j WHERE j.id = v.id),
                    v.lease_owner_id IS NULL AND v.lease_claim_id IS NULL
                        AND v.lease_expires_at IS NULL,
                    v.lease_claim_id
               FROM etl_jobs v WHERE v.id = $1",
            &[&id],
        )
        .await
        .unwrap();
    JobRow {
        status: row.get(0),
        attempts: row.get(1),
        failure_code: row.get(2),
        failure_record_index: row.get(3),
        live: row.get(4),
        lease_cleared: row.get(5),
        lease_claim_id: row.get(6),
    }
}

/// The ledger rows: outcomes of succeeded jobs, each carrying its job's response ledger (a
/// FROM/WHERE tail for [`count`]).
pub const LEDGERS: &str = "etl_job_outcomes WHERE status = 'succeeded'";

/// Asserts what a claim made once the job in `slot` ended, under a cap lowered to `cap`, given
/// `(jobs running before it, jobs it claimed, jobs running after it)`: nothing while the running
/// jobs were at or above the cap, and never more running than the cap (or than before).
pub fn assert_within_lowered_cap(slot: i32, cap: i64, (before, claimed, after): (i64, usize, i64)) {
    assert!(
        claimed == 0 || before < cap,
        "slot {slot} ended: {claimed} claimed while {before} ran"
    );
    assert!(after <= cap.max(before), "slot {slot} ended: {after} run");
}

/// Makes pending job `id` running on its first attempt under owner `owner`, its lease expiring
/// now, as if that owner had claimed it and gone silent.
pub async fn running_under(client: &Client, id: uuid::Uuid, owner: &str) {
    client
        .execute(
            "UPDATE etl_job_records
                SET status = 'running', attempts = 1, lease_owner_id = $2::text,
                    lease_claim_id = gen_random_uuid(), lease_expires_at = now(),
                    lease_renewed_at = now(), started_at = now()
              WHERE id = $1 AND status = 'pending'",
            &[&id, &owner],
        )
        .await
        .map(|n| assert_eq!(n, 1, "job {id} was not pending"))
        .unwrap();
}

/// `SELECT count(*)` of `sql`'s FROM/WHERE tail, e.g. `count(c, LEDGERS)`.
pub async fn count(client: &impl tokio_postgres::GenericClient, from: &str) -> i64 {
    client
        .query_one(&format!("SELECT count(*) FROM {from}"), &[])
        .await
        .unwrap()
        .get(0)
}

/// The first column of every row `sql` returns, in order.
pub async fn first_column<T>(client: &impl tokio_postgres::GenericClient, sql: &str) -> Vec<T>
where
    T: for<'a> tokio_postgres::types::FromSql<'a>,
{
    first_column_of(client.query(sql, &[]).await.unwrap())
}

/// The first column of every row of `rows`, in order.
pub fn first_column_of<T>(rows: Vec<tokio_postgres::Row>) -> Vec<T>
where
    T: for<'a> tokio_postgres::types::FromSql<'a>,
{
    rows.iter().map(|r| r.get(0)).collect()
}

/// Waits (bounded: 3,000 checks 10 ms apart) until `check` holds; panics naming `what` otherwise.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..3000 {
        if check().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// The backend pid of the replica session on `db`, found through `pg_stat_activity`.
pub async fn session_pid(client: &Client, db: &TestDb) -> i32 {
    client
        .query_one(
            "SELECT pid FROM pg_stat_activity
              WHERE datname = $1 AND application_name = 'durable-etl/session'",
            &[&db.name],
        )
        .await
        .unwrap()
        .get(0)
}

/// A free local TCP port (bound once, then released for the caller to use).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Sends signal `sig` (`TERM`, `KILL`, `STOP`, `CONT`) to `child`.
pub fn signal(child: &std::process::Child, sig: &str) {
    let _ = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .stderr(std::process::Stdio::null())
        .status();
}

/// Child processes killed on drop (stopped ones resumed first), so a failing test leaves none
/// running.
pub struct Processes(pub Vec<std::process::Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            signal(child, "CONT");
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts a worker replica of the real binary against `url`, with `RUST_LOG=warn`, `args`, and
/// a 100 ms poll unless `args` sets one; its standard error goes to `stderr`.
pub fn spawn_replica(
    url: &str,
    owner: &str,
    args: &[&str],
    stderr: std::process::Stdio,
) -> std::process::Child {
    spawn_replica_logged(url, owner, args, stderr, "warn")
}

/// [`spawn_replica`] with `RUST_LOG` set to `log`.
pub fn spawn_replica_logged(
    url: &str,
    owner: &str,
    args: &[&str],
    stderr: std::process::Stdio,
    log: &str,
) -> std::process::Child {
    let poll: &[&str] = if args.contains(&"--poll-interval") {
        &[]
    } else {
        &["--poll-interval", "100ms"]
    };
    std::process::Command::new(env!("CARGO_BIN_EXE_durable-etl"))
        .env("DATABASE_URL", url)
        .env("RUST_LOG", log)
        .args(["work", "--owner-id", owner])
        .args(poll)
        .args(args)
        .stderr(stderr)
        .spawn()
        .unwrap()
}

/// The secret the ETL-job helpers digest with.
pub const LOAD_SECRET: &str = "faults-secret-0123456789";

/// The owner digest (of principal `faults`) of every job the ETL-job helpers enqueue.
pub fn load_owner() -> [u8; 32] {
    durable_etl::digest::Secret::new(LOAD_SECRET)
        .unwrap()
        .digest(durable_etl::digest::DigestKind::Principal, b"faults")
}

/// Enqueues `n` ETL jobs through `enqueue_many`, batch by batch, with `max_attempts`. Job `i`
/// upserts `records` target rows of dataset `d` keyed `{prefix}-{i}-{r}`, each with a privacy
/// canary as a field name and as a value. Returns the ids in order.
pub async fn enqueue_loads(
    client: &impl tokio_postgres::GenericClient,
    prefix: &str,
    n: usize,
    records: usize,
    max_attempts: i32,
) -> Vec<uuid::Uuid> {
    use durable_etl::kinds::etl::enqueue::{enqueue_many, NewJob};
    let secret = durable_etl::digest::Secret::new(LOAD_SECRET).unwrap();
    let owner = load_owner();
    let mut ids = Vec::with_capacity(n);
    for batch in (0..n).collect::<Vec<_>>().chunks(500) {
        let requests: Vec<_> = batch
            .iter()
            .map(|&i| load_request(prefix, i, records))
            .collect();
        let keys: Vec<String> = batch.iter().map(|i| format!("{prefix}-{i}")).collect();
        let jobs: Vec<NewJob<'_>> = requests
            .iter()
            .zip(&keys)
            .map(|(request, key)| NewJob {
                idempotency_key: key,
                request,
                max_attempts,
                retain: None,
            })
            .collect();
        let done = enqueue_many(client, &secret, &owner, &jobs).await.unwrap();
        ids.extend(done.iter().map(|e| e.id));
    }
    ids
}

/// The request of load job `i` of `prefix` (see [`enqueue_loads`]): `records` target rows of
/// dataset `d` keyed `{prefix}-{i}-{r}`, each with a privacy canary as a field name and as a value.
pub fn load_request(
    prefix: &str,
    i: usize,
    records: usize,
) -> durable_etl::kinds::etl::request::EtlRequest {
    let rows: Vec<serde_json::Value> = (0..records)
        .map(|r| serde_json::json!({"id": format!("{prefix}-{i}-{r}"), "canary_field": "canary-load-value"}))
        .collect();
    durable_etl::kinds::etl::request::parse(
        &serde_json::json!({"dataset": "d", "key": "id", "records": rows}),
        durable_etl::intake::IntakeLimits::default(),
    )
    .unwrap()
}

/// [`enqueue_loads`] with each job `i` put into the queue and given the concurrency key (if
/// any) that `place(i)` names, at its insert: the ETL kind's enqueue names neither, so these
/// go through the core enqueue every kind uses, with the same submission otherwise. Returns the
/// ids in order.
pub async fn enqueue_placed_loads(
    client: &impl tokio_postgres::GenericClient,
    prefix: &str,
    (n, records, max_attempts): (usize, usize, i32),
    place: impl Fn(usize) -> (&'static str, Option<String>),
) -> Vec<uuid::Uuid> {
    let requests: Vec<_> = (0..n).map(|i| load_request(prefix, i, records)).collect();
    let keys: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    let places: Vec<_> = (0..n).map(place).collect();
    let jobs = requests
        .iter()
        .zip(&keys)
        .zip(&places)
        .map(
            |((request, key), (queue, concurrency_key))| durable_etl::jobs::enqueue::Submission {
                payload: request.to_value(),
                idempotency_key: Some(key),
                max_attempts,
                run_at: request.run_at,
                replaces: request.replaces,
                queue: Some(queue),
                priority: 0,
                concurrency_key: concurrency_key.as_deref(),
                dated: false,
                retain: None,
            },
        )
        .collect();
    let secret = durable_etl::digest::Secret::new(LOAD_SECRET).unwrap();
    let kind = durable_etl::kinds::etl::KIND;
    let done = durable_etl::jobs::enqueue::submit(client, &secret, &load_owner(), kind, jobs).await;
    done.unwrap().iter().map(|e| e.id).collect()
}

/// Waits until every job of the database `client` is on has ended (no live row is left).
pub async fn until_all_terminal(client: &Client) {
    eventually("every job to end", || async move {
        count(client, "etl_job_records").await == 0
    })
    .await;
}

/// Asserts the end-state invariants every fault test shares, from the database: no job left
/// live; every accepted job either live or ended, never both; attempts within `max_attempts`
/// on live rows and outcomes; every succeeded outcome with its whole ledger and no other outcome
/// with any of it; every ledger inserted its target rows fresh (a second commit of the same job
/// would have updated or left rows unchanged); and exactly `targets` target rows, each written
/// by a succeeded job.
pub async fn assert_settled_once(client: &Client, targets: i64) {
    let bad = [
        ("unfinished jobs", "etl_job_records"),
        (
            "jobs both live and ended",
            "etl_job_records j JOIN etl_job_outcomes o ON o.job_id = j.id",
        ),
        (
            "accepted jobs neither live nor ended",
            "etl_job_intake i WHERE NOT EXISTS (SELECT 1 FROM etl_job_records j WHERE j.id = i.id)
               AND NOT EXISTS (SELECT 1 FROM etl_job_outcomes o WHERE o.job_id = i.id)",
        ),
        (
            "live or ended jobs never accepted",
            "(SELECT id FROM etl_job_records UNION ALL SELECT job_id FROM etl_job_outcomes) j
              WHERE NOT EXISTS (SELECT 1 FROM etl_job_intake i WHERE i.id = j.id)",
        ),
        (
            "attempts above max_attempts",
            "etl_job_records WHERE attempts > max_attempts",
        ),
        (
            "ended attempts above max_attempts",
            "etl_job_outcomes o JOIN etl_job_intake i ON i.id = o.job_id
              WHERE o.attempts > i.max_attempts",
        ),
        (
            "succeeded jobs without a whole ledger",
            "etl_job_outcomes WHERE status = 'succeeded'
               AND (lease_claim_id IS NULL OR (output IS NULL AND rows_inserted IS NULL)
                    OR NOT coalesce(output ?& ARRAY['rows_inserted', 'rows_updated',
                                                    'rows_unchanged', 'checksum'], true))",
        ),
        (
            "ledgers of jobs that did not succeed",
            "etl_job_outcomes WHERE status <> 'succeeded'
               AND (output IS NOT NULL OR rows_inserted IS NOT NULL)",
        ),
        (
            "ledgers of a repeated load",
            "etl_job_outcomes WHERE status = 'succeeded'
               AND ((output ->> 'rows_updated')::int <> 0 OR (output ->> 'rows_unchanged')::int <> 0)",
        ),
        (
            "target rows not written by a succeeded job",
            "etl_target_rows t LEFT JOIN etl_job_outcomes o ON o.job_id = t.written_by_job
              WHERE o.status IS DISTINCT FROM 'succeeded'",
        ),
    ];
    for (what, from) in bad {
        assert_eq!(count(client, from).await, 0, "{what}");
    }
    assert_eq!(
        count(client, "etl_target_rows").await,
        targets,
        "target rows"
    );
}

/// The versions of every migration after `version`, newest first when `reversed` (the order
/// going down applies them in), else oldest first.
pub fn versions_above(version: i32, reversed: bool) -> Vec<i32> {
    let mut above: Vec<i32> = durable_etl::schema::MIGRATIONS
        .iter()
        .map(|m| m.version)
        .filter(|v| *v > version)
        .collect();
    if reversed {
        above.reverse();
    }
    above
}
