//! The adapter's settings, read from the environment the harness sets (its
//! `CONTRIBUTING_ADAPTERS.md`, "Env in"), each with the harness's default.
//!
//! Invariant: a variable that is set but does not parse is an error naming it, never a silent
//! default; an unset or empty one takes the default.

use std::time::Duration;

/// What one run does (`SCENARIO`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scenario {
    /// Produce and consume until SIGTERM, sampling as it goes (`long_horizon`).
    LongHorizon,
    /// Only count the ledger (lost jobs, duplicate effects) and exit (`accounting`).
    Accounting,
}

/// How the producer decides how many jobs to offer (`PRODUCER_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A fixed rate (`fixed`).
    Fixed,
    /// Keep the due jobs at a target depth (`depth-target`).
    DepthTarget,
}

/// Who paces a fixed-rate producer (`PRODUCER_PACING`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pacing {
    /// The adapter, by the clock (`adapter`).
    Adapter,
    /// The harness, by `ENQUEUE <n>` lines on standard input (`harness`).
    Harness,
}

/// A variable that is set but holds no value the adapter takes.
#[derive(Debug, thiserror::Error)]
#[error("{name} is not valid: {expected}")]
pub(crate) struct SettingError {
    /// The variable.
    name: &'static str,
    /// What it takes.
    expected: &'static str,
}

/// The run's settings.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// The database of this system (`DATABASE_URL`).
    pub(crate) database_url: String,
    /// `SCENARIO`, default `long_horizon`.
    pub(crate) scenario: Scenario,
    /// `PRODUCER_MODE`, default `fixed`.
    pub(crate) mode: Mode,
    /// `PRODUCER_RATE` in jobs per second, default 800.
    pub(crate) rate: f64,
    /// `PRODUCER_BATCH_MAX`, the most jobs per bulk insert, default 128.
    pub(crate) batch_max: usize,
    /// `PRODUCER_BATCH_MS`, the producer's tick, default 25 ms.
    pub(crate) batch_every: Duration,
    /// `PRODUCER_PACING`, default `adapter` (the harness sets `harness`).
    pub(crate) pacing: Pacing,
    /// `TARGET_DEPTH`, default 1000.
    pub(crate) target_depth: i64,
    /// `WORKER_COUNT`, the replica's slots, default 32.
    pub(crate) workers: usize,
    /// `JOB_PAYLOAD_BYTES`, the payload's rough size, default 256.
    pub(crate) payload_bytes: usize,
    /// `JOB_WORK_MS`, each job's synthetic work, default 1 ms.
    pub(crate) work: Duration,
    /// `SAMPLE_EVERY_S`, default 5 s.
    pub(crate) sample_every: Duration,
    /// `BENCH_INSTANCE_ID`, this replica's index, default 0.
    pub(crate) instance: u32,
    /// Whether this replica produces: all do, unless `PRODUCER_ONLY_INSTANCE_ZERO=1` and this
    /// is not replica 0.
    pub(crate) produces: bool,
}

impl Settings {
    /// The settings `var` gives (a lookup such as `std::env::var(..).ok()`).
    ///
    /// # Errors
    /// The first variable that is set to a value it does not take.
    pub(crate) fn from_lookup(
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, SettingError> {
        let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let number = |name: &'static str, default: u64| -> Result<u64, SettingError> {
            get(name).map_or(Ok(default), |v| {
                v.trim().parse().map_err(|_| SettingError {
                    name,
                    expected: "a whole number",
                })
            })
        };
        let database_url = get("DATABASE_URL").ok_or(SettingError {
            name: "DATABASE_URL",
            expected: "a postgres:// URL must be set",
        })?;
        let scenario = choice(
            get("SCENARIO"),
            "SCENARIO",
            &[
                ("long_horizon", Scenario::LongHorizon),
                ("accounting", Scenario::Accounting),
            ],
            "long_horizon or accounting",
        )?;
        let mode = choice(
            get("PRODUCER_MODE"),
            "PRODUCER_MODE",
            &[("fixed", Mode::Fixed), ("depth-target", Mode::DepthTarget)],
            "fixed or depth-target",
        )?;
        let pacing = choice(
            get("PRODUCER_PACING"),
            "PRODUCER_PACING",
            &[("adapter", Pacing::Adapter), ("harness", Pacing::Harness)],
            "adapter or harness",
        )?;
        let rate = get("PRODUCER_RATE").map_or(Ok(800.0), |v| {
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|r| r.is_finite() && *r >= 0.0)
                .ok_or(SettingError {
                    name: "PRODUCER_RATE",
                    expected: "a rate of jobs per second, 0 or more",
                })
        })?;
        let positive = |name: &'static str, default: u64| -> Result<u64, SettingError> {
            match number(name, default)? {
                0 => Err(SettingError {
                    name,
                    expected: "a whole number above 0",
                }),
                n => Ok(n),
            }
        };
        let as_usize = |n: u64, name: &'static str| {
            usize::try_from(n).map_err(|_| SettingError {
                name,
                expected: "a smaller number",
            })
        };
        let instance =
            u32::try_from(number("BENCH_INSTANCE_ID", 0)?).map_err(|_| SettingError {
                name: "BENCH_INSTANCE_ID",
                expected: "a replica index below 2^32",
            })?;
        Ok(Settings {
            database_url,
            scenario,
            mode,
            rate,
            batch_max: as_usize(positive("PRODUCER_BATCH_MAX", 128)?, "PRODUCER_BATCH_MAX")?,
            batch_every: Duration::from_millis(positive("PRODUCER_BATCH_MS", 25)?),
            pacing,
            target_depth: i64::try_from(number("TARGET_DEPTH", 1000)?).map_err(|_| {
                SettingError {
                    name: "TARGET_DEPTH",
                    expected: "a smaller number",
                }
            })?,
            workers: as_usize(positive("WORKER_COUNT", 32)?, "WORKER_COUNT")?,
            payload_bytes: as_usize(number("JOB_PAYLOAD_BYTES", 256)?, "JOB_PAYLOAD_BYTES")?,
            work: Duration::from_millis(number("JOB_WORK_MS", 1)?),
            sample_every: Duration::from_secs(positive("SAMPLE_EVERY_S", 5)?),
            instance,
            produces: instance == 0 || number("PRODUCER_ONLY_INSTANCE_ZERO", 0)? == 0,
        })
    }
}

/// The choice `value` of variable `name` names among `options` (the first is the default, taken
/// when it is unset).
///
/// # Errors
/// A value that names no option, as a [`SettingError`] that says what is `expected`.
fn choice<T: Copy>(
    value: Option<String>,
    name: &'static str,
    options: &[(&str, T)],
    expected: &'static str,
) -> Result<T, SettingError> {
    let wanted = value.as_deref().map(str::trim);
    options
        .iter()
        .find(|(option, _)| wanted.is_none_or(|w| w == *option))
        .map(|(_, choice)| *choice)
        .ok_or(SettingError { name, expected })
}
