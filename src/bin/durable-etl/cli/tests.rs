//! The command line as clap parses it: durations, derived worker timings, the whole tree.

use super::*;
use clap::Parser;
use durable_etl::config;
use std::time::Duration;

#[test]
fn durations_read_like_humans_write_them() {
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
    assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
    assert!(parse_duration("soon").is_err());
}

#[test]
fn a_lease_alone_sets_the_heartbeat_and_idle_timeout_it_needs() {
    let configs = |args: &[&str]| {
        let cli = Cli::try_parse_from(args).unwrap();
        let Command::Work(work) = &cli.command else {
            panic!("not work")
        };
        let worker = work.config().unwrap();
        let db = cli.database.config_for_lease(Some(worker.lease)).unwrap();
        (worker.heartbeat_interval, db.idle_in_transaction_timeout)
    };
    assert_eq!(
        configs(&["durable-etl", "work", "--lease", "3s"]),
        (Duration::from_millis(800), Duration::from_secs(3))
    );
    // The derived timeout reaches every session the replica opens.
    let cli = Cli::try_parse_from(["durable-etl", "work", "--lease", "3s"]).unwrap();
    let db_config = cli
        .database
        .config_for_lease(Some(Duration::from_secs(3)))
        .unwrap();
    let options = db::pg_config(&db_config, "worker")
        .unwrap()
        .get_options()
        .map(str::to_owned)
        .unwrap_or_default();
    assert!(
        options.contains("idle_in_transaction_session_timeout=3000"),
        "{options}"
    );
    assert_eq!(
        configs(&["durable-etl", "work"]),
        (Duration::from_secs(4), Duration::from_secs(10))
    );
    assert_eq!(
        configs(&["durable-etl", "work", "--lease", "60s"]),
        (Duration::from_secs(4), Duration::from_secs(10))
    );
    // Set values are kept as given, and validated as given.
    assert_eq!(
        configs(&[
            "durable-etl",
            "work",
            "--lease",
            "3s",
            "--heartbeat-interval",
            "500ms",
            "--idle-in-transaction-timeout",
            "20s"
        ]),
        (Duration::from_millis(500), Duration::from_secs(20))
    );
    let cli = Cli::try_parse_from([
        "durable-etl",
        "work",
        "--lease",
        "3s",
        "--heartbeat-interval",
        "1s",
    ])
    .unwrap();
    let Command::Work(work) = &cli.command else {
        panic!("not work")
    };
    assert!(matches!(
        work.config(),
        Err(Error::Config(config::ConfigError::HeartbeatVsLease))
    ));
}

#[test]
fn tls_the_root_certificate_flag_reaches_the_database_config() {
    let root = |args: &[&str]| {
        let cli = Cli::try_parse_from(args).unwrap();
        cli.database.config().unwrap().ssl_root_cert
    };
    assert_eq!(root(&["durable-etl", "work"]), None);
    assert_eq!(
        root(&["durable-etl", "work", "--database-ssl-root-cert", "/ca.pem"]),
        Some("/ca.pem".into())
    );
    let bad = Cli::try_parse_from([
        "durable-etl",
        "work",
        "--database-url",
        "postgres://h/db?sslmode=allow",
    ])
    .unwrap();
    assert!(matches!(
        bad.database.config(),
        Err(Error::Config(config::ConfigError::SslMode))
    ));
}

#[test]
fn the_command_line_is_well_formed() {
    use clap::CommandFactory;
    Cli::command().debug_assert();
}

#[test]
fn the_cell_flag_reaches_the_database_config_and_a_bad_name_is_refused() {
    let cell = |args: &[&str]| {
        Cli::try_parse_from(args)
            .unwrap()
            .database
            .config()
            .map(|c| c.cell)
    };
    assert_eq!(cell(&["durable-etl", "work"]).unwrap(), None);
    assert_eq!(
        cell(&["durable-etl", "migrate", "--cell", "cell_7"]).unwrap(),
        Some("cell_7".to_owned())
    );
    assert!(matches!(
        cell(&["durable-etl", "serve", "--cell", "Cell-7"]),
        Err(Error::Config(config::ConfigError::CellName))
    ));
}
