//! An explicit-state model check of the replicas' wake protocol as shipped (`durable_etl_wake` of
//! migration 0028, and the claim loop: `Producer`, `Presence`): a breadth-first search over every
//! interleaving of a few enqueuers, two replicas and an operator, with a visited set of packed
//! states, that looks for a job nobody will ever claim. Std only: no database, no crate of this
//! package. The `v2_*` tests check the shipped protocol; the others check that each fix it has
//! is needed, that broken designs fail, and one defect it still has.
//!
//! # The model
//!
//! - Jobs: each enqueuer runs one transaction that enqueues one job into its queue, then commits
//!   or rolls back (both are explored). A job is not yet inserted, uncommitted, committed
//!   (claimable while its queue is not paused), claimed, or gone (rolled back). Inserting the job
//!   and the trigger's first read are one step: an uncommitted job is invisible to every other
//!   party, so the insert alone changes nothing any other step reads.
//! - The trigger (`durable_etl_wake`): it reads `paused[q]` and the registry without locks (a
//!   read of committed state; the function reads them in two statements, the model in one
//!   step). When some row waits for `q` and `q` is not paused, it names one of them (any one:
//!   all are explored), notified at the commit (`t <token> <queue> <kind>`). Else it takes `q`'s
//!   enqueue barrier in share mode (a later step), then reads again (another step: a snapshot
//!   taken after the lock) and names whomever that read finds, keeping the barrier to its end;
//!   when the second read finds nobody either, it notifies nobody.
//! - Recovery (scenarios with `recovery`): the job of a replica that dies holding one is given
//!   back, at any later point, by a transaction of its own, whose kind-less wake does the same
//!   (read; barrier; read again) with `q <queue>` for every replica in place of a named token
//!   when it finds some row waiting for `q`. It always commits (a failed one runs again later).
//!   Without `recovery`, the job stays claimed and is no longer modelled.
//! - The registry: one row per replica incarnation, waiting (for the queues its replica serves)
//!   or parked; only its replica writes it. A restarted replica registers under a new wake
//!   token; its dead incarnation's row stays as it was (stale: rows are never deleted here), so
//!   wakes may still name it.
//! - The enqueue barrier of each queue: the set of open enqueue transactions that hold it in
//!   share mode (a transaction-level advisory lock, released at their commit or rollback).
//! - Notifications exist only from a commit on, so they are delivered at the commit that sends
//!   them, atomically with it and in commit order, into the inbox of every live replica that
//!   serves their queue (any other would ignore them); a replica reads its inbox in order, one
//!   notification per step. A rolled-back transaction sends nothing. A dead replica's inbox is
//!   discarded and it is sent nothing.
//! - The operator pauses one queue once and resumes it once; the resume's commit sends
//!   `q <queue>`.
//! - There is no poll, and no timer is timed: a backup fires, and a held barrier is tried again,
//!   at any later point. A wake that is missed is missed for good.
//! - A replica holds at most one job (capacity 1). Its presence is `Presence`'s: `Joining` from
//!   its start, `Waiting` from its registration's answer, `Busy` from the answer of a claim that
//!   parked its row, and `Joining` again after a short claim's answer while `Busy`. It works in
//!   rounds, one in flight at a time: a claim and the presence statements pipelined before it,
//!   each its own implicit transaction, run in order, each a step of its own:
//!   - while `Joining`: its registration (the row upserted waiting, in the step that sends it),
//!     the tries of every served queue, then a claim;
//!   - after a claim that came back full (a backlog: its row still waits while it holds the
//!     job): its row parked (in the step that sends it), then a claim;
//!   - while `Waiting`, when a claim is owed and some queue owes a try: those tries, then a
//!     claim; when a claim is owed and none: a claim alone (sent and run in one step, as while
//!     `Busy`); when tries are owed and no claim is: a retry of those tries alone, whose claim
//!     follows only if one of them succeeds.
//!
//!   The tries are one statement: each queue's succeeds unless an open transaction holds its
//!   barrier; a held one stays owed (and is retried). A claim takes a committed job of a served,
//!   unpaused queue, if any. The round's answer comes back with its claim, or in a step of its
//!   own with `claims_in_flight`; it settles each queue whose try succeeded, unless the queue
//!   opened again after the try was sent (a `q` wake heard while the round was in flight leaves
//!   it owed). Sending a round clears the owed claim and the backup, except a retry of held
//!   barriers sent alone, which leaves the backup armed.
//! - A replica's wakes: its own token owes a claim; another token, for a queue it serves, arms
//!   its backup while it is registered (`Joining` or `Waiting`), which fires later and owes a
//!   claim unless a round is sent first; `q <queue>`, for a queue it serves, owes a claim and,
//!   while it is registered, records the queue as owing a try. Finishing its job owes a claim.
//!   It may die (its state is lost, its row stays) and restart (`Joining`, a new token).
//! - Reductions that keep every behaviour: the enqueuers of one queue are interchangeable (a
//!   claim takes "a job of `a`", and a replica holds "a job of `a`"), and so are the two
//!   replicas, with their rows and tokens, when they serve the same queues; the search keeps
//!   the first state it reaches of each class of states equal up to these renamings, so each
//!   trace it reports is a run, and a shortest one.
//! - Left out: kinds (one kind), caps and permits, refreshes of a waiting row, reconnects,
//!   recovery's deletion of stale rows, the claim cooldown (it delays claims, never drops them),
//!   and how a replica shares a claim among its queues: a claim here asks every served queue,
//!   which the real one does within `LEFT_OUT_MAX` of a queue coming back short (tested by
//!   `wake_cases::a_busy_replica_still_asks_a_queue_it_left_out_while_another_queues_backlog_lasts`).
//!   Its retries of held barriers all go alone; the real ones claim too once a barrier stayed
//!   held for 32 ms, which only adds claims. Property 1 judges quiet states, with every enqueue
//!   ended, so a job committed while another enqueue still holds the barrier is judged by
//!   `wake_cases::a_job_committed_while_another_enqueue_holds_the_barrier_runs_at_once`.
//!
//! # The designs
//!
//! - [`SHIPPED`]: the protocol above. It has four fixes that this model check found in the
//!   first version of 0028 and of the claim loop; without any one of them it loses or spends a
//!   wake:
//!   - [`READ_THEN_BARRIER`]: the trigger reads, then takes the barrier, and reads no more: a
//!     replica can register, try the barrier and claim between the two, or a resume can be
//!     heard and its queue settled between them;
//!   - [`BACKUPS_WHILE_WAITING`]: backups armed only while `Waiting`: a wake named for a dead
//!     replica heard while the registration's claim is in flight arms none;
//!   - [`OPENED_WHILE_WAITING`] and [`STALE_TRIES_SETTLE`], the two halves of the third: a `q`
//!     wake heard while `Joining` records nothing, or is recorded but settled by the answer of
//!     the registration's try, sent before it.
//!   - [`RETRY_CLEARS_BACKUP`]: a retry of held barriers sent alone clears the backup and claims
//!     nothing while they stay held, so a wake named for a full replica waits for an unrelated
//!     enqueue to end (property 2).
//! - The broken designs, which the checker must refute: [`TAKE`] (A, before 0028: the enqueuer
//!   locks the named row to its end and parks it at its commit; an enqueuer that finds no
//!   unlocked waiting row names nobody and takes no barrier; no backups), [`NO_BARRIER`] (B: the
//!   shipped protocol without the barrier) and [`NO_BACKUPS`] (C: without backups).
//!
//! # The properties
//!
//! 1. No lost wake: in every reachable quiescent state (no enqueue transaction open and no
//!    recovery to run, and no live replica that may send a round, run its tries or its claim,
//!    take an answer, read a notification or fire its backup), no job is committed and
//!    unclaimed in an unpaused queue that a live replica holding no job serves.
//! 2. No wake spent on a replica that cannot act: a wake named for a replica that was dead or
//!    full when it was delivered (a) arms the backup of every other live replica with no job
//!    whose row waits for that queue, as it reads it, and (b) once every live replica has read
//!    the queue's wakes named for replicas that could not act, leaves a claim owed (a claim, a
//!    backup, a backlog, a try of the queue owed or in flight, a round whose claim has not run,
//!    a registration or a short claim to come, or an unread notification of the queue) by some
//!    live replica with no job that serves the queue, if a job of the queue is still claimable
//!    and some live replica with no job waits for it.
//!
//! # The bounds
//!
//! Two replicas (replica 0 serves `a` and replica 1 serves `a` and `b`, or both serve `a`), two
//! queues, two or three enqueuers of one job each, at most one death and one restart, at most one
//! pause and resume of one queue: see the scenarios ([`SPLIT_DEATH`] and the others) for each
//! test's. The shipped protocol holds both properties in the eight scenarios of the `v2_*` tests.

use std::collections::VecDeque;

/// The number of queues: `a` and `b`.
const QUEUES: usize = 2;

/// The number of replicas.
const REPLICAS: usize = 2;

/// The most enqueuers a scenario runs.
const ENQUEUERS: usize = 3;

/// A replica's incarnations: its first life and the one after its restart.
const INCARNATIONS: usize = 2;

/// An inbox's capacity: a notification from each enqueuer, the resume's and the recovery's.
const INBOX: usize = ENQUEUERS + 2;

/// The target of a kind-less wake whose read found a row waiting for its queue: `q <queue>` for
/// every replica, not a wake token.
const EVERYONE: u8 = (REPLICAS * INCARNATIONS) as u8;

/// The queue `a`.
const A: usize = 0;

/// The queue `b`.
const B: usize = 1;

/// The queues' names, for traces.
const QUEUE_NAMES: [&str; QUEUES] = ["a", "b"];

/// Replica 0 serves `a`, replica 1 serves `a` and `b`.
const SPLIT: [[bool; QUEUES]; REPLICAS] = [[true, false], [true, true]];

/// Both replicas serve `a` only.
const SAME: [[bool; QUEUES]; REPLICAS] = [[true, false], [true, false]];

/// The visited set: the keys of the states reached, in an open-addressing table with linear
/// probing (a std map's probing is slow in a debug build). Keys are never 0: 0 marks a free
/// slot.
struct Visited {
    /// The slots: a key, or 0; a power of two of them, at most three quarters used.
    slots: Box<[u128]>,
    /// How many slots are used.
    len: usize,
}

impl Visited {
    /// An empty set.
    fn new() -> Visited {
        Visited {
            slots: vec![0; 1 << 16].into_boxed_slice(),
            len: 0,
        }
    }

    /// The slot of `key`: its own, or the free one where it belongs.
    fn slot(slots: &[u128], key: u128) -> usize {
        // The finalizer of MurmurHash3 on both halves: every key bit reaches the index bits.
        let mut h = (key as u64) ^ ((key >> 64) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^= h >> 33;
        let mask = slots.len() - 1;
        let mut at = h as usize & mask;
        while slots[at] != 0 && slots[at] != key {
            at = (at + 1) & mask;
        }
        at
    }

    /// Adds `key` (not 0); whether it was not there yet.
    fn insert(&mut self, key: u128) -> bool {
        assert_ne!(key, 0, "0 marks a free slot");
        let at = Self::slot(&self.slots, key);
        if self.slots[at] == key {
            return false;
        }
        self.slots[at] = key;
        self.len += 1;
        if self.len * 4 > self.slots.len() * 3 {
            let mut grown = vec![0; self.slots.len() * 2].into_boxed_slice();
            for &old in self.slots.iter().filter(|&&k| k != 0) {
                let at = Self::slot(&grown, old);
                grown[at] = old;
            }
            self.slots = grown;
        }
        true
    }
}

/// How an enqueue's trigger (`durable_etl_wake`) decides whom to wake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wake {
    /// As shipped (migration 0028): read the registry and `paused[q]` without locks; when that
    /// read finds nobody who may act, take `q`'s barrier in share mode, then read again (a new
    /// statement: a snapshot taken after the lock) and wake whomever the second read finds,
    /// keeping the barrier to the commit.
    BarrierThenReread,
    /// The first version of 0028: read; when nobody may act, take the barrier in a later
    /// statement, and read no more.
    ReadThenBarrier,
    /// Broken variant B: read; when nobody may act, wake nobody and take no barrier.
    NoBarrier,
    /// Broken variant A, the take (before 0028): lock the named row (`FOR UPDATE SKIP LOCKED`)
    /// to the transaction's end and park it at the commit (a replica whose row is locked parks
    /// it only after that end, and a wake of its own token tells it its row was taken, so it
    /// registers again); an enqueue that finds no unlocked waiting row wakes nobody and takes no
    /// barrier.
    Take,
}

/// When a replica does something, by its presence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gate {
    /// Never.
    Never,
    /// Only while its presence is `Waiting`: after the answer of its registration's claim.
    WhileWaiting,
    /// While it is registered (`Presence::registered`): `Joining` or `Waiting`, not `Busy`.
    WhileRegistered,
}

impl Gate {
    /// Whether a replica whose presence is `presence` does it.
    fn admits(self, presence: Presence) -> bool {
        match self {
            Gate::Never => false,
            Gate::WhileWaiting => presence == Presence::Waiting,
            Gate::WhileRegistered => presence != Presence::Busy,
        }
    }
}

/// A protocol: the enqueues' trigger and the replicas' rules.
#[derive(Clone, Copy, Debug)]
struct Design {
    /// Its name, for the report.
    name: &'static str,
    /// How an enqueue's trigger wakes.
    wake: Wake,
    /// When a replica that hears a wake named for another replica, for a queue it serves, arms
    /// its backup (`Producer::back_up`).
    backups: Gate,
    /// When a replica that hears `q <queue>`, for a queue it serves, records the queue as owing
    /// a try (`Presence::opened`).
    opened: Gate,
    /// Whether a try's success settles its queue even when the queue opened again after the try
    /// was sent (the claim loop before the fix); else such a queue stays owed (`Ticket::openings`).
    stale_tries_settle: bool,
    /// Whether sending a retry of held barriers alone clears the backup, as sending any claim
    /// does (`Producer::send_claim`), though the retry claims only once one of its tries
    /// succeeds.
    retry_clears_backup: bool,
}

/// The protocol as shipped: the second read under the barrier; backups armed, and opened queues
/// recorded, while `Joining` or `Waiting`; a try settles no queue opened after it was sent.
const SHIPPED: Design = Design {
    name: "shipped",
    wake: Wake::BarrierThenReread,
    backups: Gate::WhileRegistered,
    opened: Gate::WhileRegistered,
    stale_tries_settle: false,
    retry_clears_backup: false,
};

/// The shipped protocol without its fourth fix: a retry of held barriers sent alone clears the
/// backup, as sending any claim does.
const RETRY_CLEARS_BACKUP: Design = Design {
    name: "shipped, but a retry alone clears the backup",
    retry_clears_backup: true,
    ..SHIPPED
};

/// The shipped protocol without its first fix: the barrier after the read, and no second read.
const READ_THEN_BARRIER: Design = Design {
    name: "shipped, but the barrier after the read and no second read",
    wake: Wake::ReadThenBarrier,
    ..SHIPPED
};

/// The shipped protocol without its second fix: backups armed only while `Waiting`.
const BACKUPS_WHILE_WAITING: Design = Design {
    name: "shipped, but backups only while waiting",
    backups: Gate::WhileWaiting,
    ..SHIPPED
};

/// The shipped protocol without the first half of its third fix: a `q` wake heard while
/// `Joining` records nothing.
const OPENED_WHILE_WAITING: Design = Design {
    name: "shipped, but opened queues recorded only while waiting",
    opened: Gate::WhileWaiting,
    ..SHIPPED
};

/// The shipped protocol without the second half of its third fix: a try's success settles its
/// queue though the queue opened again while the try was in flight.
const STALE_TRIES_SETTLE: Design = Design {
    name: "shipped, but a try in flight settles a queue opened after it was sent",
    stale_tries_settle: true,
    ..SHIPPED
};

/// Broken variant A: the take, and no backups.
const TAKE: Design = Design {
    name: "A: the take",
    wake: Wake::Take,
    backups: Gate::Never,
    ..SHIPPED
};

/// Broken variant B: the shipped protocol without the barrier.
const NO_BARRIER: Design = Design {
    name: "B: no barrier",
    wake: Wake::NoBarrier,
    ..SHIPPED
};

/// Broken variant C: the shipped protocol without backups.
const NO_BACKUPS: Design = Design {
    name: "C: no backups",
    backups: Gate::Never,
    ..SHIPPED
};

/// An enqueuer's job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Job {
    /// Not inserted yet (or held by a dead replica, its recovery not begun).
    Absent,
    /// Inserted (or given back) by a transaction still open.
    Uncommitted,
    /// Committed and not claimed: claimable while its queue is not paused.
    Committed,
    /// Claimed by a replica (held, or done).
    Claimed,
    /// Rolled back.
    Gone,
}

/// Where an enqueuer's transaction (or its job's recovery) stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tx {
    /// Not begun.
    Idle,
    /// Its read found nobody who may act; the barrier is its next step
    /// ([`Wake::ReadThenBarrier`], [`Wake::BarrierThenReread`]).
    Skipped,
    /// It holds the barrier; its second read is its next step ([`Wake::BarrierThenReread`]).
    Barred,
    /// Its trigger is done: it commits or rolls back next.
    Open {
        /// The wake token it named, [`EVERYONE`] (a kind-less wake that found a waiting row),
        /// or none (under [`Wake::Take`], the row it locked).
        target: Option<u8>,
        /// Whether it holds its queue's barrier in share mode.
        barrier: bool,
    },
    /// Committed or rolled back.
    Ended,
}

/// A notification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Msg {
    /// An empty inbox slot.
    Empty,
    /// `t <token> <queue> <kind>`: a wake named for one replica incarnation.
    Target {
        /// The wake token named.
        token: u8,
        /// The queue of the job.
        queue: u8,
        /// Ghost: whether the named replica was dead or full when it was delivered.
        cannot_act: bool,
    },
    /// `q <queue>`: a wake for every replica that serves the queue (a resume, a recovery).
    Broadcast {
        /// The queue.
        queue: u8,
    },
}

/// A replica's presence (`Presence`'s state): what its claim loop knows of its row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Presence {
    /// A round that parked its row answered (the first after a claim that came back full), and
    /// no short claim has answered since.
    Busy,
    /// It registers on its next claim, or did and has not had that claim's answer.
    Joining,
    /// Its registration's claim answered: its row waits.
    Waiting,
}

/// Where a replica stands with one queue's barrier (`Presence::unsettled`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Settle {
    /// Nothing owed.
    Done,
    /// A try is owed: the queue opened, or its try failed, since the last try that settled it.
    Owed,
    /// A try of it is in the round in flight, sent after the queue last opened: that round's
    /// answer settles it if the try succeeds.
    Sent,
    /// A try of it is in the round in flight, but the queue opened again after it was sent:
    /// that round's answer leaves it owed.
    Reopened,
}

/// The round a replica has in flight: a claim and the presence statements pipelined before it,
/// each its own implicit transaction, run in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    /// None.
    Idle,
    /// Its tries (one statement) run next, then its claim.
    Tries,
    /// A retry of held barriers: its tries run next, alone; its claim follows only if one of
    /// them succeeds.
    Retry,
    /// Its claim runs next.
    Claim,
    /// Its claim ran (or a retry's tries all failed); its answer is not back yet (with claims
    /// in flight only: else it comes back in the claim's step).
    Answer,
    /// Its row was parked (its first statement); its claim runs next.
    ParkClaim,
    /// Its row was parked and its claim ran; its answer is not back yet (with claims in flight
    /// only).
    ParkAnswer,
}

/// The presence change a round carries (`presence::Change`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    /// Upsert the row (waiting), try every served queue's barrier, then claim.
    Register,
    /// Try the owed queues' barriers, then claim.
    Settle,
    /// Try the owed queues' barriers alone (a retry); claim once one succeeds.
    Retry,
    /// Park the row, then claim: the first claim after one that came back full.
    Park,
}

/// One replica's local state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Replica {
    /// Whether it runs.
    alive: bool,
    /// Its incarnation: 0, or 1 after its restart.
    incarnation: u8,
    /// Its presence.
    presence: Presence,
    /// A claim is owed (a wake of its own, a `q` wake, a backup that fired, a finished job;
    /// coalesced): it sends one once no round is in flight.
    wake: bool,
    /// Each queue's tries.
    settle: [Settle; QUEUES],
    /// Its backup timer is armed.
    backup: bool,
    /// Its last claim came back full (`WakeState::backlog`): its next claim parks its row
    /// first, unless it is `Busy` already.
    backlog: bool,
    /// The round in flight.
    round: Round,
    /// The queue of the job it holds, if any (jobs of one queue are interchangeable).
    holding: Option<u8>,
    /// Notifications delivered and not yet read, oldest first, then empty slots.
    inbox: [Msg; INBOX],
    /// How many notifications the inbox holds.
    unread: u8,
}

impl Replica {
    /// A replica that just started (or restarted) as `incarnation`: `Joining`, its row absent.
    fn started(incarnation: u8) -> Replica {
        Replica {
            alive: true,
            incarnation,
            presence: Presence::Joining,
            wake: false,
            settle: [Settle::Done; QUEUES],
            backup: false,
            backlog: false,
            round: Round::Idle,
            holding: None,
            inbox: [Msg::Empty; INBOX],
            unread: 0,
        }
    }

    /// Appends `msg` to the inbox.
    fn deliver(&mut self, msg: Msg) {
        let at = usize::from(self.unread);
        assert!(at < INBOX, "inbox overflow");
        self.inbox[at] = msg;
        self.unread += 1;
    }

    /// Takes the oldest notification out of the inbox.
    fn take(&mut self) -> Msg {
        let head = self.inbox[0];
        self.inbox.copy_within(1.., 0);
        self.inbox[INBOX - 1] = Msg::Empty;
        self.unread -= 1;
        head
    }

    /// The notifications in the inbox.
    fn unread(&self) -> &[Msg] {
        &self.inbox[..usize::from(self.unread)]
    }

    /// The queues whose barrier is in `settle` state `state` (a bit per queue).
    fn queues_in(&self, state: Settle) -> u8 {
        (0..QUEUES)
            .filter(|&q| self.settle[q] == state)
            .fold(0, |queues, q| queues | 1 << q)
    }
}

/// The operator's progress with its one pause and resume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operator {
    /// Has not paused.
    Idle,
    /// Has paused, not yet resumed.
    Paused,
    /// Has paused and resumed.
    Done,
}

/// A global state of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct State {
    /// Each enqueuer's job.
    jobs: [Job; ENQUEUERS],
    /// Each enqueuer's transaction.
    txs: [Tx; ENQUEUERS],
    /// Whether each enqueuer's transaction is its job's recovery, which wakes kind-less
    /// (`q <queue>`) and always commits.
    kindless: [bool; ENQUEUERS],
    /// The registry: whether the row of each replica incarnation is waiting (else parked or
    /// absent). A dead incarnation's row stays as it was.
    waiting: [[bool; INCARNATIONS]; REPLICAS],
    /// The replicas.
    replicas: [Replica; REPLICAS],
    /// Whether each queue is paused (committed state).
    paused: [bool; QUEUES],
    /// The operator.
    operator: Operator,
    /// Deaths so far.
    deaths: u8,
    /// Restarts so far.
    restarts: u8,
}

/// One step of the model, for traces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    /// An enqueuer inserts its job (or a recovery gives its job back) and its trigger reads the
    /// registry and `paused`.
    Read {
        /// The enqueuer.
        enqueuer: u8,
        /// The wake token it names, [`EVERYONE`], or nobody.
        target: Option<u8>,
        /// Whether it is a recovery.
        recovery: bool,
    },
    /// An enqueuer takes its queue's barrier in share mode.
    Barrier {
        /// The enqueuer.
        enqueuer: u8,
    },
    /// An enqueuer holding the barrier reads the registry again.
    Reread {
        /// The enqueuer.
        enqueuer: u8,
        /// The wake token it names, [`EVERYONE`], or nobody.
        target: Option<u8>,
    },
    /// An enqueuer commits.
    Commit {
        /// The enqueuer.
        enqueuer: u8,
    },
    /// An enqueuer rolls back.
    Rollback {
        /// The enqueuer.
        enqueuer: u8,
    },
    /// A replica sends a round with a presence change (a registration's upsert of its row, or a
    /// park, the round's first statement, runs in this step).
    Send {
        /// The replica.
        replica: u8,
        /// The change.
        change: Change,
        /// The queues it tries (a bit per queue).
        queues: u8,
    },
    /// A replica's tries run (one statement): each succeeds unless an open transaction holds
    /// the queue's barrier.
    Tries {
        /// The replica.
        replica: u8,
        /// The queues whose try succeeded (a bit per queue).
        free: u8,
        /// The queues whose barrier was held (a bit per queue).
        held: u8,
    },
    /// A replica's claim runs (sent in this step when it carries no presence change).
    Claim {
        /// The replica.
        replica: u8,
        /// The queue of the job it took, if any.
        job: Option<u8>,
    },
    /// The answer of a replica's round comes back.
    Answer {
        /// The replica.
        replica: u8,
    },
    /// A replica is done with its job.
    Finish {
        /// The replica.
        replica: u8,
    },
    /// A replica reads the oldest notification of its inbox.
    Receive {
        /// The replica.
        replica: u8,
        /// The notification.
        msg: Msg,
    },
    /// A replica's backup timer fires.
    BackupFires {
        /// The replica.
        replica: u8,
    },
    /// A replica dies.
    Die {
        /// The replica.
        replica: u8,
    },
    /// A dead replica starts again.
    Restart {
        /// The replica.
        replica: u8,
    },
    /// The operator pauses a queue.
    Pause {
        /// The queue.
        queue: u8,
    },
    /// The operator resumes a queue.
    Resume {
        /// The queue.
        queue: u8,
    },
}

/// The name of a wake token: `R1` for replica 1's first incarnation, `R1'` for its second.
fn token_name(token: u8) -> String {
    let (replica, incarnation) = split_token(token);
    format!("R{replica}{}", if incarnation == 0 { "" } else { "'" })
}

/// The wake token of `replica`'s `incarnation`.
fn token(replica: usize, incarnation: usize) -> u8 {
    (replica * INCARNATIONS + incarnation) as u8
}

/// The replica and incarnation of a wake token.
fn split_token(token: u8) -> (usize, usize) {
    let token = usize::from(token);
    (token / INCARNATIONS, token % INCARNATIONS)
}

/// The names of the queues of `queues` (a bit per queue), separated by spaces.
fn queue_list(queues: u8) -> String {
    (0..QUEUES)
        .filter(|q| queues & (1 << q) != 0)
        .map(|q| QUEUE_NAMES[q])
        .collect::<Vec<_>>()
        .join(" ")
}

/// The wake token of the other replica's incarnation of `token`'s (a kind-less wake's
/// [`EVERYONE`] stays as it is).
fn mirrored_token(token: u8) -> u8 {
    if token == EVERYONE {
        return token;
    }
    let (replica, incarnation) = split_token(token);
    self::token(REPLICAS - 1 - replica, incarnation)
}

/// `s` with its two replicas swapped, their rows and wake tokens with them: when both serve the
/// same queues, a state of the same class ([`Scenario::key`]).
fn mirrored(s: &State) -> State {
    let mut m = *s;
    m.replicas.swap(0, 1);
    m.waiting.swap(0, 1);
    for tx in &mut m.txs {
        if let Tx::Open {
            target: Some(t), ..
        } = tx
        {
            *t = mirrored_token(*t);
        }
    }
    for replica in &mut m.replicas {
        for msg in &mut replica.inbox {
            if let Msg::Target { token, .. } = msg {
                *token = mirrored_token(*token);
            }
        }
    }
    m
}

/// A small set of wake tokens, in order.
#[derive(Clone, Copy, Debug, Default)]
struct Tokens {
    /// The tokens, then unused slots.
    slots: [u8; REPLICAS * INCARNATIONS],
    /// How many slots are used.
    len: usize,
}

impl Tokens {
    /// Adds `token`.
    fn push(&mut self, token: u8) {
        self.slots[self.len] = token;
        self.len += 1;
    }

    /// The tokens.
    fn as_slice(&self) -> &[u8] {
        &self.slots[..self.len]
    }

    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Appends `$value`, which fits in `$bits` bits, to the key `$key` (a macro: a function call per
/// field is slow in a debug build).
macro_rules! push {
    ($key:ident, $value:expr, $bits:expr) => {{
        let value = $value as u128;
        assert!(value < 1 << $bits, "{value} does not fit in {} bits", $bits);
        $key = ($key << $bits) | value;
    }};
}

impl State {
    /// Enqueuer `e`'s job, transaction and recovery flag packed into 8 bits: its part of the key,
    /// and the order [`Scenario::key`] sorts the enqueuers of a queue by.
    fn enqueuer_code(&self, e: usize) -> u8 {
        let tx = match self.txs[e] {
            Tx::Idle => 0,
            Tx::Skipped => 1,
            Tx::Barred => 2,
            Tx::Ended => 3,
            Tx::Open { target, barrier } => {
                let target = match target {
                    Some(t) => t + 1,
                    None => 0,
                };
                4 + 2 * target + barrier as u8
            }
        };
        (self.jobs[e] as u8) << 5 | tx << 1 | self.kindless[e] as u8
    }

    /// The state packed into bit fields, its enqueuers' codes ([`State::enqueuer_code`]) given
    /// as `enqueuers`: the visited set's key (injective: 124 of its 128 bits hold the state, and
    /// the top bit is set).
    fn key(&self, enqueuers: [u8; ENQUEUERS]) -> u128 {
        let mut key: u128 = 0;
        push!(key, enqueuers[0], 8);
        push!(key, enqueuers[1], 8);
        push!(key, enqueuers[2], 8);
        let mut r = 0;
        while r < REPLICAS {
            let replica = &self.replicas[r];
            push!(key, self.waiting[r][0], 1);
            push!(key, self.waiting[r][1], 1);
            push!(key, replica.alive, 1);
            push!(key, replica.incarnation, 1);
            push!(key, replica.presence, 2);
            push!(key, replica.wake, 1);
            push!(key, replica.settle[0], 2);
            push!(key, replica.settle[1], 2);
            push!(key, replica.backup, 1);
            push!(key, replica.backlog, 1);
            push!(key, replica.round, 3);
            let holding = match replica.holding {
                Some(q) => q + 1,
                None => 0,
            };
            push!(key, holding, 2);
            push!(key, replica.unread, 3);
            let mut i = 0;
            while i < INBOX {
                let msg = match replica.inbox[i] {
                    Msg::Empty => 0,
                    Msg::Broadcast { queue } => 1 + queue,
                    Msg::Target {
                        token,
                        queue,
                        cannot_act,
                    } => 3 + (token * 2 + queue) * 2 + cannot_act as u8,
                };
                push!(key, msg, 5);
                i += 1;
            }
            r += 1;
        }
        push!(key, self.paused[0], 1);
        push!(key, self.paused[1], 1);
        push!(key, self.operator, 2);
        push!(key, self.deaths, 2);
        push!(key, self.restarts, 2);
        // Never 0 (the visited set's free slot).
        key | 1 << 127
    }
}

/// A scenario: a design, its bounds, and who serves and enqueues what.
#[derive(Clone, Copy, Debug)]
struct Scenario {
    /// The scenario's name, for the report.
    name: &'static str,
    /// The protocol.
    design: Design,
    /// The queues each replica serves.
    serves: [[bool; QUEUES]; REPLICAS],
    /// The queue each enqueuer enqueues into (at most [`ENQUEUERS`]).
    enqueues: &'static [usize],
    /// How many deaths the run may have.
    deaths: u8,
    /// How many restarts the run may have.
    restarts: u8,
    /// The queue the operator may pause once and resume once, if any.
    pause: Option<usize>,
    /// Whether the job of a replica that dies holding one is recovered: given back by a
    /// transaction of its own that wakes kind-less; else it stays claimed and is not modelled
    /// further.
    recovery: bool,
    /// Whether the replicas start registered, their rows waiting and their presence `Waiting`
    /// (as after their registration, tries and claim in an empty database); else they start
    /// `Joining`, their rows absent.
    start_waiting: bool,
    /// Whether a round's answer comes back in a step of its own after its claim ran; else in the
    /// claim's step.
    claims_in_flight: bool,
}

/// A reachable state that breaks a property, and how it is reached.
#[derive(Debug)]
struct Counterexample {
    /// What is broken.
    what: String,
    /// The steps from the initial state, described.
    trace: Vec<String>,
    /// The state that breaks the property.
    state: State,
}

impl std::fmt::Display for Counterexample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}", self.what)?;
        for (i, step) in self.trace.iter().enumerate() {
            writeln!(f, "  {:2}. {step}", i + 1)?;
        }
        write!(f, "  final state: {:?}", self.state)
    }
}

/// What a search found.
#[derive(Debug)]
struct Outcome {
    /// Distinct states reached.
    states: usize,
    /// Transitions taken.
    transitions: usize,
    /// Quiescent states among the reached ones.
    quiescent: usize,
    /// Quiescent states in which some job was claimed: the search got somewhere.
    quiescent_with_work_done: usize,
    /// Steps that property 2 applied to.
    spent_wake_checks: usize,
    /// The shortest trace to a lost wake (property 1), if any.
    lost_wake: Option<Counterexample>,
    /// The shortest trace to a wake spent on a replica that cannot act (property 2), if any.
    spent_wake: Option<Counterexample>,
}

/// A property the search checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Property {
    /// 1: no lost wake.
    LostWake,
    /// 2: no wake spent on a replica that cannot act.
    SpentWake,
}

impl Scenario {
    /// The queue of enqueuer `e`.
    fn queue_of(&self, e: usize) -> usize {
        self.enqueues[e]
    }

    /// The initial state: every replica alive, `Joining` with its row absent (or `Waiting` with
    /// its row waiting, see [`Scenario::start_waiting`]), owing nothing; nothing enqueued,
    /// nothing paused.
    fn initial(&self) -> State {
        assert!(self.enqueues.len() <= ENQUEUERS);
        let presence = if self.start_waiting {
            Presence::Waiting
        } else {
            Presence::Joining
        };
        State {
            jobs: [Job::Absent; ENQUEUERS],
            txs: [Tx::Idle; ENQUEUERS],
            kindless: [false; ENQUEUERS],
            waiting: [[self.start_waiting, false]; REPLICAS],
            replicas: [Replica {
                presence,
                ..Replica::started(0)
            }; REPLICAS],
            paused: [false; QUEUES],
            operator: Operator::Idle,
            deaths: 0,
            restarts: 0,
        }
    }

    /// The wake tokens whose rows wait for `queue` and that a trigger may name, read without
    /// locks: none while the queue is paused; under [`Wake::Take`], not the rows another open
    /// transaction locked.
    fn nameable(&self, s: &State, queue: usize) -> Tokens {
        let mut tokens = Tokens::default();
        if s.paused[queue] {
            return tokens;
        }
        for (replica, rows) in s.waiting.iter().enumerate() {
            for (incarnation, &waiting) in rows.iter().enumerate() {
                let t = token(replica, incarnation);
                if waiting
                    && self.serves[replica][queue]
                    && !(self.design.wake == Wake::Take && Self::row_locked(s, t))
                {
                    tokens.push(t);
                }
            }
        }
        tokens
    }

    /// Whom the trigger of enqueuer `e` wakes, by a read of `s`, one choice per successor:
    /// each nameable token (any one: all are explored), or for a kind-less wake [`EVERYONE`]
    /// when some row waits; none when nobody may act.
    fn targets(&self, s: &State, e: usize) -> Vec<u8> {
        let tokens = self.nameable(s, self.queue_of(e));
        if s.kindless[e] {
            if tokens.is_empty() {
                Vec::new()
            } else {
                vec![EVERYONE]
            }
        } else {
            tokens.as_slice().to_vec()
        }
    }

    /// Under [`Wake::Take`], whether an open transaction holds the lock of `token`'s row.
    fn row_locked(s: &State, token: u8) -> bool {
        s.txs
            .iter()
            .any(|tx| matches!(tx, Tx::Open { target: Some(t), .. } if *t == token))
    }

    /// Whether an open transaction holds `queue`'s barrier in share mode.
    fn barrier_held(&self, s: &State, queue: usize) -> bool {
        (0..self.enqueues.len()).any(|e| {
            self.queue_of(e) == queue
                && matches!(s.txs[e], Tx::Barred | Tx::Open { barrier: true, .. })
        })
    }

    /// Delivers `msg` to the inbox of every live replica that serves its queue (reading a
    /// notification of a queue it does not serve changes nothing, so the others are spared it).
    fn deliver(&self, s: &mut State, msg: Msg) {
        let queue = match msg {
            Msg::Target { queue, .. } | Msg::Broadcast { queue } => usize::from(queue),
            Msg::Empty => return,
        };
        for (r, replica) in s.replicas.iter_mut().enumerate() {
            if replica.alive && self.serves[r][queue] {
                replica.deliver(msg);
            }
        }
    }

    /// Every step the state allows, with the state it leads to.
    fn successors(&self, s: &State, out: &mut Vec<(Action, State)>) {
        for e in 0..self.enqueues.len() {
            self.enqueuer_steps(s, e, out);
        }
        for replica in 0..REPLICAS {
            self.replica_steps(s, replica, out);
        }
        self.operator_steps(s, out);
    }

    /// The steps of enqueuer `e` (or of its job's recovery).
    fn enqueuer_steps(&self, s: &State, e: usize, out: &mut Vec<(Action, State)>) {
        let queue = self.queue_of(e);
        let enqueuer = e as u8;
        let recovery = s.kindless[e];
        match s.txs[e] {
            Tx::Idle => {
                if s.jobs[e] != Job::Absent {
                    return;
                }
                let targets = self.targets(s, e);
                for &t in &targets {
                    let mut n = *s;
                    n.jobs[e] = Job::Uncommitted;
                    n.txs[e] = Tx::Open {
                        target: Some(t),
                        barrier: false,
                    };
                    out.push((
                        Action::Read {
                            enqueuer,
                            target: Some(t),
                            recovery,
                        },
                        n,
                    ));
                }
                if targets.is_empty() {
                    let mut n = *s;
                    n.jobs[e] = Job::Uncommitted;
                    n.txs[e] = match self.design.wake {
                        Wake::Take | Wake::NoBarrier => Tx::Open {
                            target: None,
                            barrier: false,
                        },
                        Wake::ReadThenBarrier | Wake::BarrierThenReread => Tx::Skipped,
                    };
                    out.push((
                        Action::Read {
                            enqueuer,
                            target: None,
                            recovery,
                        },
                        n,
                    ));
                }
            }
            Tx::Skipped => {
                let mut n = *s;
                n.txs[e] = if self.design.wake == Wake::ReadThenBarrier {
                    Tx::Open {
                        target: None,
                        barrier: true,
                    }
                } else {
                    Tx::Barred
                };
                out.push((Action::Barrier { enqueuer }, n));
            }
            Tx::Barred => {
                let targets = self.targets(s, e);
                let choices: Vec<Option<u8>> = if targets.is_empty() {
                    vec![None]
                } else {
                    targets.into_iter().map(Some).collect()
                };
                for target in choices {
                    let mut n = *s;
                    n.txs[e] = Tx::Open {
                        target,
                        barrier: true,
                    };
                    out.push((Action::Reread { enqueuer, target }, n));
                }
            }
            Tx::Open { target, .. } => {
                let mut n = *s;
                n.jobs[e] = Job::Committed;
                n.txs[e] = Tx::Ended;
                n.kindless[e] = false;
                match target {
                    Some(EVERYONE) => self.deliver(&mut n, Msg::Broadcast { queue: queue as u8 }),
                    Some(t) => {
                        let (replica, incarnation) = split_token(t);
                        let named = &s.replicas[replica];
                        let can_act = named.alive
                            && usize::from(named.incarnation) == incarnation
                            && named.holding.is_none();
                        if self.design.wake == Wake::Take {
                            // The take's UPDATE of the row commits with the job.
                            n.waiting[replica][incarnation] = false;
                        }
                        self.deliver(
                            &mut n,
                            Msg::Target {
                                token: t,
                                queue: queue as u8,
                                cannot_act: !can_act,
                            },
                        );
                    }
                    None => {}
                }
                out.push((Action::Commit { enqueuer }, n));
                // A recovery that fails is run again later: the same as committing later.
                if !recovery {
                    let mut n = *s;
                    n.jobs[e] = Job::Gone;
                    n.txs[e] = Tx::Ended;
                    out.push((Action::Rollback { enqueuer }, n));
                }
            }
            Tx::Ended => {}
        }
    }

    /// The answer of replica `r`'s round, in `n` (`parked`: the round parked its row first), as
    /// `Presence::after` takes it: a park makes it `Busy`, owing nothing; a registration's
    /// answer makes it `Waiting`; each try that succeeded settles its queue unless the queue
    /// opened again after the try was sent; then a `Busy` replica whose claim came back short
    /// becomes `Joining` (it registers at once). A claim that came back full (it took a job)
    /// leaves a backlog: the next claim parks the row.
    fn answer(&self, n: &mut State, r: usize, parked: bool) {
        let row = n.waiting[r][usize::from(n.replicas[r].incarnation)];
        let me = &mut n.replicas[r];
        let full = me.holding.is_some();
        me.round = Round::Idle;
        me.backlog = full;
        if parked {
            me.presence = Presence::Busy;
            me.settle = [Settle::Done; QUEUES];
        } else {
            // Its row is waiting unless a take parked it (which it then registers again for).
            if me.presence == Presence::Joining && row {
                me.presence = Presence::Waiting;
            }
            for settle in &mut me.settle {
                *settle = match *settle {
                    Settle::Sent => Settle::Done,
                    Settle::Reopened => Settle::Owed,
                    other => other,
                };
            }
        }
        if me.presence == Presence::Busy && !full {
            me.presence = Presence::Joining;
        }
    }

    /// The claim of replica `r`'s round runs in `s` (`parked`: the round parked its row first):
    /// it takes a committed job of a served, unpaused queue (any queue that has one: all are
    /// explored), or nothing.
    fn claim_steps(&self, s: &State, r: usize, parked: bool, out: &mut Vec<(Action, State)>) {
        let replica = r as u8;
        let ran = |n: &mut State| match (self.claims_in_flight, parked) {
            (true, false) => n.replicas[r].round = Round::Answer,
            (true, true) => n.replicas[r].round = Round::ParkAnswer,
            (false, parked) => self.answer(n, r, parked),
        };
        let mut took = false;
        for queue in (0..QUEUES).filter(|&q| self.serves[r][q] && !s.paused[q]) {
            // The jobs of one queue are interchangeable: take the first.
            let job = (0..self.enqueues.len())
                .find(|&e| self.queue_of(e) == queue && s.jobs[e] == Job::Committed);
            if let Some(e) = job {
                took = true;
                let mut n = *s;
                n.jobs[e] = Job::Claimed;
                n.replicas[r].holding = Some(queue as u8);
                ran(&mut n);
                out.push((
                    Action::Claim {
                        replica,
                        job: Some(queue as u8),
                    },
                    n,
                ));
            }
        }
        if !took {
            let mut n = *s;
            ran(&mut n);
            out.push((Action::Claim { replica, job: None }, n));
        }
    }

    /// The rounds replica `r`, free and with no round in flight, may send (`Presence::ticket`):
    /// while `Busy`, when a claim is owed, a claim alone; after a claim that came back full, a
    /// park and a claim; while `Joining`, a registration; while `Waiting`, when a claim is owed,
    /// the owed tries and a claim, or a claim alone; else a retry of the owed tries alone. A
    /// claim alone is sent and runs in one step. Sending clears its owed claim and its backup
    /// (a retry alone keeps the backup, unless [`Design::retry_clears_backup`]).
    fn send_steps(&self, s: &State, r: usize, out: &mut Vec<(Action, State)>) {
        let me = s.replicas[r];
        let replica = r as u8;
        let incarnation = usize::from(me.incarnation);
        let owed = me.queues_in(Settle::Owed);
        let mut n = *s;
        n.replicas[r].wake = false;
        n.replicas[r].backup = false;
        let (change, queues) = if me.presence == Presence::Busy {
            if me.wake {
                self.claim_steps(&n, r, false, out);
            }
            return;
        } else if me.backlog {
            // Under the take, parking a row an enqueuer locked waits for that enqueuer's end.
            if self.design.wake == Wake::Take && Self::row_locked(s, token(r, incarnation)) {
                return;
            }
            n.waiting[r][incarnation] = false;
            (Change::Park, 0)
        } else if me.presence == Presence::Joining {
            n.waiting[r][incarnation] = true;
            let served = (0..QUEUES)
                .filter(|&q| self.serves[r][q])
                .fold(0, |queues, q| queues | 1 << q);
            (Change::Register, served)
        } else if me.wake && owed != 0 {
            (Change::Settle, owed)
        } else if me.wake {
            return self.claim_steps(&n, r, false, out);
        } else if owed != 0 {
            n.replicas[r].backup = me.backup && !self.design.retry_clears_backup;
            (Change::Retry, owed)
        } else {
            return;
        };
        for q in (0..QUEUES).filter(|q| queues & (1 << q) != 0) {
            n.replicas[r].settle[q] = Settle::Sent;
        }
        n.replicas[r].round = match change {
            Change::Park => Round::ParkClaim,
            Change::Retry => Round::Retry,
            Change::Register | Change::Settle => Round::Tries,
        };
        out.push((
            Action::Send {
                replica,
                change,
                queues,
            },
            n,
        ));
    }

    /// The steps of replica `r`.
    fn replica_steps(&self, s: &State, r: usize, out: &mut Vec<(Action, State)>) {
        let me = s.replicas[r];
        let replica = r as u8;
        if !me.alive {
            if s.restarts < self.restarts && usize::from(me.incarnation) + 1 < INCARNATIONS {
                let mut n = *s;
                n.replicas[r] = Replica::started(me.incarnation + 1);
                n.restarts += 1;
                out.push((Action::Restart { replica }, n));
            }
            return;
        }
        let own = token(r, usize::from(me.incarnation));
        let free = me.holding.is_none();

        match me.round {
            Round::Idle if free => self.send_steps(s, r, out),
            Round::Idle => {
                let mut n = *s;
                n.replicas[r].holding = None;
                n.replicas[r].wake = true;
                out.push((Action::Finish { replica }, n));
            }
            Round::Tries | Round::Retry => {
                let mut n = *s;
                let (mut free, mut held) = (0, 0);
                for q in 0..QUEUES {
                    if matches!(me.settle[q], Settle::Sent | Settle::Reopened) {
                        if self.barrier_held(s, q) {
                            held |= 1 << q;
                            n.replicas[r].settle[q] = Settle::Owed;
                        } else {
                            free |= 1 << q;
                        }
                    }
                }
                if me.round == Round::Tries || free != 0 {
                    n.replicas[r].round = Round::Claim;
                } else if self.claims_in_flight {
                    n.replicas[r].round = Round::Answer;
                } else {
                    self.answer(&mut n, r, false);
                }
                out.push((
                    Action::Tries {
                        replica,
                        free,
                        held,
                    },
                    n,
                ));
            }
            Round::Claim => self.claim_steps(s, r, false, out),
            Round::ParkClaim => self.claim_steps(s, r, true, out),
            Round::Answer | Round::ParkAnswer => {
                let mut n = *s;
                self.answer(&mut n, r, me.round == Round::ParkAnswer);
                out.push((Action::Answer { replica }, n));
            }
        }

        if me.unread > 0 {
            let mut n = *s;
            let msg = n.replicas[r].take();
            let it = &mut n.replicas[r];
            match msg {
                Msg::Target { token, queue, .. } if self.serves[r][usize::from(queue)] => {
                    if token == own {
                        it.wake = true;
                        if self.design.wake == Wake::Take && it.presence != Presence::Busy {
                            // A wake of its own token: the take parked its row.
                            it.presence = Presence::Joining;
                            it.settle = [Settle::Done; QUEUES];
                        }
                    } else if self.design.backups.admits(it.presence) {
                        it.backup = true;
                    }
                }
                Msg::Broadcast { queue } if self.serves[r][usize::from(queue)] => {
                    it.wake = true;
                    if self.design.opened.admits(it.presence) {
                        let q = usize::from(queue);
                        it.settle[q] = match it.settle[q] {
                            Settle::Done | Settle::Owed => Settle::Owed,
                            Settle::Sent if self.design.stale_tries_settle => Settle::Sent,
                            Settle::Sent | Settle::Reopened => Settle::Reopened,
                        };
                    }
                }
                _ => {}
            }
            out.push((Action::Receive { replica, msg }, n));
        }

        if me.backup {
            let mut n = *s;
            n.replicas[r].backup = false;
            n.replicas[r].wake = true;
            out.push((Action::BackupFires { replica }, n));
        }

        if s.deaths < self.deaths {
            let mut n = *s;
            n.deaths += 1;
            n.replicas[r] = Replica {
                alive: false,
                ..Replica::started(me.incarnation)
            };
            if let (Some(queue), true) = (me.holding, self.recovery) {
                // Its job waits for its recovery, a transaction of its own.
                let queue = usize::from(queue);
                let given_back = (0..self.enqueues.len())
                    .find(|&e| self.queue_of(e) == queue && s.jobs[e] == Job::Claimed);
                if let Some(e) = given_back {
                    n.jobs[e] = Job::Absent;
                    n.txs[e] = Tx::Idle;
                    n.kindless[e] = true;
                }
            }
            out.push((Action::Die { replica }, n));
        }
    }

    /// The operator's steps.
    fn operator_steps(&self, s: &State, out: &mut Vec<(Action, State)>) {
        let Some(queue) = self.pause else {
            return;
        };
        let mut n = *s;
        match s.operator {
            Operator::Idle => {
                n.paused[queue] = true;
                n.operator = Operator::Paused;
                out.push((Action::Pause { queue: queue as u8 }, n));
            }
            Operator::Paused => {
                n.paused[queue] = false;
                n.operator = Operator::Done;
                self.deliver(&mut n, Msg::Broadcast { queue: queue as u8 });
                out.push((Action::Resume { queue: queue as u8 }, n));
            }
            Operator::Done => {}
        }
    }

    /// Whether `s` is quiescent: no enqueue transaction open and no recovery to run, and no live
    /// replica may send, try, claim, take an answer, receive or fire its backup.
    fn quiescent(&self, s: &State) -> bool {
        let open = (0..ENQUEUERS).any(|e| match s.txs[e] {
            Tx::Idle => s.kindless[e],
            Tx::Ended => false,
            _ => true,
        });
        !open
            && s.replicas.iter().all(|me| {
                !me.alive
                    || !(me.round != Round::Idle
                        || me.unread > 0
                        || me.backup
                        || (me.holding.is_none()
                            && (me.wake
                                || me.backlog
                                || me.presence != Presence::Waiting
                                || me.settle.iter().any(|&s| s != Settle::Done))))
            })
    }

    /// A live replica with no job that serves `queue`, if any.
    fn idle_server(&self, s: &State, queue: usize) -> Option<usize> {
        (0..REPLICAS).find(|&r| {
            let me = &s.replicas[r];
            me.alive && me.holding.is_none() && self.serves[r][queue]
        })
    }

    /// Property 1 in quiescent state `s`: a committed, unclaimed job of an unpaused queue that a
    /// live replica with no job serves.
    fn lost_wake(&self, s: &State) -> Option<String> {
        (0..self.enqueues.len()).find_map(|e| {
            let queue = self.queue_of(e);
            if s.jobs[e] != Job::Committed || s.paused[queue] {
                return None;
            }
            self.idle_server(s, queue).map(|r| {
                format!(
                    "lost wake: E{e}'s job of queue {} is committed and unclaimed, replica R{r} \
                     serves {} and holds no job, and nothing is left to wake anyone",
                    QUEUE_NAMES[queue], QUEUE_NAMES[queue]
                )
            })
        })
    }

    /// The queues with a wake, named for a replica that could not act, still unread by some
    /// live replica (a bit per queue).
    fn spent_wakes_unread(s: &State) -> u8 {
        let mut queues = 0;
        for me in s.replicas.iter().filter(|r| r.alive) {
            for msg in me.unread() {
                if let Msg::Target {
                    queue,
                    cannot_act: true,
                    ..
                } = msg
                {
                    queues |= 1 << queue;
                }
            }
        }
        queues
    }

    /// Whether live replica `r` (holding no job) owes a claim that will see `queue`'s jobs: a
    /// claim owed, a backup, a try of the queue owed or in flight, a round whose claim has not
    /// run, a registration or a short claim to come (not `Waiting`, or its row parked), or an
    /// unread notification of the queue.
    fn owes_claim(&self, s: &State, r: usize, queue: usize) -> bool {
        let me = &s.replicas[r];
        me.wake
            || me.backup
            || me.backlog
            || me.settle[queue] != Settle::Done
            || matches!(
                me.round,
                Round::Tries | Round::Retry | Round::Claim | Round::ParkClaim
            )
            || me.presence != Presence::Waiting
            || !s.waiting[r][usize::from(me.incarnation)]
            || me.unread().iter().any(|msg| match *msg {
                Msg::Broadcast { queue: q } | Msg::Target { queue: q, .. } => {
                    usize::from(q) == queue
                }
                Msg::Empty => false,
            })
    }

    /// Property 2 on the step `action` from `s` to `n` (`unread`: the queues of `s`'s unread
    /// wakes named for replicas that could not act, [`Scenario::spent_wakes_unread`]); counts in
    /// `checks` the steps it applies to.
    fn spent_wake(
        &self,
        (s, unread): (&State, u8),
        action: &Action,
        n: &State,
        checks: &mut usize,
    ) -> Option<String> {
        // Both apply only to a step that reads such a wake.
        if unread == 0 {
            return None;
        }
        // (a) A replica with no job whose row waits for the queue backs the wake up.
        if let Action::Receive {
            replica,
            msg:
                Msg::Target {
                    token,
                    queue,
                    cannot_act: true,
                },
        } = *action
        {
            let r = usize::from(replica);
            let me = &s.replicas[r];
            let queue = usize::from(queue);
            let applies = token != self::token(r, usize::from(me.incarnation))
                && me.holding.is_none()
                && self.serves[r][queue]
                && s.waiting[r][usize::from(me.incarnation)];
            *checks += usize::from(applies);
            if applies && !n.replicas[r].backup && !n.replicas[r].wake {
                return Some(format!(
                    "spent wake: R{r} waits for {} and read a wake named for {}, who could not \
                     act, and armed no backup",
                    QUEUE_NAMES[queue],
                    token_name(token)
                ));
            }
        }
        // (b) Once every live replica read the queue's wakes named for replicas that could not
        // act, some replica that may act owes a claim, if a job of the queue is claimable and a
        // live replica with no job waits for the queue.
        let read_by_all = unread & !Self::spent_wakes_unread(n);
        for queue in (0..QUEUES).filter(|q| read_by_all & (1 << q) != 0) {
            let claimable = !n.paused[queue]
                && (0..self.enqueues.len())
                    .any(|e| self.queue_of(e) == queue && n.jobs[e] == Job::Committed);
            let could_act = (0..REPLICAS).any(|r| {
                let me = &n.replicas[r];
                me.alive
                    && me.holding.is_none()
                    && self.serves[r][queue]
                    && n.waiting[r][usize::from(me.incarnation)]
            });
            let owed = (0..REPLICAS).any(|r| {
                let me = &n.replicas[r];
                me.alive
                    && me.holding.is_none()
                    && self.serves[r][queue]
                    && self.owes_claim(n, r, queue)
            });
            *checks += usize::from(claimable && could_act);
            if claimable && could_act && !owed {
                return Some(format!(
                    "spent wake: every live replica read the wakes of {} named for replicas that \
                     could not act, a job of {} is claimable, a replica with no job waits for \
                     it, and nobody owes a claim",
                    QUEUE_NAMES[queue], QUEUE_NAMES[queue]
                ));
            }
        }
        None
    }

    /// `action` in words.
    fn describe(&self, action: &Action) -> String {
        let enq = |e: u8| format!("E{e}({})", QUEUE_NAMES[self.queue_of(usize::from(e))]);
        let named = |target: Option<u8>| match target {
            Some(EVERYONE) => "finds a row waiting ('q' at its commit)".to_owned(),
            Some(t) => format!("names {}", token_name(t)),
            None => "finds nobody".to_owned(),
        };
        match *action {
            Action::Read {
                enqueuer,
                target,
                recovery,
            } => {
                let tail = match (target, self.design.wake) {
                    (Some(EVERYONE), _) => "",
                    (Some(_), Wake::Take) => ", locking that row",
                    (Some(_), _) => "",
                    (None, Wake::Take) => " unlocked, notifies nobody",
                    (None, Wake::NoBarrier) => ", notifies nobody",
                    (None, _) => ", barrier not taken yet",
                };
                let head = if recovery {
                    "'s recovery gives its job back"
                } else {
                    " inserts its job"
                };
                format!(
                    "{}{head}; trigger reads the registry: {}{tail}",
                    enq(enqueuer),
                    named(target)
                )
            }
            Action::Barrier { enqueuer } => {
                format!("{} takes the barrier (share)", enq(enqueuer))
            }
            Action::Reread { enqueuer, target } => format!(
                "{} reads the registry again: {}",
                enq(enqueuer),
                named(target)
            ),
            Action::Commit { enqueuer } => format!("{} commits", enq(enqueuer)),
            Action::Rollback { enqueuer } => format!("{} rolls back", enq(enqueuer)),
            Action::Send {
                replica,
                change,
                queues,
            } => {
                let queues = queue_list(queues);
                match change {
                    Change::Register => format!(
                        "R{replica} registers (row waiting) and sends its tries of {queues}, then \
                         a claim"
                    ),
                    Change::Settle => {
                        format!("R{replica} sends its tries of {queues}, then a claim")
                    }
                    Change::Retry => {
                        format!("R{replica} sends its tries of {queues} again, alone")
                    }
                    Change::Park => format!("R{replica} parks its row, then claims"),
                }
            }
            Action::Tries {
                replica,
                free,
                held,
            } => {
                let mut results = Vec::new();
                if free != 0 {
                    results.push(format!("{} free", queue_list(free)));
                }
                if held != 0 {
                    results.push(format!("{} held", queue_list(held)));
                }
                format!("R{replica}'s tries: {}", results.join(", "))
            }
            Action::Claim { replica, job } => match job {
                Some(q) => format!(
                    "R{replica} claims a job of {} (full)",
                    QUEUE_NAMES[usize::from(q)]
                ),
                None => format!("R{replica} claims: nothing"),
            },
            Action::Answer { replica } => format!("R{replica} gets its claim's answer"),
            Action::Finish { replica } => format!("R{replica} finishes its job"),
            Action::Receive { replica, msg } => {
                let text = match msg {
                    Msg::Target { token, queue, .. } => format!(
                        "'t {} {}'",
                        token_name(token),
                        QUEUE_NAMES[usize::from(queue)]
                    ),
                    Msg::Broadcast { queue } => format!("'q {}'", QUEUE_NAMES[usize::from(queue)]),
                    Msg::Empty => "nothing".to_owned(),
                };
                format!("R{replica} reads {text}")
            }
            Action::BackupFires { replica } => format!("R{replica}'s backup fires"),
            Action::Die { replica } => format!("R{replica} dies"),
            Action::Restart { replica } => format!("R{replica} restarts"),
            Action::Pause { queue } => format!("pause {}", QUEUE_NAMES[usize::from(queue)]),
            Action::Resume { queue } => {
                format!("resume {} (sends 'q')", QUEUE_NAMES[usize::from(queue)])
            }
        }
    }

    /// The visited set's key of `s`'s class. The enqueuers of one queue are interchangeable (a
    /// job is named by its queue only), so the key sorts each queue's enqueuers' codes
    /// ([`State::enqueuer_code`]); when both replicas serve the same queues they are
    /// interchangeable too (with their wake tokens), so the key is the smaller of `s`'s and its
    /// mirror's ([`mirrored`]).
    fn key(&self, s: &State) -> u128 {
        // A sorting network of each queue's enqueuers (unused ones are never swapped).
        let same =
            |i: usize, j: usize| j < self.enqueues.len() && self.enqueues[i] == self.enqueues[j];
        let (same01, same02, same12) = (same(0, 1), same(0, 2), same(1, 2));
        let key = |s: &State| {
            let mut codes = [s.enqueuer_code(0), s.enqueuer_code(1), s.enqueuer_code(2)];
            if same01 && codes[1] < codes[0] {
                codes.swap(0, 1);
            }
            if same02 && codes[2] < codes[0] {
                codes.swap(0, 2);
            }
            if same12 && codes[2] < codes[1] {
                codes.swap(1, 2);
            }
            s.key(codes)
        };
        if self.serves[0] == self.serves[1] {
            key(s).min(key(&mirrored(s)))
        } else {
            key(s)
        }
    }

    /// The counterexample `steps` (from the initial state) reach, `state` breaking `what`.
    fn counterexample(&self, what: String, steps: &[Action], state: State) -> Counterexample {
        Counterexample {
            what,
            trace: steps.iter().map(|step| self.describe(step)).collect(),
            state,
        }
    }

    /// Searches every interleaving breadth first, one state per class of states equal up to
    /// renaming the enqueuers of a queue (the first reached: the path to it is a run, so its
    /// trace names each enqueuer consistently), so the counterexamples it reports are shortest.
    /// With `stop`, it stops at the first counterexample of that property whose trace has every
    /// one of those steps in that order (each step given by words it contains), and reports that
    /// one only.
    fn check(&self, stop: Option<(Property, &[&str])>) -> Outcome {
        let initial = self.initial();
        let mut visited = Visited::new();
        let mut parents: Vec<Option<(u32, Action)>> = vec![None];
        let mut frontier = VecDeque::from([(initial, 0_u32)]);
        visited.insert(self.key(&initial));
        let mut outcome = Outcome {
            states: 0,
            transitions: 0,
            quiescent: 0,
            quiescent_with_work_done: 0,
            spent_wake_checks: 0,
            lost_wake: None,
            spent_wake: None,
        };
        let path = |parents: &[Option<(u32, Action)>], mut at: u32, last: Option<Action>| {
            let mut steps: Vec<Action> = last.into_iter().collect();
            while let Some((parent, action)) = parents[at as usize] {
                steps.push(action);
                at = parent;
            }
            steps.reverse();
            steps
        };
        // Whether to keep `found` (of `property`), and whether to stop the search there: the
        // first of each property is kept, unless the search looks for another of it.
        let keep = |property: Property, found: &Counterexample| match stop {
            None => (true, false),
            Some((wanted, _)) if wanted != property => (true, false),
            Some((_, steps)) => {
                let mut trace = found.trace.iter();
                let matches = steps
                    .iter()
                    .all(|words| trace.any(|step| step.contains(words)));
                (matches, matches)
            }
        };
        let mut next = Vec::new();
        'search: while let Some((s, at)) = frontier.pop_front() {
            outcome.states += 1;
            if self.quiescent(&s) {
                outcome.quiescent += 1;
                if s.jobs.contains(&Job::Claimed) {
                    outcome.quiescent_with_work_done += 1;
                }
                if let (None, Some(what)) = (&outcome.lost_wake, self.lost_wake(&s)) {
                    let found = self.counterexample(what, &path(&parents, at, None), s);
                    let (kept, done) = keep(Property::LostWake, &found);
                    if kept {
                        outcome.lost_wake = Some(found);
                    }
                    if done {
                        break 'search;
                    }
                }
            }
            next.clear();
            self.successors(&s, &mut next);
            let unread = Self::spent_wakes_unread(&s);
            for &(action, n) in &next {
                outcome.transitions += 1;
                let found =
                    self.spent_wake((&s, unread), &action, &n, &mut outcome.spent_wake_checks);
                if let (Some(what), None) = (found, &outcome.spent_wake) {
                    let found = self.counterexample(what, &path(&parents, at, Some(action)), n);
                    let (kept, done) = keep(Property::SpentWake, &found);
                    if kept {
                        outcome.spent_wake = Some(found);
                    }
                    if done {
                        break 'search;
                    }
                }
                if visited.insert(self.key(&n)) {
                    let Ok(id) = u32::try_from(parents.len()) else {
                        panic!("{}: more than 2^32 states", self.name);
                    };
                    parents.push(Some((at, action)));
                    frontier.push_back((n, id));
                }
            }
        }
        println!(
            "{} ({}): {} states, {} transitions, {} quiescent ({} after some claim), {} \
             property-2 checks",
            self.name,
            self.design.name,
            outcome.states,
            outcome.transitions,
            outcome.quiescent,
            outcome.quiescent_with_work_done,
            outcome.spent_wake_checks
        );
        for found in [&outcome.lost_wake, &outcome.spent_wake]
            .into_iter()
            .flatten()
        {
            println!("{found}");
        }
        outcome
    }

    /// Checks the whole state space and asserts that both properties hold in it, that it has at
    /// least `min_states` states, and that the search got somewhere: quiescent states after
    /// claims, and (with a death or full replicas) wakes named for replicas that could not act.
    fn assert_holds(&self, min_states: usize) -> Outcome {
        let outcome = self.check(None);
        if let Some(found) = outcome.lost_wake.as_ref().or(outcome.spent_wake.as_ref()) {
            panic!("{}: {found}", self.name);
        }
        assert!(
            outcome.states >= min_states,
            "{}: only {} states, fewer than {min_states}: the model is vacuous",
            self.name,
            outcome.states
        );
        assert!(
            outcome.quiescent_with_work_done > 0,
            "{}: no quiescent state after a claim",
            self.name
        );
        assert!(
            outcome.spent_wake_checks > 0,
            "{}: no wake named for a replica that could not act reached another",
            self.name
        );
        outcome
    }

    /// Searches until the first lost wake whose trace has every one of `steps`, in that order
    /// (each step given by words it contains), and returns the search's outcome: there must
    /// be one.
    fn assert_loses_a_wake(&self, steps: &[&str]) -> Outcome {
        let outcome = self.check(Some((Property::LostWake, steps)));
        assert!(
            outcome.lost_wake.is_some(),
            "{}: the checker found no lost wake through {steps:?} in {} states",
            self.name,
            outcome.states
        );
        outcome
    }

    /// Searches until the first wake spent on a replica that cannot act (property 2) whose
    /// trace has every one of `steps`, in that order, and returns the search's outcome: there
    /// must be one.
    fn assert_spends_a_wake(&self, steps: &[&str]) -> Outcome {
        let outcome = self.check(Some((Property::SpentWake, steps)));
        assert!(
            outcome.spent_wake.is_some(),
            "{}: the checker found no spent wake through {steps:?} in {} states",
            self.name,
            outcome.states
        );
        outcome
    }
}

/// The bounds every scenario starts from: the shipped protocol, split queues, no job, no death,
/// no restart, no pause, replicas that start `Joining` and answers that come back with their
/// claims.
const BASE: Scenario = Scenario {
    name: "",
    design: SHIPPED,
    serves: SPLIT,
    enqueues: &[],
    deaths: 0,
    restarts: 0,
    pause: None,
    recovery: false,
    start_waiting: false,
    claims_in_flight: false,
};

/// Split queues (replica 0 serves `a`, replica 1 serves `a` and `b`), a job of each queue, a
/// death and a restart.
const SPLIT_DEATH: Scenario = Scenario {
    name: "split queues, jobs a b, a death and a restart",
    enqueues: &[A, B],
    deaths: 1,
    restarts: 1,
    ..BASE
};

/// Both replicas serve `a`; three jobs of `a`: more jobs than replicas, so named replicas fill
/// up before their wakes arrive.
const SHARED_THREE: Scenario = Scenario {
    name: "both serve a, jobs a a a",
    serves: SAME,
    enqueues: &[A, A, A],
    ..BASE
};

/// Both replicas serve `a`; two jobs of `a`; a death and a restart.
const SHARED_DEATH: Scenario = Scenario {
    name: "both serve a, jobs a a, a death and a restart",
    serves: SAME,
    enqueues: &[A, A],
    deaths: 1,
    restarts: 1,
    ..BASE
};

/// Split queues; two jobs of `a`; a pause and a resume of `a`; a death.
const SPLIT_PAUSE: Scenario = Scenario {
    name: "split queues, jobs a a, pause and resume a, a death",
    enqueues: &[A, A],
    deaths: 1,
    pause: Some(A),
    ..BASE
};

/// Both replicas serve `a`; two jobs of `a`; a death whose job is recovered, and a restart.
const SHARED_RECOVERY: Scenario = Scenario {
    name: "both serve a, jobs a a, a death whose job is recovered, a restart",
    serves: SAME,
    enqueues: &[A, A],
    deaths: 1,
    restarts: 1,
    recovery: true,
    ..BASE
};

/// Both replicas serve `a`; two jobs of `a`; a death; answers that come back after their
/// claims ran.
const SHARED_IN_FLIGHT: Scenario = Scenario {
    name: "both serve a, jobs a a, a death, claims in flight",
    serves: SAME,
    enqueues: &[A, A],
    deaths: 1,
    claims_in_flight: true,
    ..BASE
};

/// Both replicas serve `a`; a job of `a`; a pause and a resume of `a`; a death and a restart;
/// answers that come back after their claims ran.
const SHARED_PAUSE_IN_FLIGHT: Scenario = Scenario {
    name: "both serve a, a job of a, pause and resume a, a death and a restart, claims in flight",
    serves: SAME,
    enqueues: &[A],
    deaths: 1,
    restarts: 1,
    pause: Some(A),
    claims_in_flight: true,
    ..BASE
};

/// Both replicas serve `a`; two jobs of `a`; a pause and a resume of `a`.
const SHARED_PAUSE: Scenario = Scenario {
    name: "both serve a, jobs a a, pause and resume a",
    serves: SAME,
    enqueues: &[A, A],
    pause: Some(A),
    ..BASE
};

/// Split queues; three jobs (`a`, `a`, `b`); no death.
const SPLIT_THREE: Scenario = Scenario {
    name: "split queues, jobs a a b",
    enqueues: &[A, A, B],
    ..BASE
};

/// `scenario` under `design`.
fn with(design: Design, scenario: Scenario) -> Scenario {
    Scenario { design, ..scenario }
}

/// Split queues: wakes named for a replica that died, for its dead incarnation's stale row, or
/// for a replica that filled up, are backed up.
#[test]
fn v2_loses_no_wake_with_split_queues_a_death_and_a_restart() {
    SPLIT_DEATH.assert_holds(100_000);
}

/// More jobs than replicas: named replicas fill up.
#[test]
fn v2_loses_no_wake_when_jobs_outnumber_the_replicas() {
    SHARED_THREE.assert_holds(100_000);
}

/// Both replicas serving one queue, one of them dying and restarting.
#[test]
fn v2_loses_no_wake_when_both_replicas_serve_one_queue_and_one_dies() {
    SHARED_DEATH.assert_holds(100_000);
}

/// Across a pause and a resume: an enqueue that read the queue paused holds the barrier, and
/// the resume's `q` wake makes every registered replica try it.
#[test]
fn v2_loses_no_wake_across_a_pause_and_resume() {
    SPLIT_PAUSE.assert_holds(100_000);
}

/// A dead replica's job given back by its recovery, whose kind-less wake reads, takes the
/// barrier and reads again as an enqueue's does.
#[test]
fn v2_loses_no_wake_when_a_dead_replicas_job_is_given_back() {
    SHARED_RECOVERY.assert_holds(100_000);
}

/// Answers that come back after their claims ran: wakes heard while a registration's claim is in
/// flight (`Joining`) arm backups.
#[test]
fn v2_loses_no_wake_with_claims_in_flight() {
    SHARED_IN_FLIGHT.assert_holds(100_000);
}

/// A resume heard while a round's claim is in flight, after its try of the queue ran: the queue
/// stays owed past that round's answer.
#[test]
fn v2_loses_no_wake_across_a_pause_and_resume_with_claims_in_flight() {
    SHARED_PAUSE_IN_FLIGHT.assert_holds(100_000);
}

/// The first fix, the second read: without it, `durable_etl_wake` reads the registry (and
/// `paused`), then takes the barrier in a later statement, and a replica can register, try the
/// barrier and claim between the two, or a resume can be heard and its queue settled between
/// them.
#[test]
fn reading_the_registry_then_taking_the_barrier_without_reading_again_loses_a_wake() {
    with(READ_THEN_BARRIER, SPLIT_THREE).assert_loses_a_wake(&[
        "finds nobody, barrier not taken yet",
        "R0 registers",
        "R0's tries: a free",
        "R0 claims: nothing",
        "takes the barrier",
        "commits",
    ]);
    let registered = Scenario {
        start_waiting: true,
        ..SHARED_PAUSE
    };
    with(READ_THEN_BARRIER, registered).assert_loses_a_wake(&[
        "pause a",
        "finds nobody, barrier not taken yet",
        "resume a",
        "R0 reads 'q a'",
        "R0's tries: a free",
        "takes the barrier",
        "commits",
    ]);
}

/// The second fix, backups while `Joining`: a replica that arms backups only while `Waiting`
/// arms none for a wake named for a dead replica that it hears while its registration's claim is
/// in flight, though its row waits and that claim ran before the job's commit. (The shipped
/// protocol on these bounds: `v2_loses_no_wake_with_claims_in_flight`.)
#[test]
fn backups_armed_only_while_waiting_lose_a_wake_heard_while_registering() {
    let outcome = with(BACKUPS_WHILE_WAITING, SHARED_IN_FLIGHT).assert_loses_a_wake(&[
        "names R0",
        "R0 dies",
        "R1 registers",
        "R1 claims: nothing",
        "commits",
        "R1 reads 't R0 a'",
        "R1 gets its claim's answer",
    ]);
    assert!(outcome.spent_wake.is_some(), "property 2 holds");
}

/// The third fix, both halves: a resume heard while a replica registers, after its try of the
/// queue ran and before an enqueue that read the queue paused (and holds its barrier) commits,
/// must leave a try of the queue owed. The wake is lost if the replica records nothing while
/// `Joining`, and lost if it records the queue but the registration's try, sent before the
/// resume, settles it: whether the resume is heard before the registration's claim runs, or
/// after it ran and before its answer. (The shipped protocol on these bounds:
/// `v2_loses_no_wake_across_a_pause_and_resume` and its `_with_claims_in_flight`.)
#[test]
fn a_resume_heard_while_registering_is_lost_unless_recorded_and_kept_owed_past_the_tries_in_flight()
{
    let before_the_claim = [
        "R0 registers",
        "R0's tries: a free",
        "reads the registry again: finds nobody",
        "resume a",
        "R0 reads 'q a'",
        "R0 claims: nothing",
        "commits",
    ];
    let before_the_answer = [
        "R0 registers",
        "R0's tries: a free",
        "R0 claims: nothing",
        "reads the registry again: finds nobody",
        "resume a",
        "R0 reads 'q a'",
        "R0 gets its claim's answer",
        "commits",
    ];
    for design in [OPENED_WHILE_WAITING, STALE_TRIES_SETTLE] {
        with(design, SPLIT_PAUSE).assert_loses_a_wake(&before_the_claim);
        with(design, SHARED_PAUSE_IN_FLIGHT).assert_loses_a_wake(&before_the_answer);
    }
}

/// Found in the first shipped version of this protocol: a retry of a held barrier sent alone
/// (`ClaimReason::Presence`) cleared the backup that a wake named for a full replica armed, as
/// sending any claim does, but claims nothing while that barrier stays held. The job of `a` then
/// waits for the end of an unrelated enqueue of `b` (or for the full replica to finish its job,
/// or for the poll): the wake is spent (property 2). Now `WakeState::claim_sent` leaves the
/// backup armed for such a retry.
#[test]
fn a_retry_of_a_held_barrier_alone_that_clears_the_backup_spends_a_wake() {
    with(RETRY_CLEARS_BACKUP, SPLIT_THREE).assert_spends_a_wake(&[
        "R0 claims a job of a (full)",
        "R1's tries: a free, b held",
        "commits",
        "R1 reads 't R0 a'",
        "R1 sends its tries of b again, alone",
        "R1's tries: b held",
        "R0 reads 't R0 a'",
    ]);
}

/// The shipped protocol, where a retry sent alone leaves the backup armed (it fires, and claims,
/// unless a claim is sent first), holds where that variant spends a wake.
#[test]
fn v2_a_retry_alone_leaves_the_backup_armed_and_spends_no_wake() {
    SPLIT_THREE.assert_holds(1_000_000);
}

/// A: the take loses a wake to its rollback: the row holder rolls back, and the enqueue that
/// skipped the locked row committed a job nobody was told of. (It also loses one to the
/// registration race, having no barrier: the replicas start registered here, so that the search
/// reaches the rollback's state by the rollback first.)
#[test]
fn a_the_take_loses_a_wake_when_the_row_holder_rolls_back() {
    let registered = Scenario {
        start_waiting: true,
        ..SPLIT_THREE
    };
    with(TAKE, registered).assert_loses_a_wake(&[
        "names R0, locking that row",
        "finds nobody unlocked, notifies nobody",
        "commits",
        "rolls back",
    ]);
}

/// B: an enqueue that read the registry before a replica registered, and commits after that
/// replica's claim, wakes nobody without the barrier.
#[test]
fn b_skipping_without_the_barrier_loses_a_wake() {
    with(NO_BARRIER, SPLIT_THREE).assert_loses_a_wake(&[
        "finds nobody, notifies nobody",
        "registers",
        "claims: nothing",
        "commits",
    ]);
}

/// C: without backups, a wake named for a replica that dies is lost (property 2 fails too).
#[test]
fn c_without_backups_a_wake_named_for_a_replica_that_dies_is_lost() {
    let outcome = with(NO_BACKUPS, SPLIT_DEATH).assert_loses_a_wake(&["names", "dies"]);
    assert!(
        outcome.spent_wake.is_some(),
        "property 2 holds without backups"
    );
}
