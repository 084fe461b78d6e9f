//! What the checked examples share: a fresh database of their own, and their checks.

use durable_etl::{db, DatabaseConfig};
use std::process::ExitCode;

/// Records one check: prints it, and remembers a failure.
pub(crate) fn check(failures: &mut Vec<String>, what: &str, holds: bool) {
    println!("{} {what}", if holds { "ok  " } else { "FAIL" });
    if !holds {
        failures.push(what.to_owned());
    }
}

/// Creates a database of the example's own on the server of `DATABASE_URL` (default: the local
/// server), runs `run` on it, drops it, and exits 0 only if `run` ended with no failed check.
pub(crate) async fn on_fresh_database<F, Fut, E>(run: F) -> ExitCode
where
    F: FnOnce(DatabaseConfig) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<String>, E>>,
    E: std::fmt::Display + From<durable_etl::Error>,
{
    let base = DatabaseConfig::new(
        std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned()),
    );
    let name = format!(
        "durable_etl_example_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let outcome = match db::recreate_database(&base, &name, "example", "example").await {
        Ok(created) => {
            println!("example database: {name} (dropped at the end)");
            drop(created.session);
            let outcome = run(created.config).await;
            if db::drop_created(&base, &name, created.oid).await.is_err() {
                eprintln!("could not drop {name}");
            }
            outcome
        }
        Err(e) => Err(E::from(e)),
    };
    match outcome {
        Ok(failures) if failures.is_empty() => {
            println!("every check holds");
            ExitCode::SUCCESS
        }
        Ok(failures) => {
            let n = failures.len();
            eprintln!("{n} check(s) failed: {}", failures.join("; "));
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("the example stopped: {e}");
            ExitCode::FAILURE
        }
    }
}
