//! `durable-etl queues`: what an operator sets per queue (a pause, a cap, a key cap), from the
//! command line.

use clap::Subcommand;
use durable_etl::config::ConfigError;
use durable_etl::error::Error;
use durable_etl::queue::{self, QueuesError};
use tokio_postgres::GenericClient;

/// The `queues` subcommands, each naming one queue.
#[derive(Debug, Subcommand)]
pub(crate) enum QueuesCommand {
    /// Stop claiming the queue's jobs; running jobs finish, enqueues are still accepted.
    Pause {
        /// The queue.
        queue: String,
    },
    /// Claim the queue's jobs again.
    Resume {
        /// The queue.
        queue: String,
    },
    /// Cap the queue's running jobs across all replicas (1 to 10000), or `none` to uncap it.
    Cap {
        /// The queue.
        queue: String,
        /// The cap (1 to 10000), or `none`.
        cap: String,
    },
    /// Cap the queue's running jobs of any one concurrency key across all replicas (1 to 10000),
    /// or `none` to lift the key cap.
    KeyCap {
        /// The queue.
        queue: String,
        /// The key cap (1 to 10000), or `none`.
        cap: String,
    },
}

/// The cap `s` says: a number, or `none` for no cap.
///
/// # Errors
/// [`Error::Config`] when it is neither.
fn parse_cap(s: &str) -> Result<Option<i32>, Error> {
    if s == "none" {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|_| Error::Config(ConfigError::Queues(QueuesError::Cap)))
}

/// Runs one `queues` subcommand on `client`, printing what it did.
///
/// # Errors
/// As [`queue::set_paused`], [`queue::set_cap`] and [`queue::set_key_cap`].
pub(crate) async fn run(client: &impl GenericClient, command: QueuesCommand) -> Result<(), Error> {
    match command {
        QueuesCommand::Pause { queue } => {
            queue::set_paused(client, &queue, true).await?;
            println!("paused {queue}");
        }
        QueuesCommand::Resume { queue } => {
            queue::set_paused(client, &queue, false).await?;
            println!("resumed {queue}");
        }
        QueuesCommand::Cap { queue, cap } => {
            let cap = parse_cap(&cap)?;
            queue::set_cap(client, &queue, cap).await?;
            match cap {
                Some(cap) => println!("capped {queue} at {cap}"),
                None => println!("uncapped {queue}"),
            }
        }
        QueuesCommand::KeyCap { queue, cap } => {
            let cap = parse_cap(&cap)?;
            queue::set_key_cap(client, &queue, cap).await?;
            match cap {
                Some(cap) => println!("capped each key of {queue} at {cap}"),
                None => println!("lifted the key cap of {queue}"),
            }
        }
    }
    Ok(())
}
