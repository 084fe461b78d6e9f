//! Unit tests of configuration loading, defaults and validation.

use super::*;

#[test]
fn defaults_are_valid() {
    assert_eq!(DatabaseConfig::default().validate(), Ok(()));
    assert_eq!(WorkerConfig::default().validate(), Ok(()));
    let cooldown_of_a_poll = WorkerConfig {
        claim_cooldown: POLL_INTERVAL_DEFAULT,
        ..WorkerConfig::default()
    };
    assert_eq!(cooldown_of_a_poll.validate(), Ok(()));
    assert_eq!(ApiConfig::default().listen.to_string(), API_LISTEN_DEFAULT);
}

#[test]
fn database_rules_name_the_broken_relation() {
    let bad_url = DatabaseConfig {
        url: "postgres://host:notaport/db".into(),
        ..DatabaseConfig::default()
    };
    assert_eq!(bad_url.validate(), Err(ConfigError::DatabaseUrl));
    let no_pool = DatabaseConfig {
        pool_max_size: 0,
        ..DatabaseConfig::default()
    };
    assert_eq!(no_pool.validate(), Err(ConfigError::PoolSize));
    let zero_lock = DatabaseConfig {
        lock_timeout: Duration::ZERO,
        ..DatabaseConfig::default()
    };
    assert_eq!(
        zero_lock.validate(),
        Err(ConfigError::ZeroDuration("lock timeout"))
    );
}

#[test]
fn worker_rules_name_the_broken_relation() {
    let base = WorkerConfig::default;
    let cases = [
        (
            WorkerConfig {
                owner_id: String::new(),
                ..base()
            },
            ConfigError::OwnerId,
        ),
        (
            WorkerConfig {
                owner_id: "a b".into(),
                ..base()
            },
            ConfigError::OwnerId,
        ),
        (
            WorkerConfig {
                owner_id: "x".repeat(129),
                ..base()
            },
            ConfigError::OwnerId,
        ),
        (WorkerConfig { slots: 0, ..base() }, ConfigError::Slots),
        (
            WorkerConfig {
                slots: SLOTS_MAX + 1,
                ..base()
            },
            ConfigError::Slots,
        ),
        (
            WorkerConfig {
                poll_interval: Duration::from_millis(9),
                ..base()
            },
            ConfigError::PollInterval,
        ),
        (
            WorkerConfig {
                poll_interval: Duration::from_secs(301),
                ..base()
            },
            ConfigError::PollInterval,
        ),
        (
            WorkerConfig {
                poll_interval: Duration::from_secs(1),
                claim_cooldown: Duration::from_millis(1001),
                ..base()
            },
            ConfigError::ClaimCooldown,
        ),
        (
            WorkerConfig {
                lease: Duration::ZERO,
                ..base()
            },
            ConfigError::ZeroDuration("lease"),
        ),
        (
            WorkerConfig {
                lease: Duration::from_secs(9),
                heartbeat_interval: Duration::from_secs(3),
                ..base()
            },
            ConfigError::HeartbeatVsLease,
        ),
        (
            WorkerConfig {
                session_database_url: Some("postgres://h:x/d".into()),
                ..base()
            },
            ConfigError::DatabaseUrl,
        ),
        (
            WorkerConfig {
                retry_min_delay: Duration::from_secs(2),
                retry_max_delay: Duration::from_secs(1),
                ..base()
            },
            ConfigError::RetryDelays,
        ),
    ];
    for (config, expected) in cases {
        assert_eq!(config.validate(), Err(expected));
    }
}

#[test]
fn derived_defaults_keep_any_lease_valid() {
    assert_eq!(
        derived_heartbeat_interval(LEASE_DEFAULT),
        HEARTBEAT_INTERVAL_DEFAULT
    );
    assert_eq!(
        derived_idle_in_transaction_timeout(LEASE_DEFAULT),
        IDLE_IN_TRANSACTION_TIMEOUT_DEFAULT
    );
    for ms in [1_000, 1_001, 3_000, 9_999, 15_000, 60_000, 3_600_000] {
        let lease = Duration::from_millis(ms);
        let config = WorkerConfig {
            lease,
            heartbeat_interval: derived_heartbeat_interval(lease),
            ..WorkerConfig::default()
        };
        assert_eq!(config.validate(), Ok(()), "lease {lease:?}");
        assert!(derived_idle_in_transaction_timeout(lease) <= lease);
    }
    assert_eq!(
        derived_heartbeat_interval(Duration::from_secs(3)),
        Duration::from_millis(800)
    );
}

#[test]
fn absurd_durations_are_refused_not_overflowed() {
    let huge = Duration::from_secs(3_600 * 1_000_000_000);
    let heartbeat = WorkerConfig {
        heartbeat_interval: huge,
        ..WorkerConfig::default()
    };
    assert_eq!(
        heartbeat.validate(),
        Err(ConfigError::DurationTooLong(
            "heartbeat interval",
            "365 days"
        ))
    );
    let execution = WorkerConfig {
        execution_timeout: huge,
        ..WorkerConfig::default()
    };
    assert!(matches!(
        execution.validate(),
        Err(ConfigError::DurationTooLong("execution timeout", _))
    ));
    let statement = DatabaseConfig {
        statement_timeout: Duration::from_secs(30 * 24 * 3600),
        ..DatabaseConfig::default()
    };
    assert!(matches!(
        statement.validate(),
        Err(ConfigError::DurationTooLong("statement timeout", _))
    ));
}

#[test]
fn durations_and_counts_that_cannot_work_are_refused_naming_the_bound() {
    let short = |name, limit| Err(ConfigError::DurationTooShort(name, limit));
    let worker = WorkerConfig::default;
    let lease = WorkerConfig {
        lease: Duration::from_millis(999),
        heartbeat_interval: derived_heartbeat_interval(Duration::from_millis(999)),
        ..worker()
    };
    assert_eq!(lease.validate(), short("lease", "1s"));
    let heartbeat = WorkerConfig {
        heartbeat_interval: Duration::from_millis(99),
        ..worker()
    };
    assert_eq!(heartbeat.validate(), short("heartbeat interval", "100ms"));
    let execution = WorkerConfig {
        execution_timeout: Duration::from_millis(9),
        ..worker()
    };
    assert_eq!(execution.validate(), short("execution timeout", "10ms"));
    let at_the_bounds = WorkerConfig {
        lease: LEASE_MIN,
        heartbeat_interval: HEARTBEAT_INTERVAL_MIN,
        execution_timeout: EXECUTION_TIMEOUT_MIN,
        ..worker()
    };
    assert_eq!(at_the_bounds.validate(), Ok(()));

    let db = DatabaseConfig::default;
    let sub_millisecond = Duration::from_micros(500);
    for (config, expected) in [
        (
            DatabaseConfig {
                statement_timeout: sub_millisecond,
                ..db()
            },
            short("statement timeout", "1ms"),
        ),
        (
            DatabaseConfig {
                client_check_interval: sub_millisecond,
                ..db()
            },
            short("client check interval", "1ms"),
        ),
        (
            DatabaseConfig {
                connect_timeout: Duration::from_millis(1),
                ..db()
            },
            short("connect timeout", "10ms"),
        ),
        (
            DatabaseConfig {
                pool_max_size: POOL_MAX_SIZE_MAX + 1,
                ..db()
            },
            Err(ConfigError::PoolSize),
        ),
    ] {
        assert_eq!(config.validate(), expected);
    }
    let no_check = DatabaseConfig {
        client_check_interval: Duration::ZERO,
        pool_max_size: POOL_MAX_SIZE_MAX,
        ..db()
    };
    assert_eq!(no_check.validate(), Ok(()), "0 leaves the server's");

    let api = ApiConfig::default;
    for config in [
        ApiConfig {
            max_concurrency: MAX_CONCURRENCY_MAX + 1,
            ..api()
        },
        ApiConfig {
            limits: crate::intake::IntakeLimits {
                max_records: crate::intake::MAX_RECORDS_MAX + 1,
                ..Default::default()
            },
            ..api()
        },
        ApiConfig {
            limits: crate::intake::IntakeLimits {
                max_bytes: crate::intake::MAX_BYTES_MAX + 1,
                ..Default::default()
            },
            ..api()
        },
    ] {
        assert_eq!(config.validate(), Err(ConfigError::ApiLimits));
    }
    assert_eq!(api().validate(), Ok(()));
}

#[test]
fn generated_owner_ids_are_valid_and_distinct() {
    let a = generated_owner_id();
    let b = generated_owner_id();
    assert!(valid_owner_id(&a), "{a}");
    assert_ne!(a, b);
    assert!(valid_owner_id("pod-7.worker:east_1"));
}
