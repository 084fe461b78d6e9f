//! Log output: human-readable by default, JSON for production, filtered by `RUST_LOG`.
//!
//! Invariants this module keeps:
//! - Logs go to standard error; standard output is left to command results.
//! - Only the fields call sites pass are logged; call sites pass only safe fields (ids, states,
//!   codes, durations), never payloads, principals, keys, SQL or database error text.

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

/// The shape of log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Human,
    /// One JSON object per line.
    Json,
}

/// The default filter when `RUST_LOG` is unset.
const DEFAULT_FILTER: &str = "info";

/// Installs the global subscriber. A second call does nothing.
pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // try_init fails only when a subscriber is already installed, which is fine to keep.
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
