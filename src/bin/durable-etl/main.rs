//! The `durable-etl` binary: parses the command line, installs logging, runs the command and maps
//! its outcome to an exit code (0 success, 1 any other failure, 2 usage or configuration (a
//! database that refuses the configured role or database included), 3 database unreachable, 4
//! schema incompatible, 5 local I/O failure (a listen address in use included), 6 internal
//! error).

mod bench;
mod cli;
mod demo;

use clap::Parser;
use cli::Cli;
use durable_etl::error::EXIT_FAILURE;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Reads FAILPOINTS from the environment; the scenario lives as long as the process.
    #[cfg(feature = "failpoints")]
    let _crash_points = fail::FailScenario::setup();
    durable_etl::telemetry::init(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(_) => {
            eprintln!("durable-etl: could not start the async runtime");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(code = %e.code(), "command failed");
            eprintln!("durable-etl: {e} [{}]", e.code());
            ExitCode::from(e.exit_code())
        }
    }
}
