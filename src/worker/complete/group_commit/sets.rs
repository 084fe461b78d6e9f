//! The jobs of a batch whose effects apply together: fenced jobs whose effects offer an
//! `EffectsSet` (`Effects::set`), grouped by their effects' type, each group applied by its set
//! in set-based statements under one savepoint (`Fenced → Applied`), before the batch's other
//! jobs apply one by one.
//!
//! Invariants this module keeps:
//! - Only a group of at least two fenced jobs applies as a set; a job alone applies as before,
//!   under its own savepoint.
//! - A set applies all its jobs or none: it runs under a savepoint of its own, and when it fails,
//!   panics, overruns its budget (the smallest of its jobs') or returns a ledger count other than
//!   its jobs', that savepoint is rolled back (nothing it wrote stays) and its jobs stay
//!   `Fenced`: each then applies alone, under its own savepoint, so one job's failure fails only
//!   that job. The fence of the batch is untouched: sets apply only to jobs already fenced and
//!   row-locked, inside the batch's transaction.
//! - The subtransaction bound of `MAX_JOBS_PER_TRANSACTION` holds: a set that applied holds one
//!   subtransaction for two or more jobs, and one rolled back holds none (PostgreSQL drops an
//!   aborted subtransaction's ids from the cache, and the savepoint is released after its
//!   `ROLLBACK TO`, so the jobs' own savepoints that follow do not nest inside it), so a
//!   transaction of `n` jobs never holds more than `n`.
//! - Handler code never unwinds into the lane: `Effects::set` is called under `catch_unwind` (a
//!   panic there applies the job alone), and the set's `apply` runs guarded.

use super::effects::{apply_set, roll_back};
use super::step::{OwnedEffects, Step};
use crate::job::handler::{Effects, EffectsSet};
use crate::worker::stats::WorkerStats;
use std::any::TypeId;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;
use tokio_postgres::{CancelToken, Transaction};

/// The savepoint a set's effects apply under.
const SET_SAVEPOINT: &str = "job_set_effects";

/// The fenced jobs of a batch whose effects are of one type with a set: the set and the jobs'
/// places in the batch, in batch order.
struct Group {
    /// The type of their effects.
    of: TypeId,
    /// How they apply together.
    set: &'static dyn EffectsSet,
    /// Their places in the batch.
    jobs: Vec<usize>,
    /// The smallest of their budgets: the set's.
    budget: Duration,
}

/// The effects of `step` and their budget, if it is fenced and they have them.
fn fenced(step: &Step) -> Option<(&(dyn Effects + 'static), Duration)> {
    match step {
        Step::Fenced(ready) => ready.effects.get().map(|e| (e, ready.budget)),
        _ => None,
    }
}

/// The groups of `steps`' fenced jobs whose effects have a set, in order of first appearance;
/// only those of at least two jobs.
fn groups(steps: &[Step]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for (index, step) in steps.iter().enumerate() {
        let Some((effects, budget)) = fenced(step) else {
            continue;
        };
        // Handler code: a panic here applies the job alone, never ends the lane.
        let Ok(Some(set)) = catch_unwind(AssertUnwindSafe(|| effects.set())) else {
            continue;
        };
        let of = effects.effects_type();
        match groups.iter_mut().find(|g| g.of == of) {
            Some(group) => {
                group.jobs.push(index);
                group.budget = group.budget.min(budget);
            }
            None => groups.push(Group {
                of,
                set,
                jobs: vec![index],
                budget,
            }),
        }
    }
    groups.retain(|g| g.jobs.len() > 1);
    groups
}

/// Applies each group of `steps`' fenced jobs whose effects have a set, under a savepoint of its
/// own on `tx` (`cancel`: its connection's token): its jobs become `Applied` with their ledgers,
/// or, if the set fails, stay `Fenced` to apply one by one.
///
/// # Errors
/// A failure of the savepoint's own statements (the batch's failure).
pub(super) async fn apply_sets(
    tx: &mut Transaction<'_>,
    stats: &WorkerStats,
    steps: &mut [Step],
    cancel: &CancelToken,
) -> Result<(), tokio_postgres::Error> {
    for group in groups(steps) {
        // Taken out of their jobs for the set, and given back whatever it did, so they are
        // dropped (or applied alone) under the jobs' own guard.
        let mut members: Vec<Box<dyn Effects>> = group
            .jobs
            .iter()
            .filter_map(|&i| match &mut steps[i] {
                Step::Fenced(ready) => ready.effects.take(),
                _ => None,
            })
            .collect();
        stats.record_round_trips(3);
        let savepoint = tx.savepoint(SET_SAVEPOINT).await?;
        let applied = apply_set(&savepoint, group.set, &mut members, group.budget, cancel).await;
        for (&i, effects) in group.jobs.iter().zip(members) {
            if let Step::Fenced(ready) = &mut steps[i] {
                ready.effects = OwnedEffects::new(effects);
            }
        }
        match applied {
            Ok(ledgers) if ledgers.len() == group.jobs.len() => {
                savepoint.commit().await?;
                crash_point!("effects.applied");
                for (&i, ledger) in group.jobs.iter().zip(ledgers) {
                    steps[i] = Step::Applied(ledger);
                }
            }
            _ => {
                tracing::warn!("a set of jobs' effects failed; each job applies alone");
                roll_back(savepoint, SET_SAVEPOINT, stats).await?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "sets_tests.rs"]
mod tests;
