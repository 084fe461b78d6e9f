//! The command-line contract: flags, environment variables and what each command does.
//!
//! Invariants this module keeps:
//! - Every flag can also be set by an environment variable `DURABLE_ETL_<FLAG>`; the database URL
//!   by `DATABASE_URL` and the digest secret by `DURABLE_ETL_SECRET`. Secret values are never shown
//!   by `--help`.
//! - Durations read like `500ms`, `2s`, `1m`.
//! - `serve` and `work` check schema compatibility, and that the server applies the session
//!   limits, before they touch any job.
//! - Start-up is bounded by `--startup-timeout`: lost connections are retried with backoff within
//!   it, and every start-up step has a deadline, so a blackholed server cannot hang a start.
//! - Unset worker timings are derived from `--lease` (heartbeat interval, idle-in-transaction
//!   timeout); explicitly set ones are validated as given.
//! - Start-up fails at once on what retrying cannot fix (a refused role, password or database),
//!   and every start-up failure names the target (address, database, role; never the password).
//!   No command creates a missing database but `migrate --create-database`, as asked.
//! - Exit codes: 0 success, 2 usage or configuration error (a refused role, password or database
//!   included), 3 database unreachable, 4 schema incompatible, 5 a local resource such as a
//!   listen address failed (see `error`).

mod api_keys;
mod args;
mod bench_args;
mod cells;
mod queues;
mod schedules;

pub(crate) use args::*;
use durable_etl::config::{DatabaseConfig, WorkerConfig};
use durable_etl::error::Error;
use durable_etl::worker::stats::WorkerStats;
use durable_etl::{config, db, schema};

/// Runs the parsed command.
///
/// # Errors
/// Any [`Error`]; its `exit_code()` is the process exit code.
pub(crate) async fn run(cli: Cli) -> Result<(), Error> {
    // Installed first: a signal during start-up is a graceful request, not a kill.
    let shutdown = durable_etl::shutdown::signals();
    let mut start_up = cli.database.start_up(&shutdown)?;
    let directory = cli.database.directory;
    let db_config = match &cli.command {
        Command::Cells(_) if directory || cli.database.cell.is_some() => {
            return Err(config::ConfigError::DirectoryCell.into());
        }
        Command::Demo(_) | Command::Bench(_) if directory => {
            return Err(config::ConfigError::DirectoryCell.into());
        }
        Command::Work(args) => {
            // The replica's own flags are refused before anything connects.
            args.config()?;
            args.cells(cli.database.cell.is_some())?;
            cli.database.config_for_lease(Some(args.lease))?
        }
        _ => cli.database.config()?,
    };
    // Without a cell, the API and its keys are routed: each owner's in its cell.
    let routed = directory
        && cli.database.cell.is_none()
        && matches!(cli.command, Command::Serve(_) | Command::ApiKeys(_));
    // `work --cells` finds each cell's server itself.
    let per_cell = matches!(&cli.command, Command::Work(args) if !args.cells.is_empty());
    let db_config = if directory && !routed && !per_cell {
        let found = start_up
            .run(|| durable_etl::directory::cell_config(&db_config))
            .await?;
        // From here on, start-up failures name the cell's server.
        start_up.target = db::target(&found)?;
        found
    } else {
        db_config
    };
    match cli.command {
        Command::Migrate(args) => migrate(&db_config, &start_up, args).await,
        Command::Cells(command) => {
            let client = start_up.run(|| db::connect(&db_config, "admin")).await?;
            cells::run(&client, &db_config, command).await
        }
        Command::Demo(args) => {
            let serve = args.serve.then_some(shutdown);
            let secret = args.secret.as_deref();
            crate::demo::run(&db_config, &args.demo_database, secret, serve).await
        }
        Command::Bench(command) => {
            let (configs, output) = command.configs().unwrap_or_else(|e| e.exit());
            // A signal drops the bench: its replicas are killed with it (`kill_on_drop`), and
            // the next run recreates its database.
            let mut stop = shutdown.clone();
            tokio::select! {
                done = bench(&db_config, configs, &output) => done,
                () = stop.reached(durable_etl::shutdown::Stage::Draining) => {
                    Err(Error::Interrupted)
                }
            }
        }
        Command::Serve(args) if routed => {
            let (api_config, secret) = args.config()?;
            let directory = start_up
                .run(|| async {
                    let pool = db::connect_pool(&db_config, "api").await?;
                    let conn = db::checkout(&pool).await?;
                    durable_etl::directory::check(&*conn).await?;
                    drop(conn);
                    Ok(pool)
                })
                .await;
            let pool = directory?;
            tracing::info!("api starting, routing each owner to its cell");
            let state = durable_etl::AppState::routed(pool, db_config, secret, api_config);
            durable_etl::service::serve(state, shutdown).await
        }
        Command::Serve(args) => {
            let (api_config, secret) = args.config()?;
            let db_config = on_cell_node(&db_config, &start_up).await?;
            let (pool, version) = start_up
                .run(|| schema::open_checked(&db_config, "api"))
                .await?;
            tracing::info!(
                schema_version = version,
                pooler = db_config.pooler.as_str(),
                connections_max = durable_etl::worker::budget::Budget::api(&db_config).total(),
                "api starting"
            );
            let notifier = durable_etl::jobs::notifier::Notifier::start(&db_config)?;
            let state =
                durable_etl::AppState::new(pool, secret, api_config).with_notifier(notifier);
            durable_etl::service::serve(state, shutdown).await
        }
        Command::Work(args) => {
            let worker_config = args.config()?;
            let declared = args.schedules_file()?;
            let mut cells = Vec::new();
            for name in &args.cells {
                let named = DatabaseConfig {
                    cell: Some(name.clone()),
                    ..db_config.clone()
                };
                let named = if directory {
                    let found = || durable_etl::directory::cell_config(&named);
                    start_up.run(found).await?
                } else {
                    named
                };
                cells.push((Some(name.clone()), on_cell_node(&named, &start_up).await?));
            }
            if cells.is_empty() {
                cells.push((None, on_cell_node(&db_config, &start_up).await?));
            }
            let starts = args.record_handler_starts;
            let run = Run {
                worker_config,
                declared,
                starts_file: starts,
            };
            work(cells, &start_up, run, shutdown).await
        }
        Command::Queues(command) => {
            let pool = open_admin(&db_config, &start_up).await?;
            let conn = db::checkout(&pool).await?;
            queues::run(&*conn, command).await
        }
        Command::Schedules(args) => {
            let pool = open_admin(&db_config, &start_up).await?;
            let conn = db::checkout(&pool).await?;
            schedules::run(&*conn, args).await
        }
        Command::ApiKeys(command) if routed => {
            api_keys::run_routed(&db_config, &start_up, command).await
        }
        Command::ApiKeys(command) => {
            let pool = open_admin(&db_config, &start_up).await?;
            let conn = db::checkout(&pool).await?;
            api_keys::run(&*conn, command).await
        }
    }
}

/// `db_config` pointed at the node that holds its cell, on Citus (`db::citus::find_node`); as it
/// is otherwise. One start-up step.
async fn on_cell_node(
    db_config: &DatabaseConfig,
    start_up: &db::StartUp,
) -> Result<DatabaseConfig, Error> {
    start_up.run(|| db::citus::find_node(db_config)).await
}

/// Opens the pool of a one-shot administrative command on the node that holds its cell and
/// checks the schema. Two start-up steps.
async fn open_admin(db_config: &DatabaseConfig, start_up: &db::StartUp) -> Result<db::Pool, Error> {
    let db_config = &on_cell_node(db_config, start_up).await?;
    start_up
        .run(|| async {
            let pool = db::connect_pool(db_config, "admin").await?;
            let conn = db::checkout(&pool).await?;
            db::check_cell(&*conn, db_config).await?;
            schema::check_compatible(&conn).await?;
            drop(conn);
            Ok(pool)
        })
        .await
}

/// What `work` runs: the replica's configuration, the schedules it declares at start-up, and
/// where it writes its handler starts (bench only).
struct Run {
    /// The replica's configuration.
    worker_config: WorkerConfig,
    /// The schedules file's text and the secret its owners are digested under, if any.
    declared: Option<(String, durable_etl::Secret)>,
    /// Bench only: where to write the handler starts.
    starts_file: Option<std::path::PathBuf>,
}

/// `work`: starts a replica of each of `cells` (one: the replica of `--cell`, or of none;
/// several: `--cells`, each under its name) within the start-up bounds (each step retried on
/// lost connections), declares the schedules of its file (if any) in one transaction, serves
/// their metrics if asked, and runs them until `shutdown`. A replica of a cell that cannot start
/// stops the start. With `starts_file` (set only by `bench offered-load`), it records its
/// handler starts and writes them there once stopped. A replica whose cell moved to another
/// Citus node ([`Error::CellMoved`]) stops and starts again, within a start-up bound as long as
/// the first, on the node that holds the cell now; the metrics endpoint, bound once, reports the
/// current incarnation. A replica that stops with an error drains the others, and `work` returns
/// the first error.
async fn work(
    cells: Vec<(Option<String>, DatabaseConfig)>,
    start_up: &db::StartUp,
    run: Run,
    shutdown: durable_etl::shutdown::Shutdown,
) -> Result<(), Error> {
    let Run {
        worker_config,
        declared,
        starts_file,
    } = run;
    let starts = starts_file.map(|file| (file, crate::bench::starts::StartLog::default()));
    let metrics = match worker_config.metrics_listen {
        Some(address) => Some(
            tokio::net::TcpListener::bind(address)
                .await
                .map_err(|source| Error::Listen { address, source })?,
        ),
        None => None,
    };
    let incarnation = Incarnation {
        worker_config: &worker_config,
        declared: declared.as_ref(),
        starts: starts.as_ref().map(|(_, log)| log),
        bound: start_up
            .deadline
            .saturating_duration_since(tokio::time::Instant::now()),
    };
    // Each cell's start-up names its own server, and stops at a signal or a sibling's error.
    let (stop, shutdown) = shutdown.child();
    let mut start_ups = Vec::with_capacity(cells.len());
    for (_, db_config) in &cells {
        let target = db::target(db_config)?;
        let shutdown = shutdown.clone();
        start_ups.push(db::StartUp {
            target,
            shutdown,
            ..start_up.clone()
        });
    }
    let first = cells
        .iter()
        .zip(&start_ups)
        .map(|((_, db_config), start_up)| incarnation.start(db_config, start_up));
    let first = futures::future::try_join_all(first).await?;
    // One endpoint for the process: each incarnation's counters replace the last one's, and
    // between two incarnations it answers that none runs.
    let (mut sources, mut replicas) = (Vec::new(), Vec::new());
    let started = cells.into_iter().zip(first).zip(&start_ups);
    for (((cell, db_config), (worker, pool)), start_up) in started {
        let (current, source) = tokio::sync::watch::channel(Some((worker.stats_handle(), pool)));
        sources.push((cell, source));
        let follow = incarnation.follow(worker, current, db_config, start_up, shutdown.clone());
        replicas.push(async {
            let ran = follow.await;
            if ran.is_err() {
                stop.request(durable_etl::shutdown::Stage::Draining);
            }
            ran
        });
    }
    let serving = metrics.map(|listener| serve_metrics(listener, sources, &shutdown));
    let ran = futures::future::join_all(replicas).await;
    if let Some(serving) = serving {
        serving.abort();
        let _ = serving.await;
    }
    let ran = ran
        .into_iter()
        .collect::<Result<Vec<()>, Error>>()
        .map(drop);
    match starts {
        Some((file, log)) => ran.and(log.write(&file).map_err(Error::io)),
        None => ran,
    }
}

/// One start of `work`'s replica, on the node its configuration names.
struct Incarnation<'a> {
    /// The replica's configuration.
    worker_config: &'a WorkerConfig,
    /// The schedules file's text and the secret its owners are digested under, if any.
    declared: Option<&'a (String, durable_etl::Secret)>,
    /// Bench only: the log its handler starts are recorded in.
    starts: Option<&'a crate::bench::starts::StartLog>,
    /// How long a start may take: the first start's bound, given to every later one too.
    bound: std::time::Duration,
}

impl Incarnation<'_> {
    /// Runs `worker` (on `db_config`) until `shutdown`; whenever its cell moves, starts the
    /// replica again on the cell's new node, publishing each incarnation on `current` (none
    /// between two).
    async fn follow(
        &self,
        mut worker: durable_etl::worker::Worker,
        current: tokio::sync::watch::Sender<Option<(std::sync::Arc<WorkerStats>, db::Pool)>>,
        mut db_config: DatabaseConfig,
        start_up: &db::StartUp,
        shutdown: durable_etl::shutdown::Shutdown,
    ) -> Result<(), Error> {
        let mut start_up = start_up.clone();
        loop {
            match worker.run(shutdown.clone()).await {
                Err(Error::CellMoved) => {
                    tracing::warn!(code = %durable_etl::Code::CellMoved, "the cell moved; starting on its new node");
                    current.send_replace(None);
                    start_up.deadline = tokio::time::Instant::now() + self.bound;
                    db_config = on_cell_node(&db_config, &start_up).await?;
                    let (next, pool) = self.start(&db_config, &start_up).await?;
                    current.send_replace(Some((next.stats_handle(), pool)));
                    worker = next;
                }
                ran => return ran,
            }
        }
    }

    /// Opens the replica's pool, declares its schedules and starts it, each a start-up step;
    /// returns it with its pool.
    async fn start(
        &self,
        db_config: &DatabaseConfig,
        start_up: &db::StartUp,
    ) -> Result<(durable_etl::worker::Worker, db::Pool), Error> {
        let (pool, version) = start_up
            .run(|| schema::open_checked(db_config, "worker"))
            .await?;
        tracing::info!(
            schema_version = version,
            owner_id = %self.worker_config.owner_id,
            "worker starting"
        );
        if let Some((text, secret)) = self.declared {
            let count = start_up
                .run(|| async {
                    let mut conn = db::checkout(&pool).await?;
                    durable_etl::service::schedules::declare_file(&mut conn, secret, text).await
                })
                .await?;
            tracing::info!(schedules = count, "schedules declared");
        }
        let worker = start_up
            .run(|| {
                let registry = durable_etl::job::handler::Registry::new()
                    .perform(durable_etl::kinds::etl::load::EtlLoad::default())
                    .register(durable_etl::job::handler::Noop);
                let registry = match self.starts {
                    Some(log) => log.wrap(&registry),
                    None => registry,
                };
                durable_etl::worker::Worker::start(
                    pool.clone(),
                    db_config,
                    self.worker_config.clone(),
                    registry,
                )
            })
            .await?;
        Ok((worker, pool))
    }
}

/// Serves the metrics of the incarnation `source` holds on `listener` until `shutdown` (or until
/// aborted), in a task of its own.
fn serve_metrics(
    listener: tokio::net::TcpListener,
    source: durable_etl::service::metrics::WorkerSources,
    shutdown: &durable_etl::shutdown::Shutdown,
) -> tokio::task::JoinHandle<()> {
    let serving = durable_etl::service::metrics::serve_worker(listener, source, shutdown.clone());
    tokio::spawn(async move {
        if let Err(e) = serving.await {
            tracing::warn!(code = %e.code(), "metrics endpoint stopped");
        }
    })
}

/// `migrate`: applies or reverses migrations, printing the version reached and how many changed
/// (nothing when none did); with `--create-database`, first creates the database if it does not
/// exist (else a missing database is refused, as by every command).
async fn migrate(
    db_config: &DatabaseConfig,
    start_up: &db::StartUp,
    args: MigrateArgs,
) -> Result<(), Error> {
    let latest = schema::latest_version();
    if let Some(target) = args.down_to.filter(|t| !(0..=latest).contains(t)) {
        return Err(config::ConfigError::DownTo(target, latest).into());
    }
    if args.create_database && start_up.run(|| db::ensure_database(db_config)).await? {
        tracing::info!("created the database");
    }
    // Connecting is a start-up step; migrating is not: it may wait for another run's lock.
    let mut client = start_up.run(|| db::connect(db_config, "migrate")).await?;
    let report = match args.down_to {
        Some(target) => {
            schema::enter_cell(&client, db_config).await?;
            if let Some(cell) = &db_config.cell {
                schema::forget_node_views(&client, cell).await?;
            }
            schema::migrate_down_to(&mut client, target).await?
        }
        None => schema::migrate_session(&mut client, db_config).await?,
    };
    // Nothing to do says nothing (at debug only), so a deploy step that migrates on every
    // start stays quiet.
    if report.changed.is_empty() {
        tracing::debug!(version = report.version, "schema already at its version");
    } else {
        println!(
            "schema at version {} ({} migration(s) {})",
            report.version,
            report.changed.len(),
            if args.down_to.is_some() {
                "reversed"
            } else {
                "applied"
            }
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests;

/// Runs the bench once per config, in order (one, or one per rate of a sweep), writing each
/// report as it ends: as text, or as JSON (one object, or an array of them for a sweep), and as
/// an HTML page (`DIR/index.html`, or `DIR/rate-R/index.html` per rate of a sweep and the
/// sweep's own `DIR/index.html` across the rates). A run that missed its asked rate (or depth)
/// also says so on stderr when the figures are JSON.
///
/// # Errors
/// The first run's error, as [`crate::bench::run`]; [`Error::Io`] when a page cannot be written.
async fn bench(
    db_config: &DatabaseConfig,
    configs: Vec<crate::bench::BenchConfig>,
    output: &bench_args::BenchOutput,
) -> Result<(), Error> {
    let sweep = configs.len() > 1;
    let mut reports = Vec::with_capacity(configs.len());
    for config in configs {
        let report = crate::bench::run(db_config, config).await?;
        if let Some(dir) = &output.report {
            let dir = match report.config.mode {
                crate::bench::Mode::OfferedLoad { rate, .. } if sweep => {
                    dir.join(crate::bench::sweep::rate_dir(rate))
                }
                _ => dir.clone(),
            };
            crate::bench::html::write(&dir, &report).map_err(Error::io)?;
        }
        // The JSON says `rate_missed` (or `depth_missed`); a person watching the terminal should
        // see it too.
        if let Some(warning) = report.warning() {
            if output.json {
                eprintln!("{warning}");
            }
        }
        if !output.json {
            if sweep && !reports.is_empty() {
                println!();
            }
            print!("{}", report.to_text());
        }
        reports.push(report);
    }
    if let (Some(dir), true) = (&output.report, sweep) {
        crate::bench::sweep::write(dir, &reports).map_err(Error::io)?;
    }
    if output.json {
        let json = if sweep {
            serde_json::to_string(&reports)
        } else {
            reports
                .first()
                .map_or(Ok(String::new()), serde_json::to_string)
        };
        println!("{}", json.map_err(|_| Error::Internal)?);
    }
    Ok(())
}
