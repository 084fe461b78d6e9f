//! What sits between a process and PostgreSQL on the database URL: nothing, or a pooler in
//! session or transaction mode; and what a process gives up behind each.
//!
//! Invariants this module keeps:
//! - Behind a transaction-mode pooler ([`Pooler::Transaction`]) a connection of the database URL
//!   keeps no session state between transactions: no named prepared statement (each statement is
//!   sent unnamed, parsed and planned in its own round trip), no session-level `SET` (the claim's
//!   planner switches are `SET LOCAL` in the claim's own transaction) and no session-level
//!   advisory lock (no alive locks: recovery judges such a replica by its owner lock and leases).
//! - Only a direct connection (`--session-database-url`) LISTENs and holds the owner lock.

/// The connection pooler on the database URL, if any (`--pooler`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Pooler {
    /// A direct connection to PostgreSQL (or a pooler in session mode that forwards start-up
    /// `options`): statements are prepared once per connection, and sessions hold locks.
    #[default]
    None,
    /// A pooler in session mode (PgBouncer `pool_mode = session`): each client keeps one server
    /// connection while connected, so everything works as direct, but start-up `options` are
    /// dropped (the claim sessions set their planner switches themselves).
    Session,
    /// A pooler in transaction mode (PgBouncer `pool_mode = transaction`): each transaction may
    /// run on another server connection, so no statement is prepared by name and no session
    /// state is kept (see the module's invariants).
    Transaction,
}

impl Pooler {
    /// Whether a connection of the database URL may keep session state (prepared statements,
    /// `SET`, session-level advisory locks) from one transaction to the next.
    pub fn keeps_sessions(self) -> bool {
        self != Pooler::Transaction
    }

    /// The word `--pooler` takes for this mode, as start-up logs and metrics name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Pooler::None => "none",
            Pooler::Session => "session",
            Pooler::Transaction => "transaction",
        }
    }
}
