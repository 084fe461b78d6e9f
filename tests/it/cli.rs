//! The binary's command-line contract: exit codes, messages, `migrate` and `api-keys`.

use crate::support::{admin_config, connect, count, Processes, TestDb, TEST_DB_PREFIX};
use durable_etl::db::quote_ident;
use durable_etl::digest::Secret;
use durable_etl::service::api_keys;
use std::process::{Command, Output};

/// A secret for tests.
const SECRET: &str = "test-secret-0123456789";

/// Runs the binary with `args` against `url`, with a clean durable-etl environment.
fn run(url: &str, args: &[&str]) -> Output {
    run_with(url, args, &[])
}

/// [`run`] with extra environment variables (they win over its own).
fn run_with(url: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_durable-etl"));
    for (key, _) in std::env::vars() {
        if key.starts_with("DURABLE_ETL_") {
            command.env_remove(key);
        }
    }
    command
        .env("DATABASE_URL", url)
        .env("DURABLE_ETL_SECRET", SECRET)
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .args(args)
        .output()
        .expect("run durable-etl")
}

/// Drops database `name` (one a test made through the binary), disconnecting its sessions.
async fn drop_database(name: &str) {
    let admin = connect(&admin_config()).await;
    let sql = format!("DROP DATABASE {} WITH (FORCE)", quote_ident(name));
    admin.batch_execute(&sql).await.unwrap();
}

/// The process's standard error as text.
fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts that the process exited with `code` and said `message` on standard error, which it
/// returns.
fn assert_failed(output: &Output, code: i32, message: &str) -> String {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(code), "{err}");
    assert!(err.contains(message), "no {message:?} in: {err}");
    err
}

#[tokio::test]
async fn work_refuses_an_unmigrated_database_with_exit_4() {
    let db = TestDb::empty().await;
    let out = run(&db.config.url, &["work"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("run `durable-etl migrate`"), "{err}");
    assert!(err.contains("[schema_too_old]"), "{err}");
}

#[tokio::test]
async fn work_refuses_a_schema_from_a_newer_incompatible_release_with_exit_4() {
    let db = TestDb::migrated().await;
    db.client()
        .await
        .execute(
            "INSERT INTO durable_etl_schema_history
                 (version, name, checksum, min_reader_version, applied_by_release)
             VALUES (1000, 'future', 'x', 1000, '99.0.0')",
            &[],
        )
        .await
        .unwrap();
    let out = run(&db.config.url, &["work"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains("[schema_too_new]"));
}

#[test]
fn an_unreachable_database_exits_3_naming_the_target_and_the_cause() {
    let out = run(
        "postgres://postgres:canary-password-7d1e@127.0.0.1:1/nowhere",
        &["work", "--owner-id", "x", "--startup-timeout", "1s"],
    );
    let unreachable = "database unavailable at 127.0.0.1:1 (database \"nowhere\", role \"postgres\"): connection refused";
    let err = assert_failed(&out, 3, unreachable);
    assert!(err.contains("[database_unavailable]"), "{err}");
    assert!(!err.contains("canary-password-7d1e"), "{err}");
}

/// A start-up that keeps failing says where and why on its first retry (address, database,
/// role, stable code, cause; never the password), then at most once per 10 s, not once per
/// attempt.
#[test]
fn start_up_retries_name_the_target_and_cause_once_not_every_attempt() {
    let out = run(
        "postgres://postgres:canary-password-7d1e@127.0.0.1:1/nowhere",
        &["work", "--owner-id", "x", "--startup-timeout", "5s"],
    );
    let err = assert_failed(&out, 3, "database unavailable at 127.0.0.1:1");
    let retries: Vec<&str> = err
        .lines()
        .filter(|line| line.contains("start-up step failed; retrying"))
        .collect();
    // 5 s of retries (pauses doubling from 100 ms to 2 s) fit in one 10 s interval: one line.
    assert_eq!(retries.len(), 1, "{err}");
    for said in [
        "127.0.0.1:1",
        "nowhere",
        "postgres",
        "database_unavailable",
        "connection refused",
    ] {
        assert!(retries[0].contains(said), "no {said:?} in: {}", retries[0]);
    }
    assert!(!err.contains("canary-password-7d1e"), "{err}");
}

/// What retrying cannot fix fails at once, naming the target and the server's SQLSTATE: a role
/// the server does not know (SQLSTATE class 28, as a wrong password or a server that requires
/// TLS), and a database that does not exist (3D000); a server that does not speak the TLS the
/// URL requires, or whose certificate is refused, in `tls`. Never the password; no retry.
#[tokio::test]
async fn a_refused_role_or_missing_database_exits_2_at_once_naming_both() {
    let db = TestDb::migrated().await;
    let (host, port) = ("127.0.0.1", 5432);
    let name = db.config.url.rsplit('/').next().unwrap().to_owned();
    let missing = format!("{TEST_DB_PREFIX}missing_{}", uuid::Uuid::new_v4().simple());
    let cases = [
        (
            format!("postgres://no_such_role_4b2c:canary-password-7d1e@{host}:{port}/{name}"),
            format!("{host}:{port} (database \"{name}\", role \"no_such_role_4b2c\")"),
            "the role may not connect",
            "(SQLSTATE 28000) [database_refused]",
        ),
        (
            format!("postgres://postgres@{host}:{port}/{missing}"),
            format!("{host}:{port} (database \"{missing}\", role \"postgres\")"),
            "the database does not exist",
            "(SQLSTATE 3D000) [database_refused]",
        ),
    ];
    for (url, target, reason, tail) in cases {
        for command in [
            &["work", "--owner-id", "x"][..],
            &["serve"],
            &["api-keys", "revoke", &uuid::Uuid::nil().to_string()],
        ] {
            let mut args = command.to_vec();
            args.extend(["--startup-timeout", "20s"]);
            let out = run(&url, &args);
            let refused =
                format!("the database server at {target} refused the connection: {reason}");
            let err = assert_failed(&out, 2, &refused);
            assert!(err.contains(tail), "{err}");
            assert!(!err.contains("canary-password-7d1e"), "{err}");
            assert!(!err.contains("retrying"), "retried what cannot pass: {err}");
        }
    }
}

/// A pooler answers every refusal with SQLSTATE 08P01: those retrying cannot fix (a database or a
/// role it does not know, the startup parameter that carries the session limits) end start-up at
/// once, naming the pooler's address, what the refusal means and the SQLSTATE; a known database
/// whose server is down is retried until the start-up timeout.
#[tokio::test]
async fn a_poolers_refusal_of_an_unknown_database_or_role_exits_2_at_once() {
    let db = TestDb::migrated().await;
    let name = db.config.url.rsplit('/').next().unwrap().to_owned();
    let down = crate::support::free_port();
    let databases = format!(
        "known = host=127.0.0.1 port=5432 dbname={name}\n\
         down = host=127.0.0.1 port={down} dbname={name}"
    );
    let pooler = crate::support::Pooler::start("session", &databases);
    let strict = crate::support::Pooler::start_with("session", &databases, "");
    let cases = [
        (
            pooler.url("postgres", "no_such_db_in_the_pooler"),
            "a pooler does not know the database",
        ),
        (
            pooler.url("no_such_role_4b2c", "known"),
            "a pooler refused the role's authentication",
        ),
        (
            strict.url("postgres", "known"),
            "a pooler rejects the startup parameter `options`",
        ),
    ];
    for (url, meaning) in cases {
        let started = std::time::Instant::now();
        let out = run(&url, &["work", "--startup-timeout", "30s"]);
        let err = assert_failed(&out, 2, &format!("refused the connection: {meaning}"));
        assert!(err.contains("(SQLSTATE 08P01) [database_refused]"), "{err}");
        assert!(!err.contains("retrying"), "retried what cannot pass: {err}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "waited for the start-up timeout: {err}"
        );
    }
    let out = run(
        &pooler.url("postgres", "down"),
        &["work", "--startup-timeout", "3s"],
    );
    let err = assert_failed(&out, 3, "database unavailable at 127.0.0.1:");
    assert!(err.contains("[database_unavailable]"), "{err}");
    let nil = uuid::Uuid::nil().to_string();
    let out = run(
        &pooler.url("postgres", "known"),
        &["api-keys", "revoke", &nil],
    );
    assert_failed(&out, 1, "[not_found]");
}

#[test]
fn configuration_errors_exit_2_and_name_the_relation() {
    let url = "postgres://postgres@127.0.0.1:1/nowhere";
    let out = run(
        url,
        &["work", "--lease", "3s", "--heartbeat-interval", "1s"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("heartbeat interval must be under a third of the lease"));
    let out = run(url, &["work", "--slots", "0"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(url, &["work", "--poll-interval", "soon"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("expected a duration such as 500ms, 2s or 1m"));
    let out = run("not a url at all", &["migrate"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("[config_invalid]"));
}

/// A duration or a count that cannot work is refused at start (exit 2, `config_invalid`),
/// naming its bound; the bounds themselves pass validation (and reach the database: exit 3).
#[test]
fn options_outside_their_bounds_exit_2_naming_the_bound() {
    let url = "postgres://postgres@127.0.0.1:1/nowhere";
    let quick = [("DURABLE_ETL_STARTUP_TIMEOUT", "1s")];
    for (args, message) in [
        (&["work", "--lease", "1ms"][..], "lease must be at least 1s"),
        (
            &["work", "--heartbeat-interval", "10ms"],
            "heartbeat interval must be at least 100ms",
        ),
        (
            &["work", "--execution-timeout", "1ms"],
            "execution timeout must be at least 10ms",
        ),
        (
            &["work", "--statement-timeout", "500us"],
            "statement timeout must be at least 1ms",
        ),
        (
            &["work", "--connect-timeout", "1ms"],
            "connect timeout must be at least 10ms",
        ),
        (
            &["work", "--pool-size", "100000"],
            "pool max size must be between 1 and 1000",
        ),
        (
            &["serve", "--max-concurrency", "18446744073709551615"],
            "max concurrency must be 1 to 65536",
        ),
    ] {
        let out = run_with(url, args, &quick);
        let err = assert_failed(&out, 2, message);
        assert!(err.contains("[config_invalid]"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    let at_the_bounds = [
        "work",
        "--lease",
        "1s",
        "--heartbeat-interval",
        "100ms",
        "--execution-timeout",
        "10ms",
        "--pool-size",
        "1000",
    ];
    let out = run_with(url, &at_the_bounds, &quick);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
}

#[test]
fn a_lease_alone_derives_a_heartbeat_that_fits_it() {
    // Nothing listens on port 1: passing validation means reaching the database (exit 3).
    let url = "postgres://postgres@127.0.0.1:1/nowhere";
    for lease in ["3s", "1s", "90s"] {
        let out = run_with(
            url,
            &["work", "--lease", lease],
            &[("DURABLE_ETL_STARTUP_TIMEOUT", "1s")],
        );
        assert_eq!(
            out.status.code(),
            Some(3),
            "--lease {lease}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn absurd_durations_exit_2_without_a_panic() {
    let url = "postgres://postgres@127.0.0.1:1/nowhere";
    for flag in [
        "--heartbeat-interval",
        "--execution-timeout",
        "--lease",
        "--shutdown-grace",
        "--retry-max-delay",
        "--statement-timeout",
        "--idle-in-transaction-timeout",
    ] {
        let out = run(url, &["work", flag, "7000000000000000000s"]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(err.contains("must be at most"), "{flag}: {err}");
        assert!(!err.contains("panicked"), "{flag}: {err}");
    }
}

#[test]
fn help_documents_every_flag_and_its_environment_variable() {
    let out = run("postgres://x@127.0.0.1:1/x", &["work", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--owner-id",
        "--slots",
        "--poll-interval",
        "--lease",
        "--metrics-listen",
        "--heartbeat-interval",
        "--database-url",
        "--statement-timeout",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
    assert!(help.contains("DURABLE_ETL_SLOTS"));
    assert!(!help.contains(SECRET), "secrets are never shown");
}

/// Each command's help leads with its own flags; the connection flags every command shares come
/// after them, under their own heading, with the log format last.
#[test]
fn each_commands_help_leads_with_its_own_flags() {
    for (command, own) in [
        ("work", "--owner-id"),
        ("serve", "--listen"),
        ("migrate", "--down-to"),
        ("demo", "--demo-database"),
    ] {
        let out = run("postgres://x@127.0.0.1:1/x", &[command, "--help"]);
        assert_eq!(out.status.code(), Some(0));
        let help = String::from_utf8_lossy(&out.stdout);
        let at = |what: &str| help.find(what).unwrap_or(usize::MAX);
        let heading = at("Database connection (every command):");
        assert!(
            at(own) < heading,
            "{command}: {own} after the shared flags:\n{help}"
        );
        assert!(heading < at("--database-url"), "{command}:\n{help}");
        assert!(
            at("--database-url") < at("Logging (every command):"),
            "{command}:\n{help}"
        );
        assert!(heading < usize::MAX, "{command}: no heading:\n{help}");
    }
}

/// `migrate` refuses a missing database at once, as every command does (exit 2,
/// `database_refused`, creating nothing), and creates it only when asked with
/// `--create-database`; then it applies and reverses the migrations.
#[tokio::test]
async fn migrate_creates_a_missing_database_only_when_asked_then_reverses_it() {
    let name = format!("{TEST_DB_PREFIX}cli_{}", uuid::Uuid::new_v4().simple());
    let url = format!("postgres://postgres@127.0.0.1:5432/{name}");
    let out = run(&url, &["migrate", "--startup-timeout", "20s"]);
    let err = assert_failed(&out, 2, "the database does not exist");
    assert!(err.contains("migrate --create-database"), "{err}");
    assert!(err.contains("[database_refused]"), "{err}");
    assert!(!err.contains("retrying"), "retried what cannot pass: {err}");
    assert!(!crate::bench::exists(&name).await, "created unasked");
    let out = run(&url, &["migrate", "--create-database"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let n = durable_etl::schema::MIGRATIONS.len();
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("{n} migration(s) applied")));
    let again = run_with(&url, &["migrate"], &[("RUST_LOG", "info")]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(
        (again.stdout.len(), again.stderr.len()),
        (0, 0),
        "an already migrated database says nothing at info: {}",
        stderr(&again)
    );
    // A version this release does not know is refused before anything is touched.
    for version in [n + 1, 99] {
        let out = run(&url, &["migrate", "--down-to", &version.to_string()]);
        let known =
            format!("--down-to {version} is not a schema version this release knows (0 to {n})");
        assert_failed(&out, 2, &known);
    }
    let out = run(&url, &["migrate", "--down-to", "-1"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let down = run(&url, &["migrate", "--down-to", "0"]);
    assert_eq!(down.status.code(), Some(0), "{}", stderr(&down));
    assert!(String::from_utf8_lossy(&down.stdout)
        .contains(&format!("schema at version 0 ({n} migration(s) reversed)")));
    drop_database(&name).await;
}

#[tokio::test]
async fn api_keys_are_printed_once_stored_as_digests_and_revocable() {
    let db = TestDb::migrated().await;
    let out = run(
        &db.config.url,
        &["api-keys", "create", "--owner", "canary-owner-5f3a"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |prefix: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map(|v| v.trim().to_owned())
            .unwrap()
    };
    let id = field("id:");
    let key = field("key:");
    assert!(key.starts_with(api_keys::API_KEY_PREFIX));

    let client = db.client().await;
    let secret = Secret::new(SECRET).unwrap();
    let owner = api_keys::authenticate(&client, &secret, &key)
        .await
        .unwrap();
    assert_eq!(
        owner,
        Some(secret.digest(
            durable_etl::digest::DigestKind::Principal,
            b"canary-owner-5f3a"
        ))
    );
    assert_eq!(
        api_keys::authenticate(&client, &secret, "detl_wrong")
            .await
            .unwrap(),
        None
    );
    let dump: String = client
        .query_one(
            "SELECT string_agg(t::text, ' ') FROM etl_api_clients t",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!dump.contains("canary-owner-5f3a"));
    assert!(!dump.contains(&key[api_keys::API_KEY_PREFIX.len()..]));

    let out = run(&db.config.url, &["api-keys", "revoke", &id]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("revoked"));
    assert_eq!(
        api_keys::authenticate(&client, &secret, &key)
            .await
            .unwrap(),
        None
    );
    // Revoking it again, or a key that never was, names the id and fails.
    for id in [id.clone(), uuid::Uuid::new_v4().to_string()] {
        let out = run(&db.config.url, &["api-keys", "revoke", &id]);
        let named = format!("no live API key has the id {id} [not_found]");
        assert_failed(&out, 1, &named);
    }
    let out = run(
        &db.config.url,
        &["api-keys", "create", "--owner", "x", "--secret", "short"],
    );
    assert_eq!(out.status.code(), Some(2));
}

#[tokio::test]
async fn work_starts_on_a_compatible_schema_and_exits_0_on_sigterm() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let db = TestDb::migrated().await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_durable-etl"))
        .env("DATABASE_URL", &db.config.url)
        .env("RUST_LOG", "info")
        .args(["work", "--owner-id", "cli-test-replica"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let started = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains("worker starting"))
        .unwrap();
    assert!(started.contains("cli-test-replica"), "{started}");
    let serving = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains("replica started"))
        .unwrap();
    for what in [
        "queues=default:1",
        "kinds=",
        "etl.load",
        "slots=",
        "prefetch=",
    ] {
        assert!(serving.contains(what), "no {what} in: {serving}");
    }
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
}

#[tokio::test]
async fn serve_answers_until_sigterm_and_refuses_bad_configuration() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let db = TestDb::migrated().await;
    let listen = format!("127.0.0.1:{}", crate::support::free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_durable-etl"))
        .env("DATABASE_URL", &db.config.url)
        .env("DURABLE_ETL_SECRET", SECRET)
        .env("RUST_LOG", "info")
        .args(["serve", "--listen", &listen])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let serving = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains("serving"))
        .unwrap();
    let console = format!("console=http://{listen}/console");
    assert!(serving.contains(&console), "{serving}");
    let health = reqwest::get(format!("http://{listen}/healthz"))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    // The port is taken now: a second server cannot bind it.
    let taken = run(&db.config.url, &["serve", "--listen", &listen]);
    let in_use = format!("cannot listen on {listen}: the address is in use [io_error]");
    assert_failed(&taken, 5, &in_use);
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert_eq!(child.wait().unwrap().code(), Some(0));

    let mut no_secret = Command::new(env!("CARGO_BIN_EXE_durable-etl"));
    no_secret
        .env_remove("DURABLE_ETL_SECRET")
        .env("DATABASE_URL", &db.config.url)
        .args(["serve"]);
    let out = no_secret.output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("DURABLE_ETL_SECRET"));
    let out = run(&db.config.url, &["serve", "--max-concurrency", "0"]);
    assert_eq!(out.status.code(), Some(2));
}

#[tokio::test]
async fn the_demo_runs_to_completion_in_its_own_database() {
    let name = format!("{TEST_DB_PREFIX}demo_{}", uuid::Uuid::new_v4().simple());
    let out = run(
        "postgres://postgres@127.0.0.1:5432/postgres",
        &["demo", "--demo-database", &name],
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", stderr(&out));
    let row = |label: &str| {
        line_starting(stdout.lines(), label)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert!(
        row("load 3 orders").contains("succeeded 1 - 3 0"),
        "{stdout}"
    );
    assert!(row("deferred 3 s").contains("succeeded"), "{stdout}");
    assert!(
        row("cancelled").contains("cancelled 0 cancelled"),
        "{stdout}"
    );
    assert!(
        row("bad record").contains("failed 1 record_invalid"),
        "{stdout}"
    );
    let locked = row("locked row");
    assert!(
        locked.contains("succeeded") && !locked.contains("succeeded 1 "),
        "retried: {locked}"
    );
    assert!(stdout.contains("enqueue→start latency over"));
    drop_database(&name).await;
}

#[tokio::test]
async fn the_demo_ends_with_its_final_table_and_logs_carry_no_colour_into_files() {
    let name = format!("{TEST_DB_PREFIX}demo_{}", uuid::Uuid::new_v4().simple());
    // Standard output and error into one file, in the order they were written.
    let path = std::env::temp_dir().join(format!("{name}.log"));
    let file = std::fs::File::create(&path).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_durable-etl"))
        .env(
            "DATABASE_URL",
            "postgres://postgres@127.0.0.1:5432/postgres",
        )
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .args(["demo", "--demo-database", &name])
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .status()
        .unwrap();
    let output = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(status.code(), Some(0), "{output}");
    assert!(
        output.contains(" INFO "),
        "the replicas log at info: {output}"
    );
    assert!(!output.contains('\u{1b}'), "ANSI codes in a file: {output}");
    let last = output.lines().rev().find(|l| !l.trim().is_empty()).unwrap();
    assert!(
        last.starts_with("enqueue→start latency over"),
        "something was printed after the final table: {output}"
    );
    drop_database(&name).await;
}

/// The first of `lines` that starts with `prefix` (a failure names the lines when none does).
fn line_starting<'a>(lines: impl Iterator<Item = &'a str> + Clone, prefix: &str) -> &'a str {
    lines
        .clone()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| {
            panic!(
                "no line starts {prefix:?} in:\n{:#?}",
                lines.collect::<Vec<_>>()
            )
        })
}

/// The one line the demo prints when no PostgreSQL server answers (the binary's `demo::NO_SERVER`,
/// read here from its output since the demo lives on the binary side).
const DEMO_NO_SERVER: &str = "durable-etl demo needs PostgreSQL: start the local server (apt-get install postgresql; pg_ctlcluster 15 main start) or set DATABASE_URL=postgres://USER@HOST:PORT/DB";

#[test]
fn the_demo_says_in_one_line_what_to_do_without_a_server() {
    let out = run("postgres://postgres@127.0.0.1:1/nowhere", &["demo"]);
    assert_eq!(out.status.code(), Some(3));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.trim(), DEMO_NO_SERVER);
}

/// Signs in to the console at `url` with `key` as a fresh browser would; returns the session
/// cookie (`name=value`).
async fn console_session(http: &reqwest::Client, url: &str, key: &str) -> String {
    let form = http.get(format!("{url}/sign-in")).send().await.unwrap();
    let nonce = form.headers()["set-cookie"].to_str().unwrap();
    let nonce = nonce[..nonce.find(';').unwrap()].to_owned();
    let body = form.text().await.unwrap();
    let at = body.find("name=\"csrf\" value=\"").unwrap() + 19;
    let signed = http
        .post(format!("{url}/sign-in"))
        .header("cookie", nonce)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("api_key={key}&csrf={}", &body[at..at + 64]))
        .send()
        .await
        .unwrap();
    assert_eq!(signed.status(), reqwest::StatusCode::SEE_OTHER);
    let session = signed.headers()["set-cookie"].to_str().unwrap();
    session[..session.find(';').unwrap()].to_owned()
}

/// The JSON body of the answer to `request`.
async fn json_of(request: reqwest::RequestBuilder) -> serde_json::Value {
    request.send().await.unwrap().json().await.unwrap()
}

/// The last word of `line`, without a closing parenthesis: the key the demo prints.
fn printed_key(line: &str) -> String {
    let key = line.rsplit(' ').next().unwrap().trim_end_matches(')');
    assert!(key.starts_with(api_keys::API_KEY_PREFIX), "{line}");
    key.to_owned()
}

/// Starts `demo --serve` on database `name` with the extra environment `env` (no other
/// `DURABLE_ETL_` variable) and waits for it to serve; returns the process (killed if dropped,
/// so a failing test leaves none behind) and the lines it printed up to `serving until`.
async fn serving_demo(name: &str, env: &[(&str, &str)]) -> (Processes, Vec<String>) {
    use std::io::BufRead;
    let mut command = Command::new(env!("CARGO_BIN_EXE_durable-etl"));
    for (key, _) in std::env::vars() {
        if key.starts_with("DURABLE_ETL_") {
            command.env_remove(key);
        }
    }
    let mut child = command
        .envs(env.iter().copied())
        .env(
            "DATABASE_URL",
            "postgres://postgres@127.0.0.1:5432/postgres",
        )
        .env("RUST_LOG", "warn")
        .args(["demo", "--serve", "--demo-database", name])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines, mut seen) = tokio::sync::mpsc::unbounded_channel();
    // Reads to the end, so the demo never writes into a closed pipe.
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = lines.send(line);
        }
    });
    let mut printed = Vec::new();
    while !printed
        .iter()
        .any(|l: &String| l.starts_with("serving until"))
    {
        let line = tokio::time::timeout(std::time::Duration::from_secs(90), seen.recv())
            .await
            .expect("the serving line within 90 s")
            .expect("the demo's output");
        printed.push(line);
    }
    (Processes(vec![child]), printed)
}

/// Sends SIGTERM to a serving demo and checks that it exits 0.
async fn stop_demo(mut demo: Processes) {
    let mut child = demo.0.pop().expect("the demo");
    crate::support::signal(&child, "TERM");
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
}

/// The URL of the demo's database `name`.
fn demo_url(name: &str) -> String {
    format!("postgres://postgres@127.0.0.1:5432/{name}")
}

/// Makes a key with `api-keys create` and `secret` in the demo's database `name`, and checks
/// that the demo's API at `api` accepts it.
async fn assert_own_key_accepted(name: &str, secret: &str, api: &str) {
    let out = run(
        &demo_url(name),
        &["api-keys", "create", "--owner", "me", "--secret", secret],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let key = printed_key(line_starting(stdout.lines(), "key: "));
    let listed = reqwest::Client::new()
        .get(format!("{api}/v1/etl-jobs"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(
        listed.status(),
        reqwest::StatusCode::OK,
        "a key of one's own"
    );
}

/// `demo --serve` keeps the API, the console and its replicas up after its table, prints the
/// console's address, the demo's key and an operator key: a newcomer signs in there and sees the
/// demo's jobs, a job submitted after the table succeeds, and the operator key opens the
/// operator view; it prints the secret it generated, with which `api-keys create` makes keys
/// its server accepts; a signal ends it.
#[tokio::test]
async fn the_demo_can_serve_its_jobs_in_the_console_until_a_signal() {
    let name = format!("{TEST_DB_PREFIX}demo_{}", uuid::Uuid::new_v4().simple());
    let (child, printed) = serving_demo(&name, &[]).await;
    let find = |prefix: &str| line_starting(printed.iter().map(String::as_str), prefix).to_owned();
    let console_line = find("console: ");
    let url = console_line.split_whitespace().nth(1).unwrap().to_owned();
    let key = printed_key(&console_line);
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let session = console_session(&http, &url, &key).await;
    let jobs = http
        .get(format!("{url}/jobs"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        jobs.matches("href=\"/console/jobs/").count(),
        6,
        "the six samples: {jobs}"
    );
    assert!(jobs.contains("status-succeeded") && jobs.contains("status-cancelled"));

    // A job submitted after the table: the replicas are still there to run it.
    let api = url.trim_end_matches("/console");
    let submitted = json_of(
        http.post(format!("{api}/v1/etl-jobs"))
            .bearer_auth(&key)
            .header("Idempotency-Key", "after-the-table")
            .json(&serde_json::json!({"dataset": "orders", "key": "order_id",
                                      "records": [{"order_id": "Z-1", "amount": "1"}]})),
    )
    .await;
    let id = submitted["id"].as_str().unwrap().to_owned();
    let mut status = String::new();
    for _ in 0..300 {
        let job = json_of(
            http.get(format!("{api}/v1/etl-jobs/{id}"))
                .bearer_auth(&key),
        )
        .await;
        status = job["status"].as_str().unwrap_or_default().to_owned();
        if status == "succeeded" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(status, "succeeded", "the job submitted after the table");

    // The operator key opens the operator view, which shows the demo's two replicas.
    let operator_line = find("operator view: ");
    let operator = console_session(&http, &url, &printed_key(&operator_line)).await;
    let view = http
        .get(format!("{url}/operator"))
        .header("cookie", &operator)
        .send()
        .await
        .unwrap();
    assert_eq!(view.status(), reqwest::StatusCode::OK);
    let view = view.text().await.unwrap();
    for replica in ["demo-replica-1", "demo-replica-2"] {
        assert!(view.contains(&format!("<code>{replica}</code>")), "{view}");
    }
    // The secret it generated makes keys of one's own that its server accepts.
    let own = find("keys of your own: ");
    let (_, secret) = own.rsplit_once("DURABLE_ETL_SECRET=").expect("the secret");
    assert!(secret.len() >= 16, "{own}");
    assert_own_key_accepted(&name, secret, api).await;
    stop_demo(child).await;
    drop_database(&name).await;
}

/// With `DURABLE_ETL_SECRET` set, `demo --serve` keys its digests with it, as `serve` does:
/// `api-keys create` with the same secret makes keys its server accepts, and the secret is
/// never printed.
#[tokio::test]
async fn the_demo_serves_keys_made_with_the_secret_of_its_environment() {
    let name = format!("{TEST_DB_PREFIX}demo_{}", uuid::Uuid::new_v4().simple());
    let (child, printed) = serving_demo(&name, &[("DURABLE_ETL_SECRET", SECRET)]).await;
    let console = line_starting(printed.iter().map(String::as_str), "console: ");
    let url = console.split_whitespace().nth(1).unwrap();
    assert_own_key_accepted(&name, SECRET, url.trim_end_matches("/console")).await;
    assert!(printed.iter().all(|l| !l.contains(SECRET)), "{printed:#?}");
    let own = line_starting(printed.iter().map(String::as_str), "keys of your own: ");
    assert!(own.ends_with("the same DURABLE_ETL_SECRET"), "{own}");
    stop_demo(child).await;
    drop_database(&name).await;
}

/// `demo --demo-database` never drops a database it did not create: one of the user's with a
/// table is left as it was, and the demo stops with exit 2 and `database_taken`, naming the flag
/// to pick another name.
#[tokio::test]
async fn the_demo_never_drops_a_database_it_did_not_create() {
    let name = format!("{TEST_DB_PREFIX}demo_{}", uuid::Uuid::new_v4().simple());
    let admin = connect(&admin_config()).await;
    admin
        .batch_execute(&format!("CREATE DATABASE {}", quote_ident(&name)))
        .await
        .unwrap();
    let mut config = admin_config();
    config.dbname(&name);
    connect(&config)
        .await
        .batch_execute("CREATE TABLE mine (n int); INSERT INTO mine VALUES (1)")
        .await
        .unwrap();
    let out = run(
        "postgres://postgres@127.0.0.1:5432/postgres",
        &["demo", "--demo-database", &name],
    );
    let err = assert_failed(&out, 2, "exists without this tool's mark");
    assert!(err.contains("--demo-database NAME"), "{err}");
    assert!(err.contains("[database_taken]"), "{err}");
    let kept: i64 = connect(&config)
        .await
        .query_one("SELECT count(*) FROM mine", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(kept, 1, "the user's table is intact");
    drop_database(&name).await;
}

/// Two demos on one database name: the second, started while the first serves, is refused
/// (exit 2, `database_taken`) and the first goes on serving; once the first has stopped, a
/// demo recreates the database it left, since the demo created it and no session uses it.
#[tokio::test]
async fn a_second_demo_on_a_running_demos_database_is_refused_and_the_first_goes_on() {
    let name = format!("{TEST_DB_PREFIX}demo_{}", uuid::Uuid::new_v4().simple());
    let (first, printed) = serving_demo(&name, &[]).await;
    let second = run(
        "postgres://postgres@127.0.0.1:5432/postgres",
        &["demo", "--demo-database", &name],
    );
    let err = assert_failed(&second, 2, "is in use");
    assert!(err.contains("[database_taken]"), "{err}");
    let console = line_starting(printed.iter().map(String::as_str), "console: ");
    let url = console.split_whitespace().nth(1).unwrap();
    let jobs = json_of(
        reqwest::Client::new()
            .get(format!("{}/v1/etl-jobs", url.trim_end_matches("/console")))
            .bearer_auth(printed_key(console)),
    )
    .await;
    assert_eq!(
        jobs["jobs"].as_array().map(Vec::len),
        Some(6),
        "the first demo's six jobs, still served: {jobs}"
    );
    stop_demo(first).await;
    // The server ends a closed connection's backend a moment after the client has gone, and a
    // demo refuses a database any session still uses: wait for the first demo's to end.
    let admin = connect(&admin_config()).await;
    let sessions = format!("pg_stat_activity WHERE datname = '{name}'");
    crate::support::eventually("the first demo's sessions to end", || async {
        count(&admin, &sessions).await == 0
    })
    .await;
    let again = run(
        "postgres://postgres@127.0.0.1:5432/postgres",
        &["demo", "--demo-database", &name],
    );
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    drop_database(&name).await;
}

#[tokio::test]
async fn queues_caps_pauses_and_resumes_a_queue_and_refuses_a_bad_cap() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let url = &db.config.url;
    let settings = || async {
        let row = client
            .query_one(
                "SELECT q.cap, q.paused, (SELECT count(*) FROM etl_queue_permits p
                                           WHERE p.queue = q.queue)
                   FROM etl_queues q WHERE q.queue = 'mail'",
                &[],
            )
            .await
            .unwrap();
        (
            row.get::<_, Option<i32>>(0),
            row.get::<_, bool>(1),
            row.get::<_, i64>(2),
        )
    };
    for (args, said, expected) in [
        (
            &["queues", "cap", "mail", "3"][..],
            "capped mail at 3",
            (Some(3), false, 3),
        ),
        (
            &["queues", "pause", "mail"],
            "paused mail",
            (Some(3), true, 3),
        ),
        (
            &["queues", "resume", "mail"],
            "resumed mail",
            (Some(3), false, 3),
        ),
        (
            &["queues", "cap", "mail", "none"],
            "uncapped mail",
            (None, false, 0),
        ),
    ] {
        let out = run(url, args);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), said);
        assert_eq!(settings().await, expected, "{args:?}");
    }
    assert_failed(&run(url, &["queues", "cap", "mail", "0"]), 2, "cap must be");
    assert_failed(
        &run(url, &["queues", "cap", "mail", "many"]),
        2,
        "cap must be",
    );
    assert_failed(&run(url, &["queues", "pause", "Mail"]), 2, "queue's name");
    assert_eq!(settings().await, (None, false, 0), "nothing changed");
    let key_cap = || async {
        let row = client
            .query_one("SELECT key_cap FROM etl_queues WHERE queue = 'mail'", &[])
            .await
            .unwrap();
        row.get::<_, Option<i32>>(0)
    };
    for (args, said, expected) in [
        (
            &["queues", "key-cap", "mail", "2"][..],
            "capped each key of mail at 2",
            Some(2),
        ),
        (
            &["queues", "key-cap", "mail", "none"],
            "lifted the key cap of mail",
            None,
        ),
    ] {
        let out = run(url, args);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), said);
        assert_eq!(key_cap().await, expected, "{args:?}");
    }
    assert_failed(
        &run(url, &["queues", "key-cap", "mail", "10001"]),
        2,
        "cap must be",
    );
    assert_eq!(key_cap().await, None, "nothing changed");
}

/// `schedules` lists, pauses, resumes and deletes one owner's schedules; another owner's, or
/// none, is `not_found` (exit 2), and the secret and the owner never show.
#[tokio::test]
async fn schedules_are_listed_paused_resumed_and_deleted_for_their_owner() {
    #[derive(serde::Serialize, serde::Deserialize)]
    struct Report;
    impl durable_etl::Job for Report {
        const KIND: &'static str = "test.report";
    }
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let jobs = durable_etl::Jobs::new(durable_etl::Secret::new(SECRET).unwrap(), "alice");
    let options = durable_etl::schedule::ScheduleOptions {
        missed: durable_etl::schedule::Missed::CatchUp(7),
        ..Default::default()
    };
    jobs.schedules()
        .put(&client, "nightly", "0 2 * * *", &Report, options)
        .await
        .unwrap();
    let url = db.config.url.as_str();
    let out = |args: &[&str]| run(url, args);
    let listed = out(&["schedules", "--owner", "alice", "list"]);
    assert!(listed.status.success(), "{listed:?}");
    let text = String::from_utf8(listed.stdout).unwrap();
    assert!(
        text.starts_with("nightly\t0 2 * * *\tUTC\tmissed=catch_up(7)\tnext="),
        "{text}"
    );
    assert!(text.trim_end().ends_with("active"), "{text}");
    assert!(!text.contains(SECRET) && !text.contains("alice"));
    let paused = out(&["schedules", "--owner", "alice", "pause", "nightly"]);
    assert_eq!(String::from_utf8_lossy(&paused.stdout), "paused nightly\n");
    assert!(
        jobs.schedules()
            .get(&client, "nightly")
            .await
            .unwrap()
            .unwrap()
            .paused
    );
    let resumed = out(&["schedules", "--owner", "alice", "resume", "nightly"]);
    assert_eq!(
        String::from_utf8_lossy(&resumed.stdout),
        "resumed nightly\n"
    );
    for args in [
        ["schedules", "--owner", "bob", "pause", "nightly"],
        ["schedules", "--owner", "bob", "resume", "nightly"],
        ["schedules", "--owner", "bob", "delete", "nightly"],
    ] {
        let refused = out(&args);
        assert_eq!(refused.status.code(), Some(2), "{refused:?}");
        assert!(String::from_utf8_lossy(&refused.stderr).contains("not_found"));
    }
    let deleted = out(&["schedules", "--owner", "alice", "delete", "nightly"]);
    assert_eq!(
        String::from_utf8_lossy(&deleted.stdout),
        "deleted nightly\n"
    );
    assert_eq!(count(&client, "etl_schedules").await, 0);
}

/// `work --schedules FILE` declares the file's schedules of ETL loads for their owners at
/// start-up, in one transaction: a second release's file with other schedules adds them and
/// deletes none; a file with one bad entry is refused naming the entry, never a value, and
/// writes nothing; a file without a secret is refused.
#[tokio::test]
async fn work_declares_the_schedules_of_its_file_and_a_bad_file_writes_nothing() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let dir = std::env::temp_dir().join(format!("durable-etl-schedules-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let request = r#"{"dataset": "d", "key": "id", "records": [{"id": "A-1", "n": 1}]}"#;
    let entry = |owner: &str, name: &str, cron: &str| {
        format!(
            r#"{{"owner": "{owner}", "name": "{name}", "cron": "{cron}",
                 "time_zone": "Europe/London", "missed": "catch_up", "catch_up_limit": 3,
                 "request": {request}}}"#
        )
    };
    let write = |file: &str, entries: &[String]| {
        let path = dir.join(file);
        std::fs::write(&path, format!("[{}]", entries.join(","))).unwrap();
        path.to_string_lossy().into_owned()
    };
    // A release declares two schedules, of two owners; another one a third, beside them.
    let first = write(
        "first.json",
        &[
            entry("tenant-a", "nightly", "0 3 * * *"),
            entry("tenant-b", "hourly", "@hourly"),
        ],
    );
    let second = write("second.json", &[entry("tenant-a", "weekly", "0 4 * * 1")]);
    for file in [&first, &second] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_durable-etl"))
            .env("DATABASE_URL", &db.config.url)
            .env("DURABLE_ETL_SECRET", SECRET)
            .env("RUST_LOG", "info")
            .args(["work", "--owner-id", "declaring", "--schedules", file])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        lines
            .by_ref()
            .map_while(Result::ok)
            .find(|l| l.contains("replica started"))
            .unwrap();
        let _stopped = Processes(vec![child]);
    }
    let secret = Secret::new(SECRET).unwrap();
    let tenant_a = durable_etl::Jobs::new(secret.clone(), "tenant-a").schedules();
    let tenant_b = durable_etl::Jobs::new(secret, "tenant-b").schedules();
    let names = |list: Vec<durable_etl::schedule::ScheduleInfo>| {
        list.into_iter()
            .map(|s| {
                assert!(s.declared && s.kind == "etl.load" && s.time_zone == "Europe/London");
                assert_eq!(s.missed, durable_etl::schedule::Missed::CatchUp(3));
                s.name
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(tenant_a.list(&client).await.unwrap()),
        ["nightly", "weekly"]
    );
    assert_eq!(names(tenant_b.list(&client).await.unwrap()), ["hourly"]);

    // One bad entry: nothing of the file is written, and the refusal names the entry only.
    let bad = write(
        "bad.json",
        &[
            entry("tenant-c", "fine", "0 5 * * *"),
            entry("tenant-c", "broken", "61 * * * *"),
        ],
    );
    let url = db.config.url.as_str();
    let refused = run(
        url,
        &["work", "--owner-id", "declaring", "--schedules", &bad],
    );
    let err = assert_failed(
        &refused,
        2,
        "the schedules file is not valid: entry 1 (`broken`): schedule_invalid at `/cron`",
    );
    assert!(!err.contains("tenant-c") && !err.contains("61 *"), "{err}");
    let unreadable = run(url, &["work", "--schedules", "/nonexistent/schedules.json"]);
    assert_failed(
        &unreadable,
        2,
        "the schedules file is not valid: it cannot be read",
    );
    let not_a_list = write("object.json", &[]).replace("object.json", "scalar.json");
    std::fs::write(&not_a_list, "{}").unwrap();
    let refused = run(url, &["work", "--schedules", &not_a_list]);
    assert_failed(&refused, 2, "it is not a JSON array of schedules");
    let no_secret = run_with(
        url,
        &["work", "--schedules", &first],
        &[("DURABLE_ETL_SECRET", "")],
    );
    assert_failed(&no_secret, 2, "DURABLE_ETL_SECRET");
    assert_eq!(count(&client, "etl_schedules").await, 3);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `schedules put NAME --body FILE` creates or changes an owner's schedule of ETL loads from the
/// body `PUT /v1/schedules/{name}` takes (from a file or standard input); a body that is not
/// valid is refused with the route's code and pointer and writes nothing.
#[tokio::test]
async fn schedules_are_created_and_changed_from_a_body_and_a_bad_body_writes_nothing() {
    use std::io::Write;
    use std::process::Stdio;
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let url = db.config.url.as_str();
    let dir = std::env::temp_dir().join(format!("durable-etl-put-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let body = |cron: &str| {
        format!(
            r#"{{"cron": "{cron}", "time_zone": "Asia/Kolkata", "missed": "skip",
                 "request": {{"dataset": "d", "key": "id", "records": [{{"id": 1}}]}}}}"#
        )
    };
    let file = dir.join("body.json");
    std::fs::write(&file, body("0 6 * * *")).unwrap();
    let path = file.to_str().unwrap();
    /// The arguments that put alice's `morning` from `body`.
    fn put(body: &str) -> [&str; 7] {
        [
            "schedules",
            "--owner",
            "alice",
            "put",
            "morning",
            "--body",
            body,
        ]
    }
    let created = run(url, &put(path));
    assert!(created.status.success(), "{created:?}");
    let text = String::from_utf8(created.stdout).unwrap();
    assert!(
        text.starts_with("morning\t0 6 * * *\tAsia/Kolkata\tmissed=skip\tnext="),
        "{text}"
    );
    // Changed, from standard input.
    let mut child = Command::new(env!("CARGO_BIN_EXE_durable-etl"))
        .env("DATABASE_URL", url)
        .env("DURABLE_ETL_SECRET", SECRET)
        .env("RUST_LOG", "warn")
        .args(put("-"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(body("30 7 * * *").as_bytes()).unwrap();
    drop(stdin);
    let changed = child.wait_with_output().unwrap();
    assert!(changed.status.success(), "{changed:?}");
    assert!(String::from_utf8_lossy(&changed.stdout).starts_with("morning\t30 7 * * *\t"));
    // Refused: a bad expression, a body that is no JSON, a missing file.
    std::fs::write(&file, body("61 * * * *")).unwrap();
    let missing = dir.join("missing.json");
    for (body_file, code) in [
        (path, "schedule_invalid"),
        (path, "request_malformed"),
        (missing.to_str().unwrap(), "request_malformed"),
    ] {
        let put = [
            "schedules",
            "--owner",
            "alice",
            "put",
            "evening",
            "--body",
            body_file,
        ];
        assert_failed(&run(url, &put), 2, code);
        std::fs::write(&file, "{not json").unwrap();
    }
    let rows =
        crate::support::first_column::<String>(&client, "SELECT cron FROM etl_schedules").await;
    assert_eq!(rows, ["30 7 * * *"], "only morning, as changed");
    std::fs::remove_dir_all(&dir).unwrap();
}
