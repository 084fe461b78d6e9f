//! The claim without permits, and a claim session's choice between the two claims: a capped
//! queue is refused by the cheaper claim itself and claimed with permits, at once and from then
//! on.

use super::capped::CappedQueues;
use super::rows::Claim;
use super::statement::{claim_uncapped, CLAIM_SQL, CLAIM_UNCAPPED_SQL};
use super::tests::{enqueue_into, plans_built, session, with_jobs, CLAIMANT};
use crate::queue;
use crate::test_db::TestDb;
use crate::worker::stats::WorkerStats;

/// `(queue permits held, key permits held)` in the database `client` is on.
async fn permits_held(client: &tokio_postgres::Client) -> (i64, i64) {
    let row = client
        .query_one(
            "SELECT (SELECT count(*) FROM etl_queue_permits WHERE claim_id IS NOT NULL),
                    (SELECT count(*) FROM etl_key_permits)",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn the_claim_without_permits_refuses_each_capped_ask_and_claims_the_rest() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    for name in ["mail", "reports", "bulk", "held"] {
        enqueue_into(&client, "test", &[(name, 0, None); 3]).await;
    }
    queue::set_cap(&client, "mail", Some(1)).await.unwrap();
    queue::set_key_cap(&client, "bulk", Some(1)).await.unwrap();
    queue::set_paused(&client, "held", true).await.unwrap();
    let asks = [("mail", 3), ("reports", 2), ("bulk", 3), ("held", 3)];
    let Claim {
        jobs,
        capped,
        left_free,
    } = claim_uncapped(&client, CLAIMANT, &asks).await.unwrap();
    assert_eq!(
        capped,
        [0, 2],
        "the capped and the key-capped asks, not the paused one"
    );
    let asked: Vec<usize> = jobs.iter().map(|j| j.asked_of).collect();
    assert_eq!(asked, [1, 1], "the uncapped queue's two");
    assert!(left_free.is_empty(), "it says nothing of permits");
    assert_eq!(permits_held(&client).await, (0, 0), "it took no permit");
}

#[tokio::test]
async fn a_session_claims_a_refused_queue_with_permits_at_once_and_then_directly() {
    let (db, config) = with_jobs(0).await;
    let client = db.client().await;
    enqueue_into(&client, "test", &[("reports", 0, None); 3]).await;
    enqueue_into(&client, "test", &[("mail", 0, None); 5]).await;
    queue::set_cap(&client, "mail", Some(2)).await.unwrap();
    let stats = WorkerStats::default();
    let session = session(&config, &stats).await;
    assert!(session.is_prepared());
    let capped = CappedQueues::default();
    // Each prepared claim's generic plan was used once already, by its plan check.
    let first = session
        .claim(CLAIMANT, &[("reports", 2), ("mail", 5)], &capped)
        .await
        .unwrap();
    assert_eq!(
        first.left_free,
        [(1, Some(false))],
        "mail's ask, by its position in the caller's asks: it took both free permits"
    );
    let mut asked: Vec<usize> = first.jobs.iter().map(|j| j.asked_of).collect();
    asked.sort_unstable();
    assert_eq!(
        asked,
        [0, 0, 1, 1],
        "two of each; mail's jobs name mail's ask"
    );
    assert!(capped.any_of(&[("mail", 1)]), "mail is known capped now");
    assert_eq!(
        permits_held(&client).await,
        (2, 0),
        "the cap, taken with permits"
    );
    let runs = |sql| plans_built(&session, sql);
    assert_eq!(
        (runs(CLAIM_UNCAPPED_SQL).await.0, runs(CLAIM_SQL).await.0),
        (2, 2)
    );
    // From now on a claim that asks of mail goes straight to the claim with permits.
    let second = session
        .claim(CLAIMANT, &[("reports", 5), ("mail", 5)], &capped)
        .await
        .unwrap();
    let asked: Vec<usize> = second.jobs.iter().map(|j| j.asked_of).collect();
    assert_eq!(asked, [0], "the last report; mail is at its cap");
    assert_eq!(
        second.left_free,
        [(1, Some(false))],
        "no free permit to leave"
    );
    assert_eq!(
        (runs(CLAIM_UNCAPPED_SQL).await.0, runs(CLAIM_SQL).await.0),
        (2, 3)
    );
    capped.forget();
    assert!(session
        .claim(CLAIMANT, &[("reports", 5)], &capped)
        .await
        .unwrap()
        .jobs
        .is_empty());
    assert_eq!(
        runs(CLAIM_UNCAPPED_SQL).await.0,
        3,
        "forgotten: the cheaper claim again"
    );
}

#[tokio::test]
async fn a_claim_with_permits_says_whether_it_left_free_permits_of_each_capped_ask() {
    let (db, config) = with_jobs(0).await;
    let client = db.client().await;
    // Two due jobs the claimant runs and one it does not, under a cap of 4.
    enqueue_into(&client, "test", &[("mail", 0, None); 2]).await;
    enqueue_into(&client, "other.kind", &[("mail", 0, None)]).await;
    enqueue_into(&client, "test", &[("bulk", 0, None); 2]).await;
    queue::set_cap(&client, "mail", Some(4)).await.unwrap();
    queue::set_key_cap(&client, "bulk", Some(1)).await.unwrap();
    let stats = WorkerStats::default();
    let session = session(&config, &stats).await;
    let capped = CappedQueues::default();
    capped.learn(["mail", "bulk"]);
    let claim = session
        .claim(
            CLAIMANT,
            &[("reports", 1), ("mail", 3), ("bulk", 2)],
            &capped,
        )
        .await
        .unwrap();
    assert_eq!(
        claim.jobs.len(),
        4,
        "both of mail's and both of bulk's (no keys)"
    );
    assert_eq!(
        claim.left_free,
        [(1, Some(true)), (2, None)],
        "mail: 3 free permits seen, 2 jobs it runs; bulk has a key cap only"
    );
    assert_eq!(permits_held(&client).await, (2, 0));
    // Asked for fewer than the free permits, it leaves none it could have used.
    enqueue_into(&client, "test", &[("mail", 0, None); 3]).await;
    let claim = session
        .claim(CLAIMANT, &[("mail", 1)], &capped)
        .await
        .unwrap();
    assert_eq!(
        (claim.jobs.len(), claim.left_free),
        (1, vec![(0, Some(false))])
    );
}
