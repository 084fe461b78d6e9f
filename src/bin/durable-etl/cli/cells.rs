//! `durable-etl cells`: the directory of cells at `--database-url` (see
//! `durable_etl::directory`): build it, list cells and their servers, open or close a cell to
//! new owners, tell (placing it first if new) an owner's cell, and move an owner to another
//! cell.

use clap::{Args, Subcommand};
use durable_etl::config::DatabaseConfig;
use durable_etl::directory::{self, moving};
use durable_etl::error::Error;

/// The `cells` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum CellsCommand {
    /// Build the directory in the database if it does not exist.
    Init,
    /// List a cell: its name (its schema) and its server (by default the directory's own).
    Add(AddArgs),
    /// Print every cell: its server, whether it takes new owners, and how many owners it holds.
    List,
    /// Place new owners in the cell again.
    Open {
        /// The cell.
        name: String,
    },
    /// Place no new owner in the cell; its owners stay.
    Close {
        /// The cell.
        name: String,
    },
    /// Print an owner's cell, placing the owner first if it has none.
    Place(super::OwnerArgs),
    /// Move an owner, with all its jobs and rows, to another cell while its jobs run; run it
    /// again to carry on a move that stopped.
    MoveOwner(MoveArgs),
}

/// Options of `cells move-owner`.
#[derive(Debug, Args)]
pub(crate) struct MoveArgs {
    /// The owner.
    #[command(flatten)]
    pub(crate) whose: super::OwnerArgs,
    /// The cell the owner goes to.
    #[arg(long)]
    pub(crate) to: String,
}

/// Options of `cells add`.
#[derive(Debug, Args)]
pub(crate) struct AddArgs {
    /// The cell's name: its schema (1 to 40 characters of a-z 0-9 _).
    pub(crate) name: String,
    /// The host of the cell's server; with --port. Processes connect there with the database,
    /// role and password of their own --database-url.
    #[arg(long, requires = "port")]
    pub(crate) host: Option<String>,
    /// The port of the cell's server; with --host.
    #[arg(long, requires = "host")]
    pub(crate) port: Option<u16>,
}

/// Runs one `cells` subcommand on `client` (a session of the directory's database, whose
/// connection settings are `base`), printing what it did.
///
/// # Errors
/// As the `directory` calls; [`durable_etl::config::ConfigError::Secret`] for a short secret.
pub(crate) async fn run(
    client: &tokio_postgres::Client,
    base: &DatabaseConfig,
    command: CellsCommand,
) -> Result<(), Error> {
    match command {
        CellsCommand::Init => {
            directory::init(client).await?;
            println!("the directory of cells is ready");
        }
        CellsCommand::Add(args) => {
            let server = args.host.as_deref().zip(args.port);
            directory::add(client, &args.name, server).await?;
            println!("added {}", args.name);
        }
        CellsCommand::List => {
            println!("{:<40}  {:<30}  {:<6}  owners", "cell", "server", "open");
            for cell in directory::cells(client).await? {
                let server = cell.server.map_or_else(
                    || "(the directory's)".to_owned(),
                    |(h, p)| format!("{h}:{p}"),
                );
                let open = if cell.open { "yes" } else { "no" };
                println!(
                    "{:<40}  {server:<30}  {open:<6}  {}",
                    cell.name, cell.owners
                );
            }
        }
        CellsCommand::Open { name } => {
            directory::set_open(client, &name, true).await?;
            println!("opened {name} to new owners");
        }
        CellsCommand::Close { name } => {
            directory::set_open(client, &name, false).await?;
            println!("closed {name} to new owners");
        }
        CellsCommand::Place(args) => {
            let owner_key = args.jobs()?.owner_key();
            println!("{}", directory::place(client, &owner_key).await?);
        }
        CellsCommand::MoveOwner(args) => {
            let owner_key = args.whose.jobs()?.owner_key();
            let moved = moving::move_owner(client, base, &owner_key, &args.to, &mut told).await?;
            if !moved {
                println!("the owner is in {} already", args.to);
            }
        }
    }
    Ok(())
}

/// Prints what a move did.
fn told(progress: moving::Progress) {
    match progress {
        moving::Progress::Fenced => println!("fenced: the old cell takes no new job of the owner"),
        moving::Progress::Draining { moved, running } => {
            println!("draining: {moved} pending jobs taken out, {running} still running");
        }
        moving::Progress::Copied { jobs, rows } => {
            println!("copied: {rows} rows, {jobs} of them live jobs");
        }
        moving::Progress::Switched => println!("switched: the directory names the new cell"),
        moving::Progress::Done => println!("moved"),
    }
}
