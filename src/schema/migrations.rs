//! The migrations this release embeds, in version order, each with the `down` script that
//! reverses it and the oldest release that can still read the schema it leaves.
//!
//! Invariants this module keeps: versions run from 1 without gaps, and an applied migration's
//! `up` SQL never changes (its checksum is recorded when it is applied).

use sha2::{Digest, Sha256};

/// One schema migration: an `up` script, the `down` script that reverses it, and its compatibility.
#[derive(Debug)]
pub struct Migration {
    /// The version, from 1, without gaps.
    pub version: i32,
    /// A short snake_case name.
    pub name: &'static str,
    /// The SQL that applies the migration.
    pub up: &'static str,
    /// The SQL that reverses it exactly.
    pub down: &'static str,
    /// The oldest schema version a release may know and still run against a database at this
    /// version: equal to `version` for a breaking change, lower for an additive one.
    pub min_reader_version: i32,
}

impl Migration {
    /// The hex SHA-256 of the `up` SQL, as recorded in the history table.
    pub fn checksum(&self) -> String {
        hex::encode(Sha256::digest(self.up.as_bytes()))
    }
}

/// Every migration this release knows, in version order.
pub static MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "job_schema",
        up: include_str!("../../migrations/0001_job_schema.up.sql"),
        down: include_str!("../../migrations/0001_job_schema.down.sql"),
        min_reader_version: 1,
    },
    Migration {
        version: 2,
        name: "lease_owner_locked",
        up: include_str!("../../migrations/0002_lease_owner_locked.up.sql"),
        down: include_str!("../../migrations/0002_lease_owner_locked.down.sql"),
        min_reader_version: 1,
    },
    Migration {
        version: 3,
        name: "fencing_token_claim_plan_retention",
        up: include_str!("../../migrations/0003_fencing_token_claim_plan_retention.up.sql"),
        down: include_str!("../../migrations/0003_fencing_token_claim_plan_retention.down.sql"),
        // Breaking for readers: a release that knows only 0001 or 0002 claims without advancing
        // the fencing token or stamping the renewal time, and its recovery kills the jobs of
        // live replicas whose owner lock is briefly gone (docs/migrations.md).
        min_reader_version: 3,
    },
    Migration {
        version: 4,
        name: "cancel_requests",
        up: include_str!("../../migrations/0004_cancel_requests.up.sql"),
        down: include_str!("../../migrations/0004_cancel_requests.down.sql"),
        // A release before it would ignore the cancel requests recorded here.
        min_reader_version: 4,
    },
    Migration {
        version: 5,
        name: "notify_opt_out",
        up: include_str!("../../migrations/0005_notify_opt_out.up.sql"),
        down: include_str!("../../migrations/0005_notify_opt_out.down.sql"),
        // Additive: a release that never sets `durable_etl.notify` notifies as before. Not below
        // 4, because a database at 5 holds 0004's cancel requests, which older releases ignore.
        min_reader_version: 4,
    },
    Migration {
        version: 6,
        name: "ledger_without_fk",
        up: include_str!("../../migrations/0006_ledger_without_fk.up.sql"),
        down: include_str!("../../migrations/0006_ledger_without_fk.down.sql"),
        // Additive for readers: releases that know 0004 write ledger rows the same way.
        min_reader_version: 4,
    },
    Migration {
        version: 7,
        name: "jobs_view",
        up: include_str!("../../migrations/0007_jobs_view.up.sql"),
        down: include_str!("../../migrations/0007_jobs_view.down.sql"),
        // Additive: a view no release before it reads.
        min_reader_version: 4,
    },
    Migration {
        version: 8,
        name: "live_rows_and_outcomes",
        up: include_str!("../../migrations/0008_live_rows_and_outcomes.up.sql"),
        down: include_str!("../../migrations/0008_live_rows_and_outcomes.down.sql"),
        // Breaking for readers: the job table keeps live jobs only, ended jobs are outcome rows
        // and the ledger moved into them; no release before it can read or write this layout.
        min_reader_version: 8,
    },
    Migration {
        version: 9,
        name: "waiting_replicas",
        up: include_str!("../../migrations/0009_waiting_replicas.up.sql"),
        down: include_str!("../../migrations/0009_waiting_replicas.down.sql"),
        // Additive for readers: a release before it never registers as waiting, and is woken
        // whenever a newer replica waits, else found by its poll (docs/migrations.md).
        min_reader_version: 8,
    },
    Migration {
        version: 10,
        name: "operator_keys",
        up: include_str!("../../migrations/0010_operator_keys.up.sql"),
        down: include_str!("../../migrations/0010_operator_keys.down.sql"),
        // Additive: a column no release before it reads, with a default for the keys it creates.
        min_reader_version: 8,
    },
    Migration {
        version: 11,
        name: "replica_reports",
        up: include_str!("../../migrations/0011_replica_reports.up.sql"),
        down: include_str!("../../migrations/0011_replica_reports.down.sql"),
        // Additive: tables that releases before it never read or write.
        min_reader_version: 8,
    },
    Migration {
        version: 12,
        name: "attempt_history",
        up: include_str!("../../migrations/0012_attempt_history.up.sql"),
        down: include_str!("../../migrations/0012_attempt_history.down.sql"),
        // Additive for readers: a table that releases before it never read or write; the attempts
        // they end are only missing from the console's timeline.
        min_reader_version: 8,
    },
    Migration {
        version: 13,
        name: "cancel_on_live_row",
        up: include_str!("../../migrations/0013_cancel_on_live_row.up.sql"),
        down: include_str!("../../migrations/0013_cancel_on_live_row.down.sql"),
        // Breaking for readers: cancel requests moved from their table onto the live row, so
        // that a request and a commit serialize on the row lock; releases before it read the
        // table, which is gone.
        min_reader_version: 13,
    },
    Migration {
        version: 14,
        name: "owner_alive_locks",
        up: include_str!("../../migrations/0014_owner_alive_locks.up.sql"),
        down: include_str!("../../migrations/0014_owner_alive_locks.down.sql"),
        // Breaking for readers: the claim stamps the owner's heartbeat interval and alive locks,
        // which releases before it would leave stale on rows they give back or claim.
        min_reader_version: 14,
    },
    Migration {
        version: 15,
        name: "ended_sessions_and_incarnations",
        up: include_str!("../../migrations/0015_ended_sessions_and_incarnations.up.sql"),
        down: include_str!("../../migrations/0015_ended_sessions_and_incarnations.down.sql"),
        // Additive for the queue: a table and columns of the console's; releases before it keep
        // running, their replicas' reports refused and their cookies not accepted by the new
        // console (docs/migrations.md).
        min_reader_version: 8,
    },
    Migration {
        version: 16,
        name: "pending_owner_listing",
        up: include_str!("../../migrations/0016_pending_owner_listing.up.sql"),
        down: include_str!("../../migrations/0016_pending_owner_listing.down.sql"),
        // Additive: an index that releases before it never use.
        min_reader_version: 8,
    },
    Migration {
        version: 17,
        name: "optional_ledger",
        up: include_str!("../../migrations/0017_optional_ledger.up.sql"),
        down: include_str!("../../migrations/0017_optional_ledger.down.sql"),
        // Additive for readers: releases before it write a ledger for every success, which the
        // new rule admits, and read the ledger as optional already.
        min_reader_version: 8,
    },
    Migration {
        version: 18,
        name: "kind_failure_codes",
        up: include_str!("../../migrations/0018_kind_failure_codes.up.sql"),
        down: include_str!("../../migrations/0018_kind_failure_codes.down.sql"),
        // Additive for readers: releases before it read the code as text and never run the
        // kinds that declare codes of their own.
        min_reader_version: 8,
    },
    Migration {
        version: 19,
        name: "name_checks_without_regex",
        up: include_str!("../../migrations/0019_name_checks_without_regex.up.sql"),
        down: include_str!("../../migrations/0019_name_checks_without_regex.down.sql"),
        // The same rows are admitted: nothing a reader or writer does changes.
        min_reader_version: 8,
    },
    Migration {
        version: 20,
        name: "queues_and_priorities",
        up: include_str!("../../migrations/0020_queues_and_priorities.up.sql"),
        down: include_str!("../../migrations/0020_queues_and_priorities.down.sql"),
        // Breaking for readers: a release before it inserts live rows without their virtual
        // deadline and claims every queue through an index that is gone.
        min_reader_version: 20,
    },
    Migration {
        version: 21,
        name: "queue_caps",
        up: include_str!("../../migrations/0021_queue_caps.up.sql"),
        down: include_str!("../../migrations/0021_queue_caps.down.sql"),
        // Additive for readers: release 20 takes and frees no permits (a mixed fleet can exceed
        // a cap, never lose a job).
        min_reader_version: 20,
    },
    Migration {
        version: 22,
        name: "key_caps",
        up: include_str!("../../migrations/0022_key_caps.up.sql"),
        down: include_str!("../../migrations/0022_key_caps.down.sql"),
        // Breaking for readers: a release before it frees no key permit, so a claim of this
        // release that it recovered or finished would leave its key's permit held for good.
        min_reader_version: 22,
    },
    Migration {
        version: 23,
        name: "freer_claims",
        up: include_str!("../../migrations/0023_freer_claims.up.sql"),
        down: include_str!("../../migrations/0023_freer_claims.down.sql"),
        // Additive for readers: release 22 never marks its completions, so its freed permits
        // wake the waiting replicas as before.
        min_reader_version: 22,
    },
    Migration {
        version: 24,
        name: "targeted_wakes",
        up: include_str!("../../migrations/0024_targeted_wakes.up.sql"),
        down: include_str!("../../migrations/0024_targeted_wakes.down.sql"),
        // Additive for readers: their rows have no token and get the empty NOTIFY, as before.
        min_reader_version: 22,
    },
    Migration {
        version: 25,
        name: "kept_enqueue_plans",
        up: include_str!("../../migrations/0025_kept_enqueue_plans.up.sql"),
        down: include_str!("../../migrations/0025_kept_enqueue_plans.down.sql"),
        // Additive for readers: releases before it send the unkeyed insert themselves.
        min_reader_version: 22,
    },
    Migration {
        version: 26,
        name: "checks_as_domains",
        up: include_str!("../../migrations/0026_checks_as_domains.up.sql"),
        down: include_str!("../../migrations/0026_checks_as_domains.down.sql"),
        // Breaking for release 22 only: its prepared claim returns moved columns directly, and a
        // prepared statement whose result types change fails until its session closes. Releases
        // 23 and later write these columns typed and their claims return base types.
        min_reader_version: 23,
    },
    Migration {
        version: 27,
        name: "waiting_rows_in_place",
        up: include_str!("../../migrations/0027_waiting_rows_in_place.up.sql"),
        down: include_str!("../../migrations/0027_waiting_rows_in_place.down.sql"),
        // Releases before it register without checking that they wrote their row, so one could
        // count itself waiting behind a row an enqueue parked and still holds, deaf until its poll.
        min_reader_version: 27,
    },
    Migration {
        version: 28,
        name: "wakes_without_takes",
        up: include_str!("../../migrations/0028_wakes_without_takes.up.sql"),
        down: include_str!("../../migrations/0028_wakes_without_takes.down.sql"),
        // Breaking for readers: a release before it reads a notification's payload as a bare
        // wake token, so the new payloads would never wake it.
        min_reader_version: 28,
    },
    Migration {
        version: 29,
        name: "wake_in_one_read",
        up: include_str!("../../migrations/0029_wake_in_one_read.up.sql"),
        down: include_str!("../../migrations/0029_wake_in_one_read.down.sql"),
        // Additive for readers: the notifications' payloads are 0028's.
        min_reader_version: 28,
    },
    Migration {
        version: 30,
        name: "owner_beats",
        up: include_str!("../../migrations/0030_owner_beats.up.sql"),
        down: include_str!("../../migrations/0030_owner_beats.down.sql"),
        // Additive for readers: a release before it writes no beat and is judged as before.
        min_reader_version: 28,
    },
    Migration {
        version: 31,
        name: "deferred_cancels",
        up: include_str!("../../migrations/0031_deferred_cancels.up.sql"),
        down: include_str!("../../migrations/0031_deferred_cancels.down.sql"),
        // Additive for readers: a release before it never records a deferred cancel, and this
        // release's replicas and API apply what its own API records.
        min_reader_version: 28,
    },
    Migration {
        version: 32,
        name: "recovered_attempt_owners",
        up: include_str!("../../migrations/0032_recovered_attempt_owners.up.sql"),
        down: include_str!("../../migrations/0032_recovered_attempt_owners.down.sql"),
        // Additive for readers: a release before it records no owner and never reads it.
        min_reader_version: 28,
    },
    Migration {
        version: 33,
        name: "recorded_output",
        up: include_str!("../../migrations/0033_recorded_output.up.sql"),
        down: include_str!("../../migrations/0033_recorded_output.down.sql"),
        // Succeeded jobs' results move to `output`: a reader before it would show none.
        min_reader_version: 33,
    },
    Migration {
        version: 34,
        name: "schedules",
        up: include_str!("../../migrations/0034_schedules.up.sql"),
        down: include_str!("../../migrations/0034_schedules.down.sql"),
        // Additive: a release before it never reads the new tables.
        min_reader_version: 33,
    },
    Migration {
        version: 35,
        name: "dead_letters",
        up: include_str!("../../migrations/0035_dead_letters.up.sql"),
        down: include_str!("../../migrations/0035_dead_letters.down.sql"),
        // Additive: a release before it never reads the new tables.
        min_reader_version: 33,
    },
    Migration {
        version: 36,
        name: "attempt_diagnoses",
        up: include_str!("../../migrations/0036_attempt_diagnoses.up.sql"),
        down: include_str!("../../migrations/0036_attempt_diagnoses.down.sql"),
        // Additive: a release before it neither writes nor reads the new columns.
        min_reader_version: 33,
    },
    Migration {
        version: 37,
        name: "audit_log",
        up: include_str!("../../migrations/0037_audit_log.up.sql"),
        down: include_str!("../../migrations/0037_audit_log.down.sql"),
        // Additive: a release before it never reads the new table.
        min_reader_version: 33,
    },
    Migration {
        version: 38,
        name: "minute_series",
        up: include_str!("../../migrations/0038_minute_series.up.sql"),
        down: include_str!("../../migrations/0038_minute_series.down.sql"),
        // Additive: a release before it writes NULL in the new columns and never reads the new
        // table.
        min_reader_version: 33,
    },
    Migration {
        version: 39,
        name: "audit_sources",
        up: include_str!("../../migrations/0039_audit_sources.up.sql"),
        down: include_str!("../../migrations/0039_audit_sources.down.sql"),
        // Additive: a release before it never reads the new column, and its console's entries
        // take the column's default (`console`).
        min_reader_version: 33,
    },
    Migration {
        version: 40,
        name: "live_table_never_truncated",
        up: include_str!("../../migrations/0040_live_table_never_truncated.up.sql"),
        down: include_str!("../../migrations/0040_live_table_never_truncated.down.sql"),
        // A storage parameter: no release reads it.
        min_reader_version: 33,
    },
    Migration {
        version: 41,
        name: "cells",
        up: include_str!("../../migrations/0041_cells.up.sql"),
        down: include_str!("../../migrations/0041_cells.down.sql"),
        // Additive: outside a cell every name stays the previous release's.
        min_reader_version: 33,
    },
    Migration {
        version: 42,
        name: "owner_moves",
        up: include_str!("../../migrations/0042_owner_moves.up.sql"),
        down: include_str!("../../migrations/0042_owner_moves.down.sql"),
        // Additive: a release before it never reads the new tables, and its enqueues of a moved
        // owner are refused as this release's are.
        min_reader_version: 33,
    },
];
