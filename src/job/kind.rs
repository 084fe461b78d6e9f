//! What a job kind is: a Rust type whose value is the payload.
//!
//! Invariants this module keeps:
//! - A kind's name ([`Job::KIND`]) is what is stored with its jobs and matched to its handler;
//!   its payload is the value serialized by `serde`.

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::Duration;

/// A job kind: its value is the job's payload.
///
/// ```
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct WelcomeEmail { user_id: i64 }
///
/// impl durable_etl::Job for WelcomeEmail {
///     const KIND: &'static str = "welcome_email";
///     const MAX_ATTEMPTS: i32 = 3;
/// }
/// ```
pub trait Job: Serialize + DeserializeOwned + Send + 'static {
    /// The kind's name, stored with every job of the kind and matched to its handler. Keep it
    /// stable: renaming it strands the jobs already enqueued.
    const KIND: &'static str;
    /// The attempt bound of a job of this kind when
    /// [`EnqueueOptions::max_attempts`](crate::EnqueueOptions::max_attempts) is not set (1 to
    /// 100: an enqueue is refused with another). Defaults to 5.
    const MAX_ATTEMPTS: i32 = 5;
    /// How long one attempt's compute phase may take, and then its effects; `None` (the
    /// default) is the replica's execution timeout.
    const EXECUTION_TIMEOUT: Option<Duration> = None;
    /// The failure codes of the kind's own, for [`JobError::failed`](crate::JobError::failed):
    /// each a lower-case identifier that is not one of the crate's codes
    /// ([`is_kind_code`](crate::job::handler::is_kind_code)). Defaults to none.
    const CODES: &'static [&'static str] = &[];
    /// The queue a job of this kind waits in when
    /// [`EnqueueOptions::queue`](crate::EnqueueOptions::queue) is not set: replicas serving it
    /// ([`WorkerConfig::queues`](crate::WorkerConfig::queues)) claim it. Defaults to
    /// [`DEFAULT_QUEUE`](crate::queue::DEFAULT_QUEUE).
    const QUEUE: &'static str = crate::queue::DEFAULT_QUEUE;
    /// The priority of a job of this kind when
    /// [`EnqueueOptions::priority`](crate::EnqueueOptions::priority) is not set: 0 (the most
    /// urgent) to 9, aged by its due time ([`crate::queue`]). Defaults to 0.
    const PRIORITY: i16 = 0;

    /// The delay before retrying after failed attempt `attempt` (from 1), at most
    /// [`RETRY_AFTER_MAX`](crate::job::RETRY_AFTER_MAX); `None` (the default) is the
    /// replica's policy. A handler's [`JobError::RetryAfter`](crate::JobError::RetryAfter)
    /// overrides both.
    fn retry_delay(_attempt: i32) -> Option<Duration> {
        None
    }
}
