//! What a replica has learned of its queues' caps: which of them are capped (a cap or a key cap),
//! so that their claims take [`super::CLAIM_SQL`], which takes permits, and the others
//! [`super::CLAIM_UNCAPPED_SQL`], which takes none.
//!
//! Invariants this module keeps:
//! - What it knows only chooses a statement, never what may be claimed: the uncapped statement
//!   refuses a capped queue itself, so a queue capped since it was last seen costs one more round
//!   trip and never runs past its cap; a queue uncapped since costs the permit statement's extra
//!   work until it is forgotten.
//! - It is forgotten at every poll ([`CappedQueues::forget`]), so a queue uncapped since is
//!   claimed by the cheaper statement again within a poll interval.

use super::statement::Ask;
use std::sync::{Mutex, PoisonError};

/// The served queues a replica has seen capped since it last forgot.
#[derive(Debug, Default)]
pub struct CappedQueues(Mutex<Vec<String>>);

impl CappedQueues {
    /// Whether any queue of `asks` is known to be capped.
    pub fn any_of(&self, asks: &[Ask<'_>]) -> bool {
        let known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        asks.iter()
            .any(|(queue, _)| known.iter().any(|k| k == queue))
    }

    /// Notes that `queues` are capped.
    pub fn learn<'a>(&self, queues: impl IntoIterator<Item = &'a str>) {
        let mut known = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        for queue in queues {
            if !known.iter().any(|k| k == queue) {
                known.push(queue.to_owned());
            }
        }
    }

    /// Forgets every queue it knew to be capped.
    pub fn forget(&self) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

#[cfg(test)]
mod tests {
    use super::CappedQueues;

    #[test]
    fn it_knows_the_queues_it_learned_until_it_forgets() {
        let capped = CappedQueues::default();
        assert!(!capped.any_of(&[("mail", 3)]));
        capped.learn(["mail", "mail", "bulk"]);
        assert!(capped.any_of(&[("reports", 1), ("mail", 3)]));
        assert!(!capped.any_of(&[("reports", 1)]));
        capped.forget();
        assert!(!capped.any_of(&[("mail", 3), ("bulk", 1)]));
    }
}
