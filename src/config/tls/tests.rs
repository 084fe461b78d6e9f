//! `sslmode` and `sslrootcert`, read from both forms of connection string.

use super::*;

/// `url` split, unwrapped.
fn split(url: &str) -> (String, SslMode, Option<PathBuf>) {
    let (kept, request) = split_url(url).unwrap();
    (kept, request.mode, request.root_cert)
}

#[test]
fn tls_every_sslmode_of_a_url_is_read_and_handed_on_as_the_driver_knows_it() {
    for (value, mode, driver) in [
        ("disable", SslMode::Disable, "disable"),
        ("prefer", SslMode::Prefer, "prefer"),
        ("require", SslMode::Require, "require"),
        ("verify-ca", SslMode::VerifyCa, "require"),
        ("verify-full", SslMode::VerifyFull, "require"),
    ] {
        let (kept, read, root) = split(&format!("postgres://u@h/db?sslmode={value}"));
        assert_eq!(read, mode);
        assert_eq!(mode.name(), value);
        assert_eq!(root, None);
        assert_eq!(kept, format!("postgres://u@h/db?sslmode={driver}"));
        let parsed: tokio_postgres::Config = kept.parse().unwrap();
        let expected = match driver {
            "disable" => tokio_postgres::config::SslMode::Disable,
            "prefer" => tokio_postgres::config::SslMode::Prefer,
            _ => tokio_postgres::config::SslMode::Require,
        };
        assert_eq!(parsed.get_ssl_mode(), expected);
    }
}

#[test]
fn tls_a_url_without_tls_parameters_is_handed_on_unchanged_and_prefers_tls() {
    for url in [
        "postgres://u@h/db",
        "postgresql://u@h:1,g:2/db?target_session_attrs=read-write",
        "host=h user=u",
        "",
    ] {
        assert_eq!(split(url), (url.to_owned(), SslMode::Prefer, None));
    }
}

#[test]
fn tls_sslrootcert_is_taken_out_of_a_url_and_other_parameters_stay_in_order() {
    let (kept, mode, root) = split(
        "postgres://u@h/db?application_name=x&sslrootcert=%2Fetc%2Fca.pem&sslmode=verify-full&connect_timeout=3",
    );
    assert_eq!(
        kept,
        "postgres://u@h/db?application_name=x&connect_timeout=3&sslmode=require"
    );
    assert_eq!(mode, SslMode::VerifyFull);
    assert_eq!(root, Some(PathBuf::from("/etc/ca.pem")));
    let (kept, mode, root) = split("postgres://u@h/db?sslrootcert=ca.pem");
    assert_eq!(
        (kept.as_str(), mode, root),
        ("postgres://u@h/db", SslMode::Prefer, Some("ca.pem".into()))
    );
    // A parameter with no value is another parameter's business.
    assert_eq!(split("postgres://h/db?x").0, "postgres://h/db?x");
}

#[test]
fn tls_key_value_pairs_are_read_as_the_driver_reads_them() {
    let (kept, mode, root) = split(
        "host=h  sslmode = verify-ca password='a b\\'c' sslrootcert='/my certs/ca.pem' user=u\\ v",
    );
    assert_eq!(kept, "host=h password='a b\\'c' user=u\\ v sslmode=require");
    assert_eq!(mode, SslMode::VerifyCa);
    assert_eq!(root, Some(PathBuf::from("/my certs/ca.pem")));
    let parsed: tokio_postgres::Config = kept.parse().unwrap();
    assert_eq!(parsed.get_password(), Some(&b"a b'c"[..]));
    assert_eq!(parsed.get_user(), Some("u v"));
    let (_, mode, root) = split("sslmode=disable sslrootcert=x\\y");
    assert_eq!((mode, root), (SslMode::Disable, Some("xy".into())));
}

#[test]
fn tls_a_string_that_is_not_pairs_is_handed_on_whole_for_the_driver_to_refuse() {
    for broken in [
        "host=h sslmode",
        "host=h sslmode=",
        "host=h sslmode='verify-full",
        "=x sslmode=verify-full",
    ] {
        let (kept, mode, root) = split(broken);
        assert_eq!((kept.as_str(), mode, root), (broken, SslMode::Prefer, None));
    }
}

#[test]
fn tls_an_sslmode_libpq_would_refuse_or_this_release_does_not_speak_is_refused() {
    for url in [
        "postgres://h/db?sslmode=allow",
        "postgres://h/db?sslmode=verify_full",
        "host=h sslmode=Require",
    ] {
        assert_eq!(split_url(url).err(), Some(ConfigError::SslMode));
    }
}

#[test]
fn tls_the_config_root_cert_applies_only_when_the_url_names_none() {
    let cfg = crate::config::DatabaseConfig {
        ssl_root_cert: Some("flag.pem".into()),
        ..crate::config::DatabaseConfig::new("postgres://h/db?sslmode=verify-ca")
    };
    let (pg, request) = cfg.driver_url().unwrap();
    assert_eq!(pg.get_ssl_mode(), tokio_postgres::config::SslMode::Require);
    assert_eq!(request.root_cert, Some("flag.pem".into()));
    let url_wins = crate::config::DatabaseConfig {
        url: "postgres://h/db?sslrootcert=url.pem".into(),
        ..cfg.clone()
    };
    assert_eq!(
        url_wins.driver_url().unwrap().1.root_cert,
        Some("url.pem".into())
    );
    let bad = crate::config::DatabaseConfig::new("postgres://h:x/db?sslmode=verify-ca");
    assert_eq!(bad.driver_url().err(), Some(ConfigError::DatabaseUrl));
}
