//! `JobState` is the list of states of the live table and the outcome table together, and
//! crosses to and from PostgreSQL as text.

use crate::support::{insert_job, TestDb};
use durable_etl::jobs::state::JobState;

/// The quoted literals of CHECK constraint `name` on `table`, sorted.
async fn constraint_literals(
    client: &tokio_postgres::Client,
    table: &str,
    name: &str,
) -> Vec<String> {
    let def: String = client
        .query_one(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint
              WHERE conrelid = $1::text::regclass AND conname = $2",
            &[&table, &name],
        )
        .await
        .unwrap()
        .get(0);
    let mut literals: Vec<String> = def
        .split('\'')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    literals.sort_unstable();
    literals
}

/// The names of `states`, sorted.
fn names(states: impl Iterator<Item = JobState>) -> Vec<String> {
    let mut names: Vec<String> = states.map(|s| s.as_str().to_owned()).collect();
    names.sort_unstable();
    names
}

/// The live table's states are the states that are not terminal, the outcome table's the
/// terminal ones, and an outcome always has its `finished_at`.
#[tokio::test]
async fn job_states_are_exactly_the_live_and_outcome_status_checks_and_the_terminal_ones_set_finished_at(
) {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let live =
        constraint_literals(&client, "etl_job_records", "etl_job_records_status_check").await;
    let ended =
        constraint_literals(&client, "etl_job_outcomes", "etl_job_outcomes_status_check").await;
    assert_eq!(
        live,
        names(JobState::ALL.into_iter().filter(|s| !s.is_terminal()))
    );
    assert_eq!(
        ended,
        names(JobState::ALL.into_iter().filter(|s| s.is_terminal()))
    );
    let finished_nullable: String = client
        .query_one(
            "SELECT is_nullable::text FROM information_schema.columns
              WHERE table_name = 'etl_job_outcomes' AND column_name = 'finished_at'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(finished_nullable, "NO");
}

#[tokio::test]
async fn job_states_cross_to_and_from_postgres_as_text_and_a_stranger_is_refused() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    for state in JobState::ALL {
        let row = client
            .query_one("SELECT $1::text, $1::varchar", &[&state])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), state.as_str());
        assert_eq!(row.get::<_, JobState>(1), state);
    }
    let id = insert_job(&client, "now()").await;
    let stored = client
        .query_one("SELECT status FROM etl_jobs WHERE id = $1", &[&id])
        .await
        .unwrap();
    assert_eq!(stored.get::<_, JobState>(0), JobState::Pending);
    let stranger = client
        .query_one("SELECT 'paused'::text", &[])
        .await
        .unwrap();
    assert!(stranger.try_get::<_, JobState>(0).is_err());
    let not_text = client.query_one("SELECT 1::int4", &[]).await.unwrap();
    assert!(not_text.try_get::<_, JobState>(0).is_err());
}
