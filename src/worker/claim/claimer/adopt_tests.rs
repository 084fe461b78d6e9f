//! Adoption against a real database: what it takes of an owner's running rows and what it
//! leaves.

use super::adopt::{adopt, Orphans};
use super::statement::claim;
use super::tests::{with_jobs, CLAIMANT};
use std::time::{Duration, SystemTime};
use uuid::Uuid;

/// The database's time now.
async fn db_now(client: &tokio_postgres::Client) -> SystemTime {
    client.query_one("SELECT now()", &[]).await.unwrap().get(0)
}

/// Of four claimed jobs, adoption takes only those this incarnation claimed under a claim it
/// neither holds nor gives back, renews their leases, and keeps every claim's fence: a previous
/// incarnation's row (claimed before `since`), a held claim and a claim being given back stay as
/// they were; a second adoption finds nothing more to take than the first.
#[tokio::test]
async fn adoption_takes_only_this_incarnations_unknown_claims_and_keeps_their_fences() {
    let (db, _) = with_jobs(4).await;
    let client = db.client().await;
    let earlier = claim(&client, CLAIMANT, 1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let orphans = Orphans::new(db_now(&client).await);
    let claimed = claim(&client, CLAIMANT, 3).await.unwrap();
    let (held, giving_back, lost) = (&claimed[0], &claimed[1], &claimed[2]);
    orphans.giving_back(giving_back.claim_id());
    client
        .execute(
            "UPDATE etl_job_records SET lease_expires_at = now() + interval '1 second'",
            &[],
        )
        .await
        .unwrap();
    let lease = Duration::from_secs(30);
    let owner = CLAIMANT.owner_id;
    let adopted = adopt(&client, owner, &orphans, vec![held.claim_id()], lease)
        .await
        .unwrap();
    assert_eq!(adopted.len(), 1, "only the lost claim's row");
    let (job, queue) = &adopted[0];
    assert_eq!(queue, crate::queue::DEFAULT_QUEUE);
    assert_eq!(
        (
            job.id(),
            job.claim_id(),
            job.ctx.fencing_token,
            job.ctx.attempt
        ),
        (lost.id(), lost.claim_id(), lost.ctx.fencing_token, 1),
        "the lost claim's own fence and attempt"
    );
    assert_eq!(job.payload, lost.payload);
    assert!(!job.held_permit, "the default queue has no cap");
    let renewed: Vec<Uuid> = client
        .query(
            "SELECT id FROM etl_job_records WHERE lease_expires_at > now() + interval '20 seconds'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(renewed, vec![lost.id()], "only the adopted lease renewed");
    assert_ne!(earlier[0].id(), lost.id());
    // Given back, the claim is adoption's again; held, the adopted claim is left alone.
    orphans.given_back(giving_back.claim_id());
    let known = vec![held.claim_id(), lost.claim_id()];
    let again = adopt(&client, owner, &orphans, known, lease).await.unwrap();
    let ids: Vec<Uuid> = again.iter().map(|(j, _)| j.id()).collect();
    assert_eq!(ids, vec![giving_back.id()]);
}
