//! The operator view's figures: live replicas, the backlog, and the last hour minute by minute
//! (jobs ended by queue, pickup latency percentiles, recoveries, failures by code, the backlog),
//! all from aggregates the replicas report (migrations 0011 and 0038) and the active-job sample;
//! never a job, an owner or a payload.
//!
//! Invariants this module keeps:
//! - No query reads the history (intake rows, outcomes, attempts): each is bounded by the size of
//!   the fleet or of the backlog. The replica table holds one row per live replica; the minute
//!   table holds two hours per replica and is read over its last 61 minutes (about half of it, so
//!   the planner rightly scans it whole: its primary key's range would read as many pages); the
//!   backlog table holds a row per minute, read over the last 60 along its primary key; the
//!   backlog sample reads the live table of active jobs only, through its partial indexes or a
//!   scan, whichever the planner prefers. `benches/console.rs` measures the page with 1,000,000
//!   ended jobs.
//! - A replica's minute rows hold its incarnation's totals since it started (migration 0015: one
//!   row per minute, owner id and incarnation); a minute's figure is the sum over incarnations of
//!   the difference from the incarnation's previous row (the same owner id, incarnation and
//!   `started_at`), or the total itself in the minute it started. Two incarnations of one owner
//!   id in one minute (a restart after `kill -9`) add up. A difference across a gap in its
//!   reports is counted in the minute that ends the gap. The same holds of each queue's totals
//!   and each pickup latency bucket's.
//! - A minute row without per-queue totals or pickup buckets (NULL: written by a release before
//!   migration 0038, or without a previous row that has them) is no data, never zero: its jobs
//!   count under [`NOT_REPORTED`] instead of a queue, and its pickups in no percentile.
//! - A percentile is the upper bound of the latency bucket it falls in (`stats::LATENCY_BUCKETS`,
//!   in milliseconds): the true figure is at most that; one beyond the last bound is shown at
//!   it. A minute nobody picked a job up in has no percentile.
//! - The backlog is one row per minute (`worker::liveness::backlog`); a minute without one is
//!   unknown (no replica of a release with 0038 reported in it), never zero.

use crate::service::cells::CellFigures;
use crate::service::metrics::{sample_queue, sample_queues, QueueDepth, QueueSample};
use crate::worker::stats::LATENCY_BUCKETS;
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;
use tokio_postgres::GenericClient;
use uuid::Uuid;

/// Minutes shown.
pub(crate) const MINUTES: i64 = 60;

/// The name the jobs ended per queue go under when their minute row has no per-queue totals.
pub(crate) const NOT_REPORTED: &str = "queue not reported";

/// The live replicas, by owner id.
///
/// Locks: none (a snapshot read of one row per replica).
const REPLICAS_SQL: &str = "
SELECT owner_id, started_at, extract(epoch FROM now() - reported_at)::float8, held, claim_rate
  FROM etl_replicas ORDER BY owner_id";

/// The replicas' minute rows of the last 61 minutes (one more than shown, for differences), and
/// the database's current minute.
///
/// Locks: none (the rows of the last 61 minutes, about half the table: a scan of it, or a range
/// of the primary key `(minute, owner_id, incarnation)`).
const MINUTES_SQL: &str = "
SELECT minute, owner_id, started_at, succeeded, failed, failed_by_code, recovered, pickups,
       pickup_seconds, date_trunc('minute', now()), incarnation, by_queue, pickup_buckets
  FROM etl_replica_minutes
 WHERE minute >= date_trunc('minute', now()) - interval '61 minutes'
 ORDER BY owner_id, started_at, incarnation, minute";

/// The backlog rows of the last [`MINUTES`] minutes, and the database's current minute.
///
/// Locks: none (at most 60 rows, a range of the primary key).
const BACKLOG_SQL: &str = "
SELECT minute, due, deferred, running, date_trunc('minute', now())
  FROM etl_backlog_minutes
 WHERE minute > date_trunc('minute', now()) - interval '60 minutes'
 ORDER BY minute";

/// A live replica.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Replica {
    /// Its owner id.
    pub(crate) owner_id: String,
    /// When it started.
    pub(crate) started_at: DateTime<Utc>,
    /// Seconds since its last report.
    pub(crate) silent_for: f64,
    /// Jobs it holds (running, committing or buffered).
    pub(crate) held: i32,
    /// Jobs it claimed per second over its last report interval.
    pub(crate) claim_rate: f64,
}

/// One replica's totals at the end of a minute.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Totals {
    /// The minute.
    pub(crate) minute: DateTime<Utc>,
    /// The replica.
    pub(crate) owner_id: String,
    /// That incarnation of it (nil for rows written before migration 0015).
    pub(crate) incarnation: Uuid,
    /// When that incarnation of it started.
    pub(crate) started_at: DateTime<Utc>,
    /// Jobs succeeded since it started.
    pub(crate) succeeded: i64,
    /// Jobs failed since it started.
    pub(crate) failed: i64,
    /// Jobs failed since it started, by stored code.
    pub(crate) failed_by_code: BTreeMap<String, i64>,
    /// Jobs it recovered since it started.
    pub(crate) recovered: i64,
    /// Jobs it picked up since it started.
    pub(crate) pickups: i64,
    /// Their pickup latencies, summed, in seconds.
    pub(crate) pickup_seconds: f64,
    /// Jobs succeeded and failed since it started, by queue (`None`: not reported).
    pub(crate) by_queue: Option<BTreeMap<String, [i64; 2]>>,
    /// Its pickups since it started, per latency bucket (`None`: not reported).
    pub(crate) pickup_buckets: Option<Vec<i64>>,
}

/// One minute of the fleet.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Minute {
    /// Jobs that ended succeeded.
    pub(crate) succeeded: i64,
    /// Jobs that ended failed.
    pub(crate) failed: i64,
    /// Jobs recovered.
    pub(crate) recovered: i64,
    /// Jobs picked up.
    pub(crate) pickups: i64,
    /// Their pickup latencies, summed, in seconds.
    pub(crate) pickup_seconds: f64,
    /// Jobs that ended failed, by stored code.
    pub(crate) failed_by_code: BTreeMap<String, i64>,
    /// Jobs that ended succeeded and failed, by queue (or [`NOT_REPORTED`]).
    pub(crate) by_queue: BTreeMap<String, [i64; 2]>,
    /// Pickups per latency bucket, of the rows that reported them (empty: none did).
    pub(crate) pickup_buckets: Vec<i64>,
}

impl Minute {
    /// The mean pickup latency in milliseconds, if anything was picked up.
    pub(crate) fn mean_pickup_ms(&self) -> Option<f64> {
        (self.pickups > 0).then(|| self.pickup_seconds * 1000.0 / self.pickups as f64)
    }

    /// The pickup latency percentile `q` (0 to 1) in milliseconds: the upper bound of the
    /// bucket it falls in (the last bound for one beyond it), if a pickup was counted in a
    /// bucket.
    pub(crate) fn pickup_percentile_ms(&self, q: f64) -> Option<f64> {
        let total: i64 = self.pickup_buckets.iter().sum();
        if total <= 0 {
            return None;
        }
        // The rank of the percentile's pickup, from 1.
        let rank = ((q * total as f64).ceil() as i64).clamp(1, total);
        let mut seen = 0;
        let bucket = self.pickup_buckets.iter().position(|n| {
            seen += n;
            seen >= rank
        })?;
        let last = LATENCY_BUCKETS.len() - 1;
        LATENCY_BUCKETS
            .get(bucket.min(last))
            .map(|seconds| seconds * 1000.0)
    }
}

/// The active jobs at one minute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Backlog {
    /// Due.
    pub(crate) due: i64,
    /// Deferred or waiting to retry.
    pub(crate) deferred: i64,
    /// Running.
    pub(crate) running: i64,
}

/// A recovery event: jobs one replica's recovery gave back (or ended) in one minute.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Recovery {
    /// The minute.
    pub(crate) minute: DateTime<Utc>,
    /// The replica whose recovery took them.
    pub(crate) owner_id: String,
    /// How many jobs.
    pub(crate) jobs: i64,
}

/// The fleet's last hour.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LastHour {
    /// The last [`MINUTES`] minutes, oldest first.
    pub(crate) minutes: Vec<Minute>,
    /// Failures in those minutes, by stored code.
    pub(crate) failures: BTreeMap<String, i64>,
    /// Recovery events in those minutes, newest first.
    pub(crate) recoveries: Vec<Recovery>,
    /// The backlog at each of those minutes, oldest first (`None`: unknown).
    pub(crate) backlog: Vec<Option<Backlog>>,
}

/// The operator view's figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Overview {
    /// Live replicas.
    pub(crate) replicas: Vec<Replica>,
    /// The active jobs by state, and the oldest due job's age.
    pub(crate) backlog: QueueSample,
    /// The same per queue (the deepest [`crate::service::metrics::QUEUES_SHOWN`]), with each queue's cap,
    /// permits held and pause.
    pub(crate) queues: Vec<QueueDepth>,
    /// The last hour, minute by minute.
    pub(crate) hour: LastHour,
    /// On an API serving every cell of a directory: each cell's figures (the rest of the view is
    /// the operator key's own cell's).
    pub(crate) cells: Option<Vec<CellFigures>>,
}

/// Reads the operator view's figures.
///
/// # Errors
/// Database errors.
pub(crate) async fn overview(
    client: &impl GenericClient,
) -> Result<Overview, tokio_postgres::Error> {
    // The five reads are pipelined on the one connection, each in one round trip.
    let (replica_rows, rows, backlog_rows, backlog, queues) = tokio::try_join!(
        client.query_typed(REPLICAS_SQL, &[]),
        client.query_typed(MINUTES_SQL, &[]),
        client.query_typed(BACKLOG_SQL, &[]),
        sample_queue(client),
        sample_queues(client)
    )?;
    let replicas = replica_rows
        .iter()
        .map(|r| Replica {
            owner_id: r.get(0),
            started_at: r.get(1),
            silent_for: r.get(2),
            held: r.get(3),
            claim_rate: r.get(4),
        })
        .collect();
    let now: Option<DateTime<Utc>> = rows
        .first()
        .map(|r| r.get(9))
        .or_else(|| backlog_rows.first().map(|r| r.get(4)));
    let totals: Vec<Totals> = rows
        .iter()
        .map(|r| {
            let by_code: serde_json::Value = r.get(5);
            let by_queue: Option<serde_json::Value> = r.get(11);
            Totals {
                minute: r.get(0),
                owner_id: r.get(1),
                incarnation: r.get(10),
                started_at: r.get(2),
                succeeded: r.get(3),
                failed: r.get(4),
                failed_by_code: by_code
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), v.as_i64().unwrap_or(0)))
                            .collect()
                    })
                    .unwrap_or_default(),
                recovered: r.get(6),
                pickups: r.get(7),
                pickup_seconds: r.get(8),
                by_queue: by_queue.as_ref().and_then(queue_totals),
                pickup_buckets: r.get(12),
            }
        })
        .collect();
    let mut hour = now.map(|now| per_minute(&totals, now)).unwrap_or_default();
    if hour.minutes.is_empty() {
        hour.minutes = vec![Minute::default(); MINUTES as usize];
    }
    hour.backlog = vec![None; MINUTES as usize];
    if let Some(now) = now {
        let first = now - chrono::Duration::minutes(MINUTES - 1);
        for r in &backlog_rows {
            let minute: DateTime<Utc> = r.get(0);
            let index = usize::try_from((minute - first).num_minutes()).ok();
            if let Some(slot) = index.and_then(|i| hour.backlog.get_mut(i)) {
                *slot = Some(Backlog {
                    due: r.get(1),
                    deferred: r.get(2),
                    running: r.get(3),
                });
            }
        }
    }
    Ok(Overview {
        replicas,
        backlog,
        queues,
        hour,
        cells: None,
    })
}

/// A minute row's per-queue totals, `{"queue": [succeeded, failed]}`; `None` if it is not that
/// shape.
fn queue_totals(value: &serde_json::Value) -> Option<BTreeMap<String, [i64; 2]>> {
    value
        .as_object()?
        .iter()
        .map(|(queue, counts)| {
            let counts = counts.as_array()?;
            let at = |i: usize| counts.get(i).and_then(serde_json::Value::as_i64);
            Some((queue.clone(), [at(0)?, at(1)?]))
        })
        .collect()
}

/// Adds to `minute` the jobs `row` ended by queue since `before` (its incarnation's previous
/// row; none when it started in the minute), or, when either has no per-queue totals, its
/// fleet-wide differences under [`NOT_REPORTED`].
fn add_by_queue(minute: &mut Minute, row: &Totals, before: Option<&Totals>, fleet: [i64; 2]) {
    let nothing = BTreeMap::new();
    let then = match before {
        Some(before) => before.by_queue.as_ref(),
        None => Some(&nothing),
    };
    let (Some(now), Some(then)) = (row.by_queue.as_ref(), then) else {
        let counts = minute.by_queue.entry(NOT_REPORTED.to_owned()).or_default();
        counts[0] += fleet[0];
        counts[1] += fleet[1];
        return;
    };
    for (queue, [ok, failed]) in now {
        let [ok_then, failed_then] = then.get(queue).copied().unwrap_or_default();
        let added = [(ok - ok_then).max(0), (failed - failed_then).max(0)];
        if added != [0, 0] {
            let counts = minute.by_queue.entry(queue.clone()).or_default();
            counts[0] += added[0];
            counts[1] += added[1];
        }
    }
}

/// Adds to `minute` the pickups `row` counted per latency bucket since `before` (as
/// [`add_by_queue`]), if both have buckets, and as many as the minute's.
fn add_buckets(minute: &mut Minute, row: &Totals, before: Option<&Totals>) {
    let Some(now) = row.pickup_buckets.as_ref() else {
        return;
    };
    let zeros = vec![0; now.len()];
    let then = match before {
        Some(before) => before.pickup_buckets.as_ref(),
        None => Some(&zeros),
    };
    let Some(then) = then.filter(|then| then.len() == now.len()) else {
        return;
    };
    if minute.pickup_buckets.is_empty() {
        minute.pickup_buckets = zeros.clone();
    }
    if minute.pickup_buckets.len() != now.len() {
        return;
    }
    for ((sum, n), was) in minute.pickup_buckets.iter_mut().zip(now).zip(then) {
        *sum += (n - was).max(0);
    }
}

/// The fleet's last [`MINUTES`] minutes up to `now` (oldest first), their failures by code and
/// their recovery events, from the replicas' totals (ordered by replica, then incarnation, then
/// minute; see the module's invariants).
pub(crate) fn per_minute(totals: &[Totals], now: DateTime<Utc>) -> LastHour {
    let first = now - chrono::Duration::minutes(MINUTES - 1);
    let mut minutes = vec![Minute::default(); MINUTES as usize];
    let mut failures = BTreeMap::new();
    let mut recoveries = Vec::new();
    let mut previous: Option<&Totals> = None;
    for row in totals {
        let before = previous.filter(|p| {
            p.owner_id == row.owner_id
                && p.incarnation == row.incarnation
                && p.started_at == row.started_at
        });
        previous = Some(row);
        let started_then = row.started_at >= row.minute - chrono::Duration::minutes(1);
        if row.minute < first || (before.is_none() && !started_then) {
            continue;
        }
        let index = (row.minute - first).num_minutes();
        let Some(minute) = usize::try_from(index).ok().and_then(|i| minutes.get_mut(i)) else {
            continue;
        };
        let delta = |now: i64, then: fn(&Totals) -> i64| (now - before.map_or(0, then)).max(0);
        let ended = [
            delta(row.succeeded, |t| t.succeeded),
            delta(row.failed, |t| t.failed),
        ];
        minute.succeeded += ended[0];
        minute.failed += ended[1];
        add_by_queue(minute, row, before, ended);
        add_buckets(minute, row, before);
        let recovered = delta(row.recovered, |t| t.recovered);
        minute.recovered += recovered;
        if recovered > 0 {
            recoveries.push(Recovery {
                minute: row.minute,
                owner_id: row.owner_id.clone(),
                jobs: recovered,
            });
        }
        minute.pickups += delta(row.pickups, |t| t.pickups);
        minute.pickup_seconds +=
            (row.pickup_seconds - before.map_or(0.0, |t| t.pickup_seconds)).max(0.0);
        for (code, n) in &row.failed_by_code {
            let was = before.and_then(|t| t.failed_by_code.get(code)).copied();
            let added = (n - was.unwrap_or(0)).max(0);
            if added > 0 {
                *failures.entry(code.clone()).or_insert(0) += added;
                *minute.failed_by_code.entry(code.clone()).or_insert(0) += added;
            }
        }
    }
    recoveries.sort_by(|a, b| b.minute.cmp(&a.minute).then(a.owner_id.cmp(&b.owner_id)));
    LastHour {
        minutes,
        failures,
        recoveries,
        backlog: vec![None; MINUTES as usize],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 12:00 plus `m` minutes.
    fn at(m: i64) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-12-01T12:00:00Z")
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or_default()
            + chrono::Duration::minutes(m)
    }

    /// A row of `owner`'s totals at minute `m`, of the incarnation started at minute `start`,
    /// having recovered as many jobs as it failed.
    fn row(owner: &str, m: i64, start: i64, succeeded: i64, failed: &[(&str, i64)]) -> Totals {
        let failed_total = failed.iter().map(|(_, n)| n).sum();
        Totals {
            minute: at(m),
            owner_id: owner.to_owned(),
            incarnation: Uuid::from_u128(u128::try_from(start).unwrap_or_default()),
            started_at: at(start),
            succeeded,
            failed: failed_total,
            failed_by_code: failed.iter().map(|(c, n)| ((*c).to_owned(), *n)).collect(),
            recovered: failed_total,
            pickups: succeeded,
            pickup_seconds: succeeded as f64 * 0.001,
            by_queue: None,
            pickup_buckets: None,
        }
    }

    #[test]
    fn minutes_are_differences_within_an_incarnation() {
        let now = at(100);
        let totals = [
            // Started long before the window: its first row in the window is only a baseline.
            row("a", 39, 0, 1_000, &[]),
            row("a", 41, 0, 1_010, &[("handler_failed", 1)]),
            row("a", 42, 0, 1_030, &[("handler_failed", 3)]),
            // Restarted at 99: counts from its start, not from the old incarnation's totals.
            row("a", 99, 99, 5, &[]),
            // Started in the window.
            row("b", 98, 98, 7, &[]),
            row("b", 100, 98, 9, &[("invalid_payload", 2)]),
        ];
        let LastHour {
            minutes,
            failures,
            recoveries,
            ..
        } = per_minute(&totals, now);
        assert_eq!(minutes.len(), 60);
        // The window is 41..=100.
        assert_eq!(minutes[0].succeeded, 10, "41: 1,010 - 1,000");
        assert_eq!(minutes[1].succeeded, 20);
        assert_eq!(minutes[58].succeeded, 5, "99: the restarted incarnation");
        assert_eq!(minutes[57].succeeded, 7, "98: b's first minute");
        assert_eq!(minutes[59].succeeded, 2);
        assert_eq!(minutes[59].failed, 2);
        assert_eq!(
            minutes[59].failed_by_code,
            BTreeMap::from([("invalid_payload".to_owned(), 2)])
        );
        let total: i64 = minutes.iter().map(|m| m.succeeded).sum();
        assert_eq!(total, 44);
        assert_eq!(
            failures,
            BTreeMap::from([
                ("handler_failed".to_owned(), 3),
                ("invalid_payload".to_owned(), 2)
            ])
        );
        let event = |m: i64, owner: &str, jobs: i64| Recovery {
            minute: at(m),
            owner_id: owner.to_owned(),
            jobs,
        };
        assert_eq!(
            recoveries,
            [event(100, "b", 2), event(42, "a", 2), event(41, "a", 1)],
            "newest first; a's baseline at 39 is no event"
        );
        assert_eq!(minutes[1].recovered, 2);
        assert_eq!(minutes[1].mean_pickup_ms().map(|ms| ms.round()), Some(1.0));
        assert_eq!(Minute::default().mean_pickup_ms(), None);
    }

    #[test]
    fn incarnations_of_one_owner_id_in_one_minute_add_up() {
        let now = at(100);
        // Killed at 99 after 41 jobs (5 failed); restarted in the same minute: 23 more (2 failed).
        let first = row("a", 99, 99, 36, &[("record_invalid", 5)]);
        let mut second = row("a", 99, 99, 21, &[("record_invalid", 2)]);
        second.incarnation = Uuid::from_u128(7);
        second.started_at = at(99) + chrono::Duration::seconds(30);
        let LastHour {
            minutes, failures, ..
        } = per_minute(&[first, second], now);
        assert_eq!(minutes[58].succeeded, 57);
        assert_eq!(minutes[58].failed, 7);
        assert_eq!(failures, BTreeMap::from([("record_invalid".to_owned(), 7)]));
    }

    /// `row` with per-queue totals `by_queue` and pickup buckets `buckets` (15 counts).
    fn reported(
        mut row: Totals,
        by_queue: &[(&str, [i64; 2])],
        buckets: &[(usize, i64)],
    ) -> Totals {
        row.by_queue = Some(
            by_queue
                .iter()
                .map(|(q, n)| ((*q).to_owned(), *n))
                .collect(),
        );
        let mut counts = vec![0; LATENCY_BUCKETS.len() + 1];
        for (bucket, n) in buckets {
            counts[*bucket] = *n;
        }
        row.pickup_buckets = Some(counts);
        row
    }

    #[test]
    fn each_queues_minutes_are_differences_within_an_incarnation_and_add_up_across_them() {
        let now = at(100);
        let totals = [
            // Long running: a baseline at 98, then 4 more in mail and 1 failed in etl.
            reported(row("a", 98, 0, 10, &[]), &[("mail", [10, 0])], &[]),
            reported(
                row("a", 99, 0, 14, &[("handler_failed", 1)]),
                &[("mail", [14, 0]), ("etl", [0, 1])],
                &[],
            ),
            // Killed at 100 after 3 in mail; restarted in the same minute: 2 more in mail.
            reported(row("b", 100, 100, 3, &[]), &[("mail", [3, 0])], &[]),
            {
                let mut second = reported(row("b", 100, 100, 2, &[]), &[("mail", [2, 0])], &[]);
                second.incarnation = Uuid::from_u128(7);
                second.started_at = at(100) + chrono::Duration::seconds(30);
                second
            },
        ];
        let LastHour { minutes, .. } = per_minute(&totals, now);
        assert_eq!(minutes[57].by_queue, BTreeMap::new(), "98: a baseline only");
        assert_eq!(
            minutes[58].by_queue,
            BTreeMap::from([("etl".to_owned(), [0, 1]), ("mail".to_owned(), [4, 0])])
        );
        assert_eq!(
            minutes[59].by_queue,
            BTreeMap::from([("mail".to_owned(), [5, 0])]),
            "both incarnations of b"
        );
        for minute in &minutes {
            let by_queue: i64 = minute
                .by_queue
                .values()
                .map(|[ok, failed]| ok + failed)
                .sum();
            assert_eq!(by_queue, minute.succeeded + minute.failed);
        }
    }

    #[test]
    fn percentiles_are_the_bounds_of_the_buckets_they_fall_in() {
        let now = at(100);
        // 100 pickups in minute 100 across two replicas: 60 within 1 ms (bucket 1), 39 within
        // 25 ms (bucket 5), 1 slower than 60 s (the last bucket).
        let last = LATENCY_BUCKETS.len();
        let totals = [
            reported(row("a", 99, 0, 0, &[]), &[], &[(1, 500)]),
            reported(row("a", 100, 0, 0, &[]), &[], &[(1, 540), (5, 39)]),
            reported(row("b", 100, 100, 0, &[]), &[], &[(1, 20), (last, 1)]),
        ];
        let LastHour { minutes, .. } = per_minute(&totals, now);
        let minute = &minutes[59];
        assert_eq!(minute.pickup_buckets.iter().sum::<i64>(), 100);
        assert_eq!(minute.pickup_percentile_ms(0.5), Some(1.0));
        assert_eq!(minute.pickup_percentile_ms(0.55), Some(1.0));
        assert_eq!(minute.pickup_percentile_ms(0.61), Some(25.0));
        assert_eq!(minute.pickup_percentile_ms(0.99), Some(25.0));
        assert_eq!(
            minute.pickup_percentile_ms(1.0),
            Some(60_000.0),
            "beyond: the last bound"
        );
        assert_eq!(
            minutes[58].pickup_percentile_ms(0.5),
            None,
            "a baseline only"
        );
        assert_eq!(Minute::default().pickup_percentile_ms(0.99), None);
    }

    #[test]
    fn rows_of_a_release_before_0038_are_no_data_not_zero() {
        let now = at(100);
        let totals = [
            // An old replica: no per-queue totals, no buckets.
            row("old", 99, 0, 10, &[]),
            row("old", 100, 0, 13, &[("handler_failed", 1)]),
            // A new one beside it.
            reported(row("new", 100, 100, 2, &[]), &[("mail", [2, 0])], &[(0, 2)]),
        ];
        let LastHour { minutes, .. } = per_minute(&totals, now);
        assert_eq!(
            minutes[59].by_queue,
            BTreeMap::from([
                ("mail".to_owned(), [2, 0]),
                (NOT_REPORTED.to_owned(), [3, 1])
            ])
        );
        assert_eq!(
            minutes[59].pickup_buckets.iter().sum::<i64>(),
            2,
            "the new one's only"
        );
        assert_eq!(minutes[59].pickup_percentile_ms(0.99), Some(0.5));
        let old_only = per_minute(&totals[..2], now);
        assert!(old_only.minutes[59].pickup_buckets.is_empty());
        assert_eq!(old_only.minutes[59].pickup_percentile_ms(0.5), None);
        assert_eq!(
            old_only.minutes[59].mean_pickup_ms().map(f64::round),
            Some(1.0)
        );
        assert!(old_only.backlog.iter().all(Option::is_none));
        assert_eq!(queue_totals(&serde_json::json!({"mail": [1]})), None);
        assert_eq!(
            queue_totals(&serde_json::json!({"mail": [1, 2]})),
            Some(BTreeMap::from([("mail".to_owned(), [1, 2])]))
        );
    }
}
