//! `JobState` is the table's list of states, and crosses to and from PostgreSQL as text.

use crate::support::{insert_job, TestDb};
use durable_etl::state::JobState;

/// The quoted literals of CHECK constraint `name` on `etl_job_records`, sorted.
async fn constraint_literals(client: &tokio_postgres::Client, name: &str) -> Vec<String> {
    let def: String = client
        .query_one(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint
              WHERE conrelid = 'etl_job_records'::regclass AND conname = $1",
            &[&name],
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

#[tokio::test]
async fn job_states_are_exactly_the_status_check_and_the_terminal_ones_set_finished_at() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    assert_eq!(
        constraint_literals(&client, "etl_job_records_status_check").await,
        names(JobState::ALL.into_iter())
    );
    assert_eq!(
        constraint_literals(&client, "etl_job_records_finished_iff_terminal").await,
        names(JobState::ALL.into_iter().filter(|s| s.is_terminal()))
    );
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
        .query_one("SELECT status FROM etl_job_records WHERE id = $1", &[&id])
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
