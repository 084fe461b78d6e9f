//! The queues a replica serves, as its configuration names them: each queue's name, its weight,
//! and the checks a list of them passes. Below the rest of [`crate::queue`] (which controls
//! queues in the database) so that configuration can hold served queues without importing
//! what the database's errors import.
//!
//! Invariants this module keeps:
//! - A queue's name follows the rule of a kind's name (`names::is_kind_name`: what the
//!   schema's checks store); a job whose enqueue names none is in [`DEFAULT_QUEUE`].
//! - A replica serves at least one queue, each once, each with a weight in [`WEIGHT_RANGE`].

/// The queue of a job whose enqueue names none, and the queue a replica serves by default.
pub const DEFAULT_QUEUE: &str = "default";

/// The weights a served queue may have.
pub const WEIGHT_RANGE: std::ops::RangeInclusive<u32> = 1..=1000;

/// One queue a replica serves, and its weight: when several of its queues have work, each claim
/// shares the replica's room among them in proportion to their weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedQueue {
    /// The queue's name.
    pub name: String,
    /// Its weight, in [`WEIGHT_RANGE`].
    pub weight: u32,
}

impl ServedQueue {
    /// Queue `name` with weight 1.
    pub fn new(name: &str) -> ServedQueue {
        ServedQueue {
            name: name.to_owned(),
            weight: 1,
        }
    }

    /// This queue, with `weight`.
    pub fn weighted(self, weight: u32) -> ServedQueue {
        ServedQueue { weight, ..self }
    }
}

/// What is wrong with a list of served queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QueuesError {
    /// No queue is served.
    #[error("a replica must serve at least one queue")]
    None,
    /// A queue's name is not one the schema stores.
    #[error("a queue's name must be 1 to 63 characters of a-z 0-9 _ . starting with a letter")]
    Name,
    /// A weight is outside [`WEIGHT_RANGE`], or not a number.
    #[error("a queue's weight must be a whole number from 1 to 1000")]
    Weight,
    /// A queue is named twice.
    #[error("each queue may be served once")]
    Duplicate,
    /// A cap is outside [`CAP_RANGE`](crate::queue::CAP_RANGE).
    #[error("a queue's cap must be from 1 to 10000 running jobs")]
    Cap,
}

/// Whether `name` may be a queue's name (the rule of a kind's name).
pub fn is_queue_name(name: &str) -> bool {
    crate::names::is_kind_name(name)
}

/// Checks a replica's served queues (see the module's invariants).
///
/// # Errors
/// The first [`QueuesError`] found.
pub fn validate(queues: &[ServedQueue]) -> Result<(), QueuesError> {
    if queues.is_empty() {
        return Err(QueuesError::None);
    }
    for (i, queue) in queues.iter().enumerate() {
        if !is_queue_name(&queue.name) {
            return Err(QueuesError::Name);
        }
        if !WEIGHT_RANGE.contains(&queue.weight) {
            return Err(QueuesError::Weight);
        }
        if queues[..i].iter().any(|q| q.name == queue.name) {
            return Err(QueuesError::Duplicate);
        }
    }
    Ok(())
}

/// Parses `work --queues`: comma-separated `name` or `name:weight` (weight 1 when left out).
///
/// # Errors
/// As [`validate`], for what the list names.
pub fn parse(list: &str) -> Result<Vec<ServedQueue>, QueuesError> {
    let queues = list
        .split(',')
        .map(|item| match item.trim().split_once(':') {
            None => Ok(ServedQueue::new(item.trim())),
            Some((name, weight)) => weight
                .trim()
                .parse()
                .map(|w| ServedQueue::new(name.trim()).weighted(w))
                .map_err(|_| QueuesError::Weight),
        })
        .collect::<Result<Vec<_>, _>>()?;
    validate(&queues)?;
    Ok(queues)
}

#[cfg(test)]
mod tests {
    use super::{parse, validate, QueuesError, ServedQueue, DEFAULT_QUEUE};

    #[test]
    fn a_list_of_queues_parses_with_weights_defaulting_to_one() {
        assert_eq!(
            parse("mail:3, reports ,etl.load:1").unwrap(),
            vec![
                ServedQueue::new("mail").weighted(3),
                ServedQueue::new("reports"),
                ServedQueue::new("etl.load"),
            ]
        );
        assert_eq!(
            parse(DEFAULT_QUEUE).unwrap(),
            vec![ServedQueue::new("default")]
        );
    }

    #[test]
    fn a_bad_list_of_queues_names_what_is_wrong() {
        assert_eq!(parse(""), Err(QueuesError::Name));
        assert_eq!(parse("Mail"), Err(QueuesError::Name));
        assert_eq!(parse("a,,b"), Err(QueuesError::Name));
        assert_eq!(parse("mail:0"), Err(QueuesError::Weight));
        assert_eq!(parse("mail:1001"), Err(QueuesError::Weight));
        assert_eq!(parse("mail:x"), Err(QueuesError::Weight));
        assert_eq!(parse("mail:-1"), Err(QueuesError::Weight));
        assert_eq!(parse("mail,mail:2"), Err(QueuesError::Duplicate));
        assert_eq!(parse("mail:1000").unwrap()[0].weight, 1000);
        assert_eq!(validate(&[]), Err(QueuesError::None));
    }
}
