//! Where an API request acts: the cell of its key's owner. An API serves either one cell (every
//! request acts there) or every cell a directory lists ([`Cells::Routed`]): there each request's
//! key is looked up in the directory, and the request runs on the pool of its owner's cell,
//! opened the first time a request needs it.
//!
//! Invariants this module keeps:
//! - A routed request acts only in the cell the directory places its key's owner in; the cell's
//!   own key table still decides whether the key is live (a key revoked there is refused even
//!   though the directory routes it).
//! - A key the directory does not record routes nowhere: the request is refused as an unknown
//!   key is, before any cell is asked.
//! - Each cell is opened once (its pool checked as `serve` checks its own: session limits and a
//!   compatible schema, on the cell's node on Citus) and kept; an open that fails is retried by
//!   the next request that needs the cell, and meanwhile its requests answer `503`.
//! - Every cell has its own notifier: a submission wakes the replicas of its own cell only.
//! - The cells' figures ([`Routed::figures`]) are each cell's active-job sample, read on its own
//!   pool, all at once, each given at most the wait asked for: a cell that is down or slow has
//!   none, and never holds the others' back. Aggregates only, never a job or an owner.

use super::conn::Conn;
use crate::config::DatabaseConfig;
use crate::db::Pool;
use crate::directory::{self, KeyRef};
use crate::error::Error;
use crate::jobs::notifier::Notifier;
use crate::service::metrics::{sample_queue, QueueSample};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::OnceCell;

/// One cell as the API serves it: its pool, and the notifier its submissions wake its replicas
/// through (none: the enqueue trigger notifies).
pub(super) struct CellPool {
    /// The cell's connections.
    pub(super) pool: Pool,
    /// Its coalescing notifier, if any.
    pub(super) notifier: Option<Notifier>,
}

/// The cells an API serves.
#[derive(Clone)]
pub(super) enum Cells {
    /// One cell: every request acts in it.
    One(Arc<CellPool>),
    /// Every cell of a directory: each request acts in its key's owner's cell.
    Routed(Arc<Routed>),
}

impl Cells {
    /// The cell the requests of API key `key` act in: the one cell, or the cell the directory
    /// places the key's owner in (`None` when it does not record the key).
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the directory or the cell cannot be reached; database errors.
    pub(super) async fn of_key(&self, key: KeyRef<'_>) -> Result<Option<Arc<CellPool>>, Error> {
        match self {
            Cells::One(cell) => Ok(Some(Arc::clone(cell))),
            Cells::Routed(routed) => routed.of_key(key).await,
        }
    }
}

/// The cells of a directory, opened as requests need them.
pub(super) struct Routed {
    /// Connections to the directory's database.
    directory: Pool,
    /// The connection settings each cell's are made from (the directory's, without a cell).
    base: DatabaseConfig,
    /// The cells opened so far, or being opened, by name.
    opened: Mutex<HashMap<String, Arc<OnceCell<Arc<CellPool>>>>>,
}

impl Routed {
    /// The cells of the directory `directory` connects to; `base` is its configuration, which
    /// each cell's is derived from ([`directory::Cell::config`]).
    pub(super) fn new(directory: Pool, base: DatabaseConfig) -> Routed {
        Routed {
            directory,
            base: DatabaseConfig { cell: None, ..base },
            opened: Mutex::default(),
        }
    }

    /// The pool of the directory's database.
    pub(super) fn directory(&self) -> &Pool {
        &self.directory
    }

    /// The cell of the owner of API key `key`, opening it if no request opened it yet; `None`
    /// when the directory does not record the key.
    async fn of_key(&self, key: KeyRef<'_>) -> Result<Option<Arc<CellPool>>, Error> {
        let mut conn = Conn::checkout(&self.directory).await?;
        let Some(name) = conn.run(|c| directory::key_cell(&*c, key)).await? else {
            return Ok(None);
        };
        drop(conn);
        self.open(&name).await.map(Some)
    }

    /// Every cell the directory lists, with its active-job sample (`None`: the cell could not be
    /// read within `wait`), each read on its own pool, all at once.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the directory cannot be read; database errors.
    pub(super) async fn figures(&self, wait: Duration) -> Result<Vec<CellFigures>, Error> {
        let mut conn = Conn::checkout(&self.directory).await?;
        let listed = conn.run(|c| directory::cells(&*c)).await?;
        drop(conn);
        let samples = listed.iter().map(|cell| async move {
            let sample = async {
                let opened = self.open(&cell.name).await?;
                let mut conn = Conn::checkout(&opened.pool).await?;
                conn.run(|c| sample_queue(&*c)).await
            };
            match tokio::time::timeout(wait, sample).await {
                Ok(Ok(sample)) => Some(sample),
                Ok(Err(e)) => {
                    tracing::warn!(cell = cell.name, code = %e.code(), "a cell was not read");
                    None
                }
                Err(_) => {
                    tracing::warn!(cell = cell.name, "a cell was not read in time");
                    None
                }
            }
        });
        let samples = futures::future::join_all(samples).await;
        let figures = listed.into_iter().zip(samples);
        Ok(figures
            .map(|(cell, sample)| CellFigures { cell, sample })
            .collect())
    }

    /// Cell `name`, opened once: found in the directory, its node found on Citus, its pool
    /// checked, its notifier started.
    async fn open(&self, name: &str) -> Result<Arc<CellPool>, Error> {
        let slot = {
            let mut opened = self.opened.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(opened.entry(name.to_owned()).or_default())
        };
        let cell = slot
            .get_or_try_init(|| async {
                let mut conn = Conn::checkout(&self.directory).await?;
                let listed = conn.run(|c| directory::cell(&*c, name)).await?;
                drop(conn);
                let config = crate::db::citus::find_node(&listed.config(&self.base)?).await?;
                let (pool, _) = crate::schema::open_checked(&config, "api").await?;
                let notifier = Notifier::start(&config)?;
                tracing::info!(cell = name, "serving a cell");
                Ok::<_, Error>(Arc::new(CellPool {
                    pool,
                    notifier: Some(notifier),
                }))
            })
            .await?;
        Ok(Arc::clone(cell))
    }
}

/// A cell as the operators' view shows it: as the directory lists it, and its active-job
/// sample (`None`: it could not be read).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CellFigures {
    /// The cell.
    pub(crate) cell: directory::Cell,
    /// Its active jobs by state and its oldest due job's age.
    pub(crate) sample: Option<QueueSample>,
}
