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
fn tls_a_recreated_databases_url_keeps_its_tls_parameters() {
    let url = "postgres://u:pw@h:7,g:8/d?sslmode=verify-full&sslrootcert=/ca.pem";
    assert_eq!(
        with_dbname(url, "e").unwrap(),
        "postgres://u:pw@h:7,g:8/e?sslmode=verify-full&sslrootcert=/ca.pem"
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
    // Outside a cell the session's search path is the server's; a cell's is its node views
    // (on Citus) and its schema, and Citus's distributed execution is off; a migration's is the
    // cell's schema alone.
    assert!(!options.contains("search_path"), "{options}");
    assert!(!options.contains("citus"), "{options}");
    let cell = DatabaseConfig {
        cell: Some("cell_a".to_owned()),
        ..DatabaseConfig::default()
    };
    let cell_options = pg_config(&cell, "worker").unwrap();
    assert!(
        cell_options
            .get_options()
            .unwrap()
            .ends_with(" -c search_path=_cell_a,cell_a -c citus.use_secondary_nodes=always"),
        "{cell_options:?}"
    );
    let migrating = pg_config(&cell, "migrate").unwrap();
    assert!(
        migrating
            .get_options()
            .unwrap()
            .ends_with(" -c search_path=cell_a"),
        "{migrating:?}"
    );
    let pg13 = DatabaseConfig {
        client_check_interval: Duration::ZERO,
        ..DatabaseConfig::default()
    };
    assert!(!super::options(&pg13, "worker").contains("client_connection_check_interval"));
    let bad = DatabaseConfig {
        url: "postgres://h:x/db".into(),
        ..DatabaseConfig::default()
    };
    assert_eq!(
        pg_config(&bad, "worker").err(),
        Some(ConfigError::DatabaseUrl)
    );
}

#[test]
fn the_database_changes_and_nothing_else() {
    let cases = [
        (
            "postgres://u:s3cret@10.0.0.1:5432,10.0.0.2:5433/app?target_session_attrs=read-write",
            "postgres://u:s3cret@10.0.0.1:5432,10.0.0.2:5433/durable_etl_bench_x?target_session_attrs=read-write",
        ),
        ("postgresql://u@h", "postgresql://u@h/durable_etl_bench_x"),
        (
            "postgres://u@h?connect_timeout=3",
            "postgres://u@h/durable_etl_bench_x?connect_timeout=3",
        ),
        (
            "host=h user=u password=s3cret dbname=app",
            "host=h user=u password=s3cret dbname=app dbname='durable_etl_bench_x'",
        ),
    ];
    for (url, expected) in cases {
        assert_eq!(with_dbname(url, "durable_etl_bench_x").unwrap(), expected);
        let pg: tokio_postgres::Config = expected.parse().unwrap();
        assert_eq!(pg.get_dbname(), Some("durable_etl_bench_x"));
    }
    let odd = with_dbname("postgres://u@h/app", "durable_etl_bench 'é'/?").unwrap();
    let pg: tokio_postgres::Config = odd.parse().unwrap();
    assert_eq!(pg.get_dbname(), Some("durable_etl_bench 'é'/?"));
    assert!(with_dbname("not a url ::", "x").is_err());
}

#[test]
fn a_url_pointed_at_a_node_keeps_all_but_its_hosts() {
    let cases = [
        (
            "postgres://u:s3cret@coord:5432,standby:5433/app?sslmode=disable",
            "postgres://u:s3cret@10.0.0.7:6001/app?sslmode=disable",
        ),
        ("postgresql://h/app", "postgresql://10.0.0.7:6001/app"),
        ("postgres://u@h", "postgres://u@10.0.0.7:6001"),
    ];
    for (url, expected) in cases {
        assert_eq!(with_node(url, "10.0.0.7", 6001).unwrap(), expected);
    }
    // An IPv6 node is bracketed.
    assert_eq!(
        with_node("postgres://u@h/app", "::1", 6001).unwrap(),
        "postgres://u@[::1]:6001/app"
    );
    // A key-value string, or hosts named in the parameters, cannot be pointed at one node.
    for refused in [
        "host=h user=u dbname=app",
        "postgres://u@h/app?host=other",
        "postgres://u@h/app?hostaddr=10.0.0.9",
    ] {
        assert!(
            matches!(
                with_node(refused, "10.0.0.7", 6001),
                Err(ConfigError::NodeUrl)
            ),
            "{refused}"
        );
    }
    assert!(matches!(
        with_node("not a url ::", "h", 1),
        Err(ConfigError::DatabaseUrl)
    ));
}

#[test]
fn a_cells_node_views_live_in_a_schema_no_cell_can_take() {
    assert_eq!(citus::node_schema("tenants_a"), "_tenants_a");
    assert!(!crate::config::cell_name_ok(&citus::node_schema(
        "tenants_a"
    )));
}
