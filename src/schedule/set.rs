//! The schedules a release ships with, declared together at start-up: the builder beside
//! [`crate::Worker::start`].
//!
//! Invariants this module keeps:
//! - A set is declared in one transaction: every schedule it names is inserted or updated, or,
//!   if one is refused, none is, and the refusal is the first schedule's (its code and pointer,
//!   with the schedule's position in the set).
//! - Declaring a set never deletes a schedule it does not name, so two releases with different
//!   sets keep both sets firing during a rolling deploy, each fire once
//!   ([`super::Schedules::declare`]).

use super::{Makes, Missed, Overlap, ScheduleInfo, ScheduleOptions, Schedules};
use crate::error::Error;
use crate::job::Job;

/// The schedules of one owner that an application declares in its code, built once and declared
/// at start-up, before [`crate::Worker::start`]:
///
/// ```no_run
/// # use durable_etl::{Job, Jobs};
/// # use durable_etl::schedule::{ScheduleOptions, ScheduleSet};
/// # #[derive(serde::Serialize, serde::Deserialize)] struct Report;
/// # impl Job for Report { const KIND: &'static str = "report"; }
/// # async fn start(jobs: Jobs, client: &mut tokio_postgres::Client) -> Result<(), durable_etl::Error> {
/// ScheduleSet::new()
///     .schedule("nightly_report", "30 1 * * *", &Report, ScheduleOptions {
///         time_zone: Some("America/New_York"),
///         ..ScheduleOptions::default()
///     })
///     .schedule("hourly_report", "@hourly", &Report, ScheduleOptions::default())
///     .declare(client, &jobs.schedules())
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct ScheduleSet {
    /// The schedules, in the order they were added.
    entries: Vec<Entry>,
}

/// One schedule of a [`ScheduleSet`], its options owned.
#[derive(Debug, Clone)]
struct Entry {
    /// Its name.
    name: String,
    /// Its cron expression.
    cron: String,
    /// What it makes.
    makes: Makes,
    /// [`ScheduleOptions::time_zone`].
    time_zone: Option<String>,
    /// [`ScheduleOptions::queue`].
    queue: Option<String>,
    /// [`ScheduleOptions::priority`].
    priority: Option<i16>,
    /// [`ScheduleOptions::max_attempts`].
    max_attempts: Option<i32>,
    /// [`ScheduleOptions::missed`].
    missed: Missed,
    /// [`ScheduleOptions::overlap`].
    overlap: Overlap,
}

impl ScheduleSet {
    /// An empty set.
    pub fn new() -> ScheduleSet {
        ScheduleSet::default()
    }

    /// The set with schedule `name` added: at each fire of `cron` it enqueues `job` (its
    /// arguments, serialized now), as [`Schedules::declare`] would. Nothing is checked until the
    /// set is declared.
    #[must_use]
    pub fn schedule<J: Job>(
        mut self,
        name: &str,
        cron: &str,
        job: &J,
        options: ScheduleOptions<'_>,
    ) -> ScheduleSet {
        self.entries.push(Entry {
            name: name.to_owned(),
            cron: cron.to_owned(),
            makes: Makes::of(job),
            time_zone: options.time_zone.map(str::to_owned),
            queue: options.queue.map(str::to_owned),
            priority: options.priority,
            max_attempts: options.max_attempts,
            missed: options.missed,
            overlap: options.overlap,
        });
        self
    }

    /// How many schedules the set holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the set holds no schedule.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Declares every schedule of the set for `schedules`' owner, in one transaction on
    /// `client`; returns them as stored, in the set's order.
    ///
    /// # Errors
    /// The first refusal ([`Schedules::put`]'s: `schedule_invalid` with its pointer, or the
    /// enqueue's own codes), its pointer prefixed with the schedule's position (`/2/cron`);
    /// nothing of the set is written then. Database errors, likewise.
    pub async fn declare(
        &self,
        client: &mut tokio_postgres::Client,
        schedules: &Schedules,
    ) -> Result<Vec<ScheduleInfo>, Error> {
        let tx = client.transaction().await?;
        let mut stored = Vec::with_capacity(self.entries.len());
        for (i, e) in self.entries.iter().enumerate() {
            let options = ScheduleOptions {
                time_zone: e.time_zone.as_deref(),
                queue: e.queue.as_deref(),
                priority: e.priority,
                max_attempts: e.max_attempts,
                missed: e.missed,
                overlap: e.overlap,
            };
            let info = schedules
                .write_erased(&tx, &e.name, &e.cron, &e.makes, options, true)
                .await
                .map_err(|error| match error {
                    Error::Rejected(mut refusal) => {
                        refusal.pointer = format!("/{i}{}", refusal.pointer);
                        Error::Rejected(refusal)
                    }
                    other => other,
                })?;
            stored.push(info);
        }
        tx.commit().await?;
        Ok(stored)
    }
}
