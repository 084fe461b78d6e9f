//! Log output: human-readable by default, JSON for production, filtered by `RUST_LOG`.
//!
//! Invariants this module keeps:
//! - Logs go to standard error; standard output is left to command results. Human-format lines
//!   are coloured only when standard error is a terminal (and `NO_COLOR` is unset).
//! - Only the fields call sites pass are logged; call sites pass only safe fields (ids, states,
//!   codes, counts, durations), never payloads, principals, keys, SQL or database error text.
//! - Libraries whose logs can carry SQL, bound parameters, headers or server messages
//!   (tokio-postgres, hyper, …) are silenced whatever `RUST_LOG` says.
//! - A panic is reported by location only: its message (which may quote data) is never printed.

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// The shape of log lines (a `--log-format` value when the binary's `cli` feature is on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum LogFormat {
    /// Human-readable lines.
    Human,
    /// One JSON object per line.
    Json,
}

/// The default filter when `RUST_LOG` is unset.
const DEFAULT_FILTER: &str = "info";

/// Targets silenced whatever the filter says: their logs may carry SQL text, bound parameters
/// (payloads), HTTP headers (API keys) or PostgreSQL messages (which quote data).
pub const SILENCED_TARGETS: &[&str] = &[
    "tokio_postgres",
    "postgres_protocol",
    "bb8",
    "hyper",
    "hyper_util",
    "h2",
    "reqwest",
    "axum::rejection",
    "tower_http",
];

/// The filter for `spec` (a `RUST_LOG` value), with [`SILENCED_TARGETS`] off.
pub fn filter(spec: Option<&str>) -> EnvFilter {
    let mut filter = spec
        .and_then(|s| EnvFilter::try_new(s).ok())
        .unwrap_or_else(|| EnvFilter::new(DEFAULT_FILTER));
    for target in SILENCED_TARGETS {
        if let Ok(directive) = format!("{target}=off").parse() {
            filter = filter.add_directive(directive);
        }
    }
    filter
}

/// Installs the global subscriber (a second call does nothing) and the panic hook.
pub fn init(format: LogFormat) {
    let spec = std::env::var("RUST_LOG").ok();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter(spec.as_deref()))
        .with_ansi(colour(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR").as_deref(),
        ))
        .with_writer(std::io::stderr);
    // try_init fails only when a subscriber is already installed, which is fine to keep.
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    install_panic_hook();
}

/// Whether human-format lines carry ANSI colour: only on a terminal, and not when `NO_COLOR` is
/// set to a non-empty value (<https://no-color.org>). Files and pipes get plain text.
fn colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Replaces the panic hook with one that logs where a panic happened, never its message.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let location = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        tracing::error!(%location, "a task panicked");
    }));
}

#[cfg(test)]
mod tests {
    use super::colour;
    use std::ffi::OsStr;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some(OsStr::new(""))));
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None));
    }
}
