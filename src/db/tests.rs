//! Connection settings, pools and names, checked without and against PostgreSQL.

use super::*;

#[tokio::test]
async fn a_statement_past_its_bound_is_unavailable_and_one_within_it_answers() {
    let hung = bounded(
        Duration::from_millis(10),
        std::future::pending::<Result<(), tokio_postgres::Error>>(),
    )
    .await;
    assert!(matches!(hung, Err(Error::Unavailable(None))));
    let answered = bounded(Duration::from_secs(5), async {
        Ok::<_, tokio_postgres::Error>(7)
    })
    .await;
    assert!(matches!(answered, Ok(7)));
}

#[test]
fn every_connection_gives_up_on_a_silent_server_after_its_keepalives() {
    let cfg = DatabaseConfig::default();
    let pg = pg_config(&cfg, "test").unwrap();
    assert_eq!(pg.get_keepalives_interval(), Some(KEEPALIVE_PROBE_INTERVAL));
    assert_eq!(pg.get_keepalives_retries(), Some(KEEPALIVE_PROBES));
    assert_eq!(
        pg.get_tcp_user_timeout(),
        Some(&(cfg.keepalive_idle + KEEPALIVE_PROBE_INTERVAL * KEEPALIVE_PROBES))
    );
}

#[test]
fn tls_a_recreated_databases_url_keeps_the_sslmode_unless_it_is_the_default() {
    let pg: tokio_postgres::Config = "postgres://u@h:7/d".parse().unwrap();
    assert_eq!(url_of(&pg, SslMode::Prefer), "postgres://u@h:7/d");
    assert_eq!(
        url_of(&pg, SslMode::VerifyFull),
        "postgres://u@h:7/d?sslmode=verify-full"
    );
}

#[test]
fn quote_ident_doubles_quotes() {
    assert_eq!(quote_ident("plain"), "\"plain\"");
    assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
}

#[test]
fn pg_config_sets_session_safety_options() {
    let pg = pg_config(&DatabaseConfig::default(), "worker").unwrap();
    assert_eq!(pg.get_application_name(), Some("durable-etl/worker"));
    assert!(pg.get_keepalives());
    let options = pg.get_options().unwrap();
    assert!(options.contains("statement_timeout=30000"), "{options}");
    assert!(options.contains("lock_timeout=5000"), "{options}");
    assert!(
        !options.contains("enable_sort") && !options.contains("enable_bitmapscan"),
        "planner switches must not be session-wide: {options}"
    );
    assert!(options.contains("tcp_keepalives_idle="), "{options}");
    assert!(
        options.contains("idle_in_transaction_session_timeout=10000"),
        "{options}"
    );
    assert!(
        options.contains("client_connection_check_interval=1000"),
        "{options}"
    );
    let pg13 = DatabaseConfig {
        client_check_interval: Duration::ZERO,
        ..DatabaseConfig::default()
    };
    assert!(!super::options(&pg13).contains("client_connection_check_interval"));
    let bad = DatabaseConfig {
        url: "postgres://h:x/db".into(),
        ..DatabaseConfig::default()
    };
    assert_eq!(
        pg_config(&bad, "worker").err(),
        Some(ConfigError::DatabaseUrl)
    );
}
