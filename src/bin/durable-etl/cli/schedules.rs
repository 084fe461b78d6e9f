//! `durable-etl schedules`: one owner's recurring schedules of ETL loads, created or changed
//! (from the body the HTTP API's `PUT` takes), listed, paused, resumed or deleted from the
//! command line.

use clap::{Args, Subcommand};
use durable_etl::codes::Code;
use durable_etl::error::Error;
use durable_etl::intake::Rejection;
use durable_etl::schedule::{Missed, ScheduleInfo};
use tokio_postgres::GenericClient;

/// Options of `schedules`: whose schedules, and what to do with them.
#[derive(Debug, Args)]
pub(crate) struct SchedulesArgs {
    /// The owner whose schedules these are, and the secret.
    #[command(flatten)]
    pub(crate) whose: super::OwnerArgs,
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: SchedulesCommand,
}

/// The `schedules` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum SchedulesCommand {
    /// List the owner's schedules: name, expression, zone, policy, next fire, paused.
    List,
    /// Create or change a schedule of ETL loads from a JSON body, as `PUT /v1/schedules/{name}`
    /// takes it (cron, time_zone, request, missed, catch_up_limit, overlap, max_attempts).
    Put {
        /// The schedule (as a kind's name: a-z 0-9 _ .).
        name: String,
        /// The file holding the JSON body; `-` reads standard input.
        #[arg(long)]
        body: std::path::PathBuf,
    },
    /// Pause a schedule: it makes no job until resumed.
    Pause {
        /// The schedule.
        name: String,
    },
    /// Resume a schedule: its next fire is the first after now.
    Resume {
        /// The schedule.
        name: String,
    },
    /// Delete a schedule (the jobs it made stay).
    Delete {
        /// The schedule.
        name: String,
    },
}

/// Runs one `schedules` subcommand on `client`, printing what it did.
///
/// # Errors
/// [`Error::Config`] for a short secret; `not_found` for a schedule the owner does not have;
/// database errors.
pub(crate) async fn run(client: &impl GenericClient, args: SchedulesArgs) -> Result<(), Error> {
    let schedules = args.whose.jobs()?.schedules();
    let not_found = || Error::from(Rejection::new(Code::NotFound, "/name"));
    match args.command {
        SchedulesCommand::List => {
            for s in schedules.list(client).await? {
                println!("{}", line(&s));
            }
        }
        SchedulesCommand::Put { name, body } => {
            let text = if body.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())
            } else {
                std::fs::read_to_string(&body)
            };
            let malformed = || Error::from(Rejection::new(Code::RequestMalformed, ""));
            let value =
                serde_json::from_str(&text.map_err(|_| malformed())?).map_err(|_| malformed())?;
            let stored = durable_etl::service::schedules::put_body(
                client,
                &schedules,
                &name,
                value,
                durable_etl::intake::IntakeLimits::default(),
            )
            .await?;
            println!("{}", line(&stored));
        }
        SchedulesCommand::Pause { name } => {
            if !schedules.pause(client, &name).await? {
                return Err(not_found());
            }
            println!("paused {name}");
        }
        SchedulesCommand::Resume { name } => {
            if !schedules.resume(client, &name).await? {
                return Err(not_found());
            }
            println!("resumed {name}");
        }
        SchedulesCommand::Delete { name } => {
            if !schedules.delete(client, &name).await? {
                return Err(not_found());
            }
            println!("deleted {name}");
        }
    }
    Ok(())
}

/// A schedule as `list` and `put` print it: name, expression, zone, missed-fire policy, next
/// fire and state, tab-separated.
fn line(s: &ScheduleInfo) -> String {
    let missed = match s.missed {
        Missed::Coalesce => "coalesce".to_owned(),
        Missed::CatchUp(n) => format!("catch_up({n})"),
        Missed::Skip => "skip".to_owned(),
    };
    format!(
        "{}\t{}\t{}\tmissed={missed}\tnext={}\t{}",
        s.name,
        s.cron,
        s.time_zone,
        s.next_fire_at.to_rfc3339(),
        if s.paused { "paused" } else { "active" },
    )
}
