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
//!   compatible schema, on the cell's node on Citus), by a task every request needing it waits
//!   for, and kept. Whatever makes an open fail (the server away, the cell not migrated, a
//!   refused role) answers its requests `503 database_unavailable`, logged with the cell's name
//!   and why; for [`OPEN_BACKOFF`] after a failure they are answered at once, then the next
//!   request tries again. A cell that cannot be opened never holds another cell's requests.
//! - Every cell has its own notifier: a submission wakes the replicas of its own cell only.
//! - A cell on Citus is served on the node that holds it: once a check of Citus's metadata (once
//!   a [`PLACEMENT_CHECK`]) finds it elsewhere (a schema move), the next request opens it again,
//!   on its new node; the old pool goes with the last request that holds it.
//! - The cells' figures ([`Routed::figures`]) are each cell's active-job sample, read on its own
//!   pool, all at once, each given at most the wait asked for: a cell that is down or slow has
//!   none, and never holds the others' back. Aggregates only, never a job or an owner.

use super::conn::Conn;
use crate::codes::Code;
use crate::config::{ConfigError, DatabaseConfig};
use crate::db::citus::Placement;
use crate::db::Pool;
use crate::directory::{self, KeyRef};
use crate::error::Error;
use crate::jobs::notifier::Notifier;
use crate::service::metrics::{sample_queue, QueueSample};
use crate::worker::liveness::placement::PLACEMENT_CHECK;
use futures::future::{BoxFuture, FutureExt, Shared};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

/// One cell as the API serves it: its pool, and the notifier its submissions wake its replicas
/// through (none: the enqueue trigger notifies).
pub(super) struct CellPool {
    /// The cell's connections.
    pub(super) pool: Pool,
    /// Its coalescing notifier, if any.
    pub(super) notifier: Option<Notifier>,
    /// Set once the Citus node the pool connects to holds the cell no longer
    /// ([`watch_placement`]): a routed API opens it again, on its new node.
    pub(super) moved: AtomicBool,
}

impl CellPool {
    /// A cell served by `pool`, its submissions waking through `notifier`.
    pub(super) fn new(pool: Pool, notifier: Option<Notifier>) -> CellPool {
        CellPool {
            pool,
            notifier,
            moved: AtomicBool::new(false),
        }
    }
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

impl Cells {
    /// Cell `name` of a routed API, opened if no request opened it yet (an operator's view aimed
    /// at it); `None` on an API serving one cell, or when the directory lists no such cell.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the directory or the cell cannot be reached; database errors.
    pub(super) async fn named(&self, name: &str) -> Result<Option<Arc<CellPool>>, Error> {
        let Cells::Routed(routed) = self else {
            return Ok(None);
        };
        let mut conn = Conn::checkout(&routed.directory).await?;
        match conn.run(|c| directory::cell(&*c, name)).await {
            Ok(_) => {}
            Err(Error::Config(ConfigError::UnknownCell)) => return Ok(None),
            Err(e) => return Err(e),
        }
        drop(conn);
        routed.open(name).await.map(Some)
    }
}

/// The cells of a directory, opened as requests need them.
pub(super) struct Routed {
    /// Connections to the directory's database.
    directory: Pool,
    /// The connection settings each cell's are made from (the directory's, without a cell).
    base: DatabaseConfig,
    /// The cells opened so far, being opened, or whose last open failed, by name.
    slots: Mutex<HashMap<String, Slot>>,
}

impl Routed {
    /// The cells of the directory `directory` connects to; `base` is its configuration, which
    /// each cell's is derived from ([`directory::Cell::config`]).
    pub(super) fn new(directory: Pool, base: DatabaseConfig) -> Routed {
        Routed {
            directory,
            base: DatabaseConfig { cell: None, ..base },
            slots: Mutex::default(),
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

    /// Cell `name`, opened once ([`open_cell`]) by a task of its own that every request needing
    /// it meanwhile waits for, so a request that gives up (its timeout, its client gone) never
    /// cuts the open short. After a failed open, the cell's requests are refused at once for
    /// [`OPEN_BACKOFF`]; the next one after it tries again.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the cell cannot be opened (why is logged with its name).
    async fn open(&self, name: &str) -> Result<Arc<CellPool>, Error> {
        let opening = {
            let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
            match slots.get(name) {
                Some(Slot::Open(cell)) if !cell.moved.load(Ordering::Relaxed) => {
                    return Ok(Arc::clone(cell));
                }
                Some(Slot::Failed(at)) if at.elapsed() < OPEN_BACKOFF => {
                    return Err(Error::Unavailable(None));
                }
                Some(Slot::Opening(opening)) => opening.clone(),
                // Never opened, failed a while ago, or moved to another Citus node: opened
                // (again), where the cell lives now.
                Some(Slot::Failed(_) | Slot::Open(_)) | None => {
                    let task = tokio::spawn(open_cell(
                        self.directory.clone(),
                        self.base.clone(),
                        name.to_owned(),
                    ));
                    let opening = async move { task.await.ok().flatten() }.boxed().shared();
                    slots.insert(name.to_owned(), Slot::Opening(opening.clone()));
                    opening
                }
            }
        };
        let opened = opening.clone().await;
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        // Only the open this request waited for is settled here: a later one stays as it is.
        let current = matches!(slots.get(name), Some(Slot::Opening(o)) if o.ptr_eq(&opening));
        match opened {
            Some(cell) => {
                if current {
                    slots.insert(name.to_owned(), Slot::Open(Arc::clone(&cell)));
                }
                Ok(cell)
            }
            None => {
                if current {
                    slots.insert(name.to_owned(), Slot::Failed(Instant::now()));
                }
                Err(Error::Unavailable(None))
            }
        }
    }
}

/// How long after a failed open a cell's requests are answered `503` at once, before the next
/// one tries again.
pub(super) const OPEN_BACKOFF: Duration = Duration::from_secs(1);

/// An open of a cell in flight, shared by every request that waits for it: the cell, or `None`
/// when it could not be opened.
type Opening = Shared<BoxFuture<'static, Option<Arc<CellPool>>>>;

/// Where a cell of a routed API stands.
enum Slot {
    /// Being opened.
    Opening(Opening),
    /// Open: its pool and notifier.
    Open(Arc<CellPool>),
    /// Its last open failed, at this instant.
    Failed(Instant),
}

/// Opens cell `name` of the directory `directory_pool` connects to: finds it there, points `base` at
/// its server (at its node, on Citus), opens and checks its pool as `serve` checks its own
/// (session limits, a compatible schema), and starts its notifier; on Citus, watches where the
/// cell lives ([`watch_placement`]). `None` when any step fails, logged with the cell's name and
/// the stable code of why.
async fn open_cell(
    directory_pool: Pool,
    base: DatabaseConfig,
    name: String,
) -> Option<Arc<CellPool>> {
    let opened = async {
        let mut conn = Conn::checkout(&directory_pool).await?;
        let listed = conn.run(|c| directory::cell(&*c, &name)).await?;
        drop(conn);
        let config = crate::db::citus::find_node(&listed.config(&base)?).await?;
        let (pool, _) = crate::schema::open_checked(&config, "api").await?;
        let on_citus = crate::db::check_cell(&*crate::db::checkout(&pool).await?, &config).await?;
        let notifier = Notifier::start(&config)?;
        let connections_max = crate::worker::budget::Budget::api(&config).total();
        tracing::info!(cell = name, connections_max, "serving a cell");
        let cell = Arc::new(CellPool::new(pool, Some(notifier)));
        if let Some(citus_cell) = on_citus {
            tokio::spawn(watch_placement(Arc::downgrade(&cell), citus_cell));
        }
        Ok::<_, Error>(cell)
    };
    match opened.await {
        Ok(cell) => Some(cell),
        Err(e) => {
            tracing::warn!(cell = name, code = %e.code(), "a cell could not be opened");
            None
        }
    }
}

/// Asks, every [`PLACEMENT_CHECK`] while the API serves `cell` (its pool on the Citus node that
/// held cell `name` when it was opened), whether that node still holds it; marks it moved once
/// it does not (a schema move), so the next request opens it on its new node, and ends. A failed
/// check is tried again at the next; the watch ends with the pool.
async fn watch_placement(cell: Weak<CellPool>, name: String) {
    loop {
        tokio::time::sleep(PLACEMENT_CHECK).await;
        let Some(served) = cell.upgrade() else {
            return;
        };
        let placement = async {
            let conn = crate::db::checkout(&served.pool).await?;
            crate::db::citus::locate(&*conn, &name).await
        };
        match placement.await {
            Ok(Placement::Elsewhere { .. }) => {
                served.moved.store(true, Ordering::Relaxed);
                tracing::info!(cell = name, code = %Code::CellMoved, "a cell moved to another node; serving it there");
                return;
            }
            Ok(Placement::Here | Placement::Plain) => {}
            Err(e) => {
                tracing::warn!(cell = name, code = %e.code(), "checking where a cell lives failed");
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_db::TestDb;

    #[tokio::test]
    async fn a_cell_opens_once_with_its_own_notifier_and_one_that_cannot_answers_at_once_for_a_while(
    ) {
        let db = TestDb::migrated().await;
        let client = db.client().await;
        directory::init(&client).await.unwrap();
        directory::add(&client, "cell_here", None).await.unwrap();
        // A server that refuses every connection: nothing listens on port 1.
        directory::add(&client, "cell_away", Some(("127.0.0.1", 1)))
            .await
            .unwrap();
        directory::add(&client, "cell_bare", None).await.unwrap();
        let here = DatabaseConfig {
            cell: Some("cell_here".to_owned()),
            ..db.config.clone()
        };
        crate::schema::migrate(&here).await.unwrap();
        let pool = crate::db::connect_pool(&db.config, "api").await.unwrap();
        let routed = Routed::new(pool, db.config.clone());

        let first = routed.open("cell_here").await.unwrap();
        assert!(first.notifier.is_some());
        let again = routed.open("cell_here").await.unwrap();
        assert!(Arc::ptr_eq(&first, &again), "opened once");
        // Its pool is the cell's: its sessions find the cell's tables.
        let conn = crate::db::checkout(&first.pool).await.unwrap();
        let schema: String = conn
            .query_one("SELECT current_schema()", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(schema, "cell_here");
        drop(conn);

        // Away, listed but not migrated, or not listed: each is unavailable, never opened.
        for name in ["cell_away", "cell_bare", "cell_none"] {
            assert!(matches!(
                routed.open(name).await,
                Err(Error::Unavailable(None))
            ));
            let slots = routed.slots.lock().unwrap_or_else(PoisonError::into_inner);
            assert!(matches!(slots.get(name), Some(Slot::Failed(_))), "{name}");
        }
        // Within the backoff a failed cell is refused without trying: even once it could open.
        crate::schema::migrate(&DatabaseConfig {
            cell: Some("cell_bare".to_owned()),
            ..db.config.clone()
        })
        .await
        .unwrap();
        assert!(routed.open("cell_bare").await.is_err());
        tokio::time::sleep(OPEN_BACKOFF).await;
        let bare = routed.open("cell_bare").await.unwrap();
        assert!(bare.notifier.is_some());
    }
}
