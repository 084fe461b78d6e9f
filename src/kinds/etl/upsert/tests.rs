//! The rounds of a set: which statement each job's rows go in.

use super::*;
use serde_json::json;

/// Rows under `keys`, each record `{}`.
fn rows(keys: &[&str]) -> BTreeMap<String, Value> {
    keys.iter().map(|k| ((*k).to_owned(), json!({}))).collect()
}

#[test]
fn a_job_goes_one_round_after_the_last_earlier_job_sharing_a_key_or_its_id() {
    let (a, b, c, d, e) = (
        rows(&["1", "2"]),
        rows(&["3"]),
        rows(&["2", "3"]),
        rows(&["9"]),
        rows(&["1"]),
    );
    let other = rows(&["1"]);
    let (job, same) = (Uuid::new_v4(), Uuid::new_v4());
    let target = |rows, job_id, dataset| Target {
        owner_key: b"o",
        dataset,
        job_id,
        rows,
    };
    let targets = [
        target(&a, Uuid::new_v4(), "d"),
        target(&b, Uuid::new_v4(), "d"),
        // Shares "2" with the first and "3" with the second.
        target(&c, Uuid::new_v4(), "d"),
        target(&d, job, "d"),
        // Shares "1" with the first only: after it, beside the third.
        target(&e, Uuid::new_v4(), "d"),
        // The same key in another dataset is another row.
        target(&other, Uuid::new_v4(), "other"),
        // The same job again (never in a fenced batch) goes after it all the same.
        target(&d, job, "d"),
        target(&b, same, "d"),
    ];
    assert_eq!(rounds(&targets), vec![0, 0, 1, 0, 1, 0, 1, 2]);
    assert!(rounds(&[]).is_empty());
}

#[test]
fn counts_split_written_rows_into_inserted_updated_and_unchanged() {
    assert_eq!(
        Written::of(10, 7, 3),
        Written {
            inserted: 3,
            updated: 4,
            unchanged: 3
        }
    );
}
