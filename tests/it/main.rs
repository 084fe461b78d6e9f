//! The integration test binary: every test talks to a real PostgreSQL server, each in its own
//! database (see `support`). One binary, so the tests compile and link once.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)]

mod api;
mod bench;
mod bench_load;
mod bench_queues;
mod bench_schedules;
mod browser;
mod budget;
mod cancel;
mod caps;
mod claim_plan;
mod cli;
mod commit_cuts;
mod console;
mod console_history;
mod console_privacy;
mod console_replicas;
mod cooldown;
mod cuts;
mod deploy;
mod errors;
mod etl;
mod etl_limits;
mod etl_sets;
mod execution;
mod failover;
mod faults;
mod fleet;
mod follow_ups;
mod handlers;
mod harness_adapter;
mod hygiene;
mod key_caps;
mod layering;
mod leases;
mod lost_wakes;
mod operator_queues;
mod pgbouncer;
mod prefetch;
mod presence;
mod privacy;
mod proxy;
mod queues;
mod runtime;
mod schedules;
mod schema;
mod soak;
#[cfg(feature = "sqlx")]
mod sqlx_enqueue;
mod states;
mod support;
mod tls;
mod wake;
mod wake_cases;
mod worker;
