//! An explicit-state model check of the replicas' wake protocol (v2, migration 0028): a
//! breadth-first search over every interleaving of a few enqueuers, two replicas and an
//! operator, with a visited set of hashed states, that looks for a job nobody will ever claim.
//! Std only: no database, no crate of this package.
//!
//! # The model
//!
//! - Jobs: each enqueuer runs one transaction that enqueues one job into its queue, then commits
//!   or rolls back (both are explored). A job is not yet inserted, uncommitted, committed
//!   (claimable while its queue is not paused), claimed, or gone (rolled back). Inserting the job
//!   and the trigger's first read are one step: an uncommitted job is invisible to every other
//!   party, so the insert alone changes nothing any other step reads.
//! - The registry: one row per replica incarnation, waiting (for the queues its replica serves)
//!   or parked. A restarted replica registers under a new wake token; its dead incarnation's row
//!   stays as it was (stale), so wakes may still name it. The trigger reads the registry and
//!   `paused[q]` without locks: a read of committed state.
//! - The enqueue barrier of each queue: the set of open enqueue transactions that hold it in
//!   share mode (a transaction-level advisory lock, released at their commit or rollback).
//! - Notifications exist only from a commit on, so they are delivered at the commit that sends
//!   them, atomically with it and in commit order, into the inbox of every live replica that
//!   serves their queue (any other would ignore them); a replica reads its inbox in order, one
//!   notification per step. A rolled-back transaction sends nothing. A dead replica's inbox is
//!   discarded and it is sent nothing.
//! - There is no poll: a wake that is missed is missed for good.
//! - A replica holds at most one job (capacity 1). Its local state: alive or dead, incarnation,
//!   `wake` (a claim is owed, coalesced), `settle[q]` (a try of queue `q`'s barrier is owed),
//!   `backup` (the backup timer is armed), the job it holds, its inbox. Its steps: register
//!   (write its row waiting, then owe a try of each served queue and a claim), settle a queue (a
//!   try that succeeds when no transaction holds the barrier; a failed try changes nothing and
//!   stays owed), claim (take a committed job of a served, unpaused queue, if any, and park its
//!   row when it took one; clears `wake` and `backup`), finish its job (its row is parked: it
//!   registers next), receive a notification, fire its backup, die, restart.
//! - A replica that dies holding a job either keeps it (the job is no longer modelled: recovery
//!   is out of scope) or, in the scenario with `recovery`, gives it back at once: the job is
//!   committed and claimable again and every live replica that serves its queue is sent
//!   `q <queue>`.
//! - The operator pauses one queue once and resumes it once; the resume's commit sends
//!   `q <queue>`.
//! - With claims in flight (a scenario option, and always under [`Design::PresenceGated`]), a
//!   claim's answer comes back in a step of its own; meanwhile the replica reads notifications
//!   but sends no other claim or registration.
//! - Reductions that keep every behaviour: the enqueuers of one queue are interchangeable (a
//!   claim takes "a job of `a`", and a replica holds "a job of `a`"), so the search keeps one
//!   state per class of states equal up to renaming them; counterexamples are replayed on the
//!   unreduced model, so their traces name each enqueuer consistently, and are shortest.
//!
//! # The designs
//!
//! - [`Design::V2`]: the protocol as specified: the trigger reads `paused[q]` and the registry
//!   and, when some row waits for `q` and `q` is not paused, names one of them (any one: all are
//!   explored), else it takes `q`'s barrier, all in one atomic step. A replica that registers, or
//!   hears `q <queue>`, tries the barrier of the queues concerned and claims after a successful
//!   try. A replica that hears a wake named for another replica, for a queue it serves, while
//!   its own row waits, arms its backup, which fires later unless a claim clears it first.
//! - [`Design::ReadThenBarrier`]: v2 as `durable_etl_wake` in migration 0028 runs it: the read
//!   is one statement and `pg_advisory_xact_lock_shared` a later one, so a replica can register
//!   (or hear a resume), try the barrier and claim between the two. It loses a wake.
//! - [`Design::BarrierThenReread`]: the fix proposed for that: when the read finds nobody who
//!   may act, take the barrier, then read again (a new statement, so a new snapshot under read
//!   committed) and name whomever that read finds, keeping the barrier.
//! - [`Design::BarrierFirst`]: the other fix: take the barrier before the read, always.
//! - [`Design::PresenceGated`]: v2 as the claim loop runs it: a replica arms a backup, and
//!   records a `q` wake's queue as owing a try, only while its presence is `Waiting`, which it
//!   learns from the answer of the claim its registration went with. It loses a wake, both ways.
//! - The broken designs, which the checker must refute: [`Design::Take`] (A: the enqueuer locks
//!   the named row to its end and parks it at its commit; an enqueuer that finds no unlocked
//!   waiting row names nobody and takes no barrier; no backups), [`Design::NoBarrier`] (B: v2
//!   without the barrier) and [`Design::NoBackups`] (C: v2 without backups).
//!
//! # The properties
//!
//! 1. No lost wake: in every reachable quiescent state (no enqueue transaction open, and no live
//!    replica that may register, settle, claim, take its claim's answer, receive or fire its
//!    backup), no job is committed and unclaimed in an unpaused queue that a live replica
//!    holding no job serves.
//! 2. No wake spent on a replica that cannot act: a wake named for a replica that was dead or
//!    full when it was delivered (a) arms the backup of every other live replica with no job
//!    whose row waits for that queue, as it reads it, and (b) once every live replica has read
//!    the queue's wakes named for replicas that could not act, leaves a claim owed (a wake, a
//!    backup, a try, a registration, or an unread notification of the queue) by some live
//!    replica with no job that serves the queue, if a job of the queue is still claimable and
//!    some live replica with no job waits for it.
//!
//! # The bounds
//!
//! Two replicas (replica 0 serves `a` and replica 1 serves `a` and `b`, or both serve `a`), two
//! queues, two or three enqueuers of one job each, at most one death and one restart, at most one
//! pause and resume of one queue: see the scenarios ([`SPLIT_DEATH`] and the others) for each
//! test's. V2 holds in all of them; so do its two fixed implementations, in the ones they are
//! run on.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

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

/// A fast multiplicative hasher for the visited set: the states are small and the default
/// hasher is slow in a debug build.
#[derive(Default)]
struct FastHasher(u64);

impl FastHasher {
    /// Mixes `word` into the hash.
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        // The finalizer of MurmurHash3: every input bit reaches the low bits and the high bits.
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.add(u64::from(byte));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_u128(&mut self, n: u128) {
        self.add(n as u64);
        self.add((n >> 64) as u64);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn write_isize(&mut self, n: isize) {
        self.add(n as u64);
    }
}

/// The visited set's map: a state's key to its index in the search.
type Visited = HashMap<u128, u32, BuildHasherDefault<FastHasher>>;

/// Which protocol the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Design {
    /// v2 as specified: the trigger's read and its barrier in one atomic step.
    V2,
    /// v2 as migration 0028 writes it: the read, then the barrier in a later step.
    ReadThenBarrier,
    /// The fix of [`Design::ReadThenBarrier`]: when the read finds nobody, take the barrier,
    /// then read again and name whomever the second read finds (keeping the barrier).
    BarrierThenReread,
    /// The other fix: the barrier in share mode before the read, always.
    BarrierFirst,
    /// Broken variant A, the take: the enqueuer locks the named row (`FOR UPDATE SKIP LOCKED`)
    /// to its end and the row is parked at its commit (a replica whose row is locked claims only
    /// after that end: parking its row would wait for the lock); an enqueuer that finds no
    /// unlocked waiting row names nobody and takes no barrier; no backups.
    Take,
    /// Broken variant B: v2 without the barrier (a try always succeeds).
    NoBarrier,
    /// Broken variant C: v2 without backups.
    NoBackups,
    /// v2 as the claim loop runs it (`src/worker/claim/producer.rs`): claims are in flight, and
    /// a replica arms a backup, or records a `q` wake's queue to settle, only while it believes
    /// its row waits (its presence is `Waiting`), which it learns from the answer of the claim
    /// that followed its registration.
    PresenceGated,
}

impl Design {
    /// Whether a replica arms its backup on a wake named for another replica.
    fn backups(self) -> bool {
        !matches!(self, Design::Take | Design::NoBackups)
    }
}

/// An enqueuer's job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Job {
    /// Not inserted yet.
    Absent,
    /// Inserted by a transaction still open.
    Uncommitted,
    /// Committed and not claimed: claimable while its queue is not paused.
    Committed,
    /// Claimed by a replica (held, or done).
    Claimed,
    /// Rolled back.
    Gone,
}

/// Where an enqueuer's transaction stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Tx {
    /// Not begun.
    Idle,
    /// Its read found nobody who may act; the barrier is its next step
    /// ([`Design::ReadThenBarrier`], [`Design::BarrierThenReread`]).
    Skipped,
    /// It holds the barrier; its (second) read is its next step ([`Design::BarrierThenReread`],
    /// [`Design::BarrierFirst`]).
    Barred,
    /// Its trigger is done: it commits or rolls back next.
    Open {
        /// The wake token it named, if any (under [`Design::Take`], the row it locked).
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
    /// `t <token> <queue>`: a wake named for one replica incarnation.
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

/// One replica's local state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Replica {
    /// Whether it runs.
    alive: bool,
    /// Its incarnation: 0, or 1 after its restart.
    incarnation: u8,
    /// A claim is owed (coalesced).
    wake: bool,
    /// A try of the queue's barrier is owed.
    settle: [bool; QUEUES],
    /// Its backup timer is armed.
    backup: bool,
    /// The queue of the job it holds, if any (jobs of one queue are interchangeable).
    holding: Option<u8>,
    /// Notifications delivered and not yet read, oldest first, then empty slots.
    inbox: [Msg; INBOX],
    /// How many notifications the inbox holds.
    unread: u8,
    /// A claim was executed and its answer is not back yet (with claims in flight only): the
    /// replica sends no other claim or registration meanwhile.
    answering: bool,
    /// What the replica believes of its row (its presence is `Waiting`): set by the answer of
    /// a claim that followed its registration, cleared by a claim that filled it (with claims
    /// in flight only; else it is not used).
    joined: bool,
}

impl Replica {
    /// A replica that just started (or restarted) as `incarnation`, its row parked.
    fn started(incarnation: u8) -> Replica {
        Replica {
            alive: true,
            incarnation,
            wake: false,
            settle: [false; QUEUES],
            backup: false,
            holding: None,
            inbox: [Msg::Empty; INBOX],
            unread: 0,
            answering: false,
            joined: false,
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
    /// An enqueuer inserts its job and its trigger reads the registry (and, under
    /// [`Design::V2`] when nobody may act, takes the barrier in the same step).
    Read {
        /// The enqueuer.
        enqueuer: u8,
        /// The wake token it names, if any.
        target: Option<u8>,
    },
    /// An enqueuer takes its queue's barrier in share mode (under [`Design::BarrierFirst`], it
    /// also inserts its job).
    Barrier {
        /// The enqueuer.
        enqueuer: u8,
    },
    /// An enqueuer holding the barrier reads the registry (again).
    Reread {
        /// The enqueuer.
        enqueuer: u8,
        /// The wake token it names, if any.
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
    /// A replica writes its row waiting.
    Register {
        /// The replica.
        replica: u8,
    },
    /// A replica's try of a queue's barrier succeeds.
    Settle {
        /// The replica.
        replica: u8,
        /// The queue.
        queue: u8,
    },
    /// A replica claims.
    Claim {
        /// The replica.
        replica: u8,
        /// The queue of the job it took, if any.
        job: Option<u8>,
    },
    /// The answer of a replica's claim in flight comes back.
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

/// A state packed into bit fields: the visited set's key (one per state, injective; 105 of its
/// 128 bits are used).
#[derive(Default)]
struct Key(u128);

impl Key {
    /// Appends `value`, which fits in `bits` bits.
    fn push(&mut self, value: usize, bits: u32) {
        assert!(value < 1 << bits, "{value} does not fit in {bits} bits");
        self.0 = (self.0 << bits) | value as u128;
    }

    /// Appends a flag.
    fn flag(&mut self, flag: bool) {
        self.push(usize::from(flag), 1);
    }
}

impl State {
    /// The state's key (see [`Key`]).
    fn key(&self) -> u128 {
        let mut key = Key::default();
        for e in 0..ENQUEUERS {
            key.push(self.jobs[e] as usize, 3);
            let tx = match self.txs[e] {
                Tx::Idle => 0,
                Tx::Skipped => 1,
                Tx::Barred => 2,
                Tx::Ended => 3,
                Tx::Open { target, barrier } => {
                    4 + 2 * target.map_or(0, |t| usize::from(t) + 1) + usize::from(barrier)
                }
            };
            key.push(tx, 4);
        }
        for r in 0..REPLICAS {
            let replica = &self.replicas[r];
            for i in 0..INCARNATIONS {
                key.flag(self.waiting[r][i]);
            }
            key.flag(replica.alive);
            key.push(usize::from(replica.incarnation), 1);
            key.flag(replica.wake);
            for q in 0..QUEUES {
                key.flag(replica.settle[q]);
            }
            key.flag(replica.backup);
            key.flag(replica.answering);
            key.flag(replica.joined);
            key.push(replica.holding.map_or(0, |q| usize::from(q) + 1), 2);
            key.push(usize::from(replica.unread), 3);
            for i in 0..INBOX {
                let msg = match replica.inbox[i] {
                    Msg::Empty => 0,
                    Msg::Broadcast { queue } => 1 + usize::from(queue),
                    Msg::Target {
                        token,
                        queue,
                        cannot_act,
                    } => {
                        3 + (usize::from(token) * 2 + usize::from(queue)) * 2
                            + usize::from(cannot_act)
                    }
                };
                key.push(msg, 5);
            }
        }
        for q in 0..QUEUES {
            key.flag(self.paused[q]);
        }
        key.push(self.operator as usize, 2);
        key.push(usize::from(self.deaths), 2);
        key.push(usize::from(self.restarts), 2);
        key.0
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
    /// Whether a replica that dies holding a job gives it back at once (`q <queue>` to every
    /// live replica); else the job stays claimed and is not modelled further.
    recovery: bool,
    /// Whether the replicas start registered, their rows waiting (as after their registration,
    /// tries and claim in an empty database); else they start parked and register first.
    start_waiting: bool,
    /// Whether a claim's answer comes back in a later step than the claim (always so under
    /// [`Design::PresenceGated`]): meanwhile the replica reads notifications and sends nothing.
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

impl Scenario {
    /// The queue of enqueuer `e`.
    fn queue_of(&self, e: usize) -> usize {
        self.enqueues[e]
    }

    /// Whether a claim's answer comes back in a step of its own.
    fn in_flight(&self) -> bool {
        self.claims_in_flight || self.design == Design::PresenceGated
    }

    /// The initial state: every replica alive, parked (or waiting, see
    /// [`Scenario::start_waiting`]), owing nothing; nothing enqueued, nothing paused.
    fn initial(&self) -> State {
        assert!(self.enqueues.len() <= ENQUEUERS);
        State {
            jobs: [Job::Absent; ENQUEUERS],
            txs: [Tx::Idle; ENQUEUERS],
            waiting: [[self.start_waiting, false]; REPLICAS],
            replicas: [Replica {
                joined: self.start_waiting,
                ..Replica::started(0)
            }; REPLICAS],
            paused: [false; QUEUES],
            operator: Operator::Idle,
            deaths: 0,
            restarts: 0,
        }
    }

    /// The wake tokens whose rows wait for `queue` and that a trigger may name, read without
    /// locks: none while the queue is paused; under [`Design::Take`], not the rows another
    /// open transaction locked.
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
                    && !(self.design == Design::Take && Self::row_locked(s, t))
                {
                    tokens.push(t);
                }
            }
        }
        tokens
    }

    /// Under [`Design::Take`], whether an open transaction holds the lock of `token`'s row.
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

    /// The steps of enqueuer `e`.
    fn enqueuer_steps(&self, s: &State, e: usize, out: &mut Vec<(Action, State)>) {
        let queue = self.queue_of(e);
        let enqueuer = e as u8;
        match s.txs[e] {
            Tx::Idle if self.design == Design::BarrierFirst => {
                let mut n = *s;
                n.jobs[e] = Job::Uncommitted;
                n.txs[e] = Tx::Barred;
                out.push((Action::Barrier { enqueuer }, n));
            }
            Tx::Idle => {
                let targets = self.nameable(s, queue);
                for &t in targets.as_slice() {
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
                        },
                        n,
                    ));
                }
                if targets.is_empty() {
                    let mut n = *s;
                    n.jobs[e] = Job::Uncommitted;
                    n.txs[e] = match self.design {
                        Design::V2 | Design::NoBackups | Design::PresenceGated => Tx::Open {
                            target: None,
                            barrier: true,
                        },
                        Design::Take | Design::NoBarrier => Tx::Open {
                            target: None,
                            barrier: false,
                        },
                        Design::ReadThenBarrier
                        | Design::BarrierThenReread
                        | Design::BarrierFirst => Tx::Skipped,
                    };
                    out.push((
                        Action::Read {
                            enqueuer,
                            target: None,
                        },
                        n,
                    ));
                }
            }
            Tx::Skipped => {
                let mut n = *s;
                n.txs[e] = if self.design == Design::ReadThenBarrier {
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
                let targets = self.nameable(s, queue);
                let nobody = [None];
                let named: Vec<Option<u8>> = targets.as_slice().iter().copied().map(Some).collect();
                let choices = if targets.is_empty() {
                    &nobody[..]
                } else {
                    &named[..]
                };
                for &target in choices {
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
                if let Some(t) = target {
                    let (replica, incarnation) = split_token(t);
                    let named = &s.replicas[replica];
                    let can_act = named.alive
                        && usize::from(named.incarnation) == incarnation
                        && named.holding.is_none();
                    if self.design == Design::Take {
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
                out.push((Action::Commit { enqueuer }, n));
                let mut n = *s;
                n.jobs[e] = Job::Gone;
                n.txs[e] = Tx::Ended;
                out.push((Action::Rollback { enqueuer }, n));
            }
            Tx::Ended => {}
        }
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
        let incarnation = usize::from(me.incarnation);
        let own = token(r, incarnation);
        let free = me.holding.is_none();
        let registered = s.waiting[r][incarnation];

        let idle = !me.answering;
        if free && !registered && idle {
            let mut n = *s;
            n.waiting[r][incarnation] = true;
            n.replicas[r].settle = self.serves[r];
            n.replicas[r].wake = true;
            out.push((Action::Register { replica }, n));
        }

        for queue in 0..QUEUES {
            // A failed try changes nothing: it is retried, an enabled step, once the holders
            // ended.
            if me.settle[queue] && !self.barrier_held(s, queue) {
                let mut n = *s;
                n.replicas[r].settle[queue] = false;
                n.replicas[r].wake = true;
                out.push((
                    Action::Settle {
                        replica,
                        queue: queue as u8,
                    },
                    n,
                ));
            }
        }

        // Under the take, parking a row an enqueuer locked waits for that enqueuer's end.
        let blocked = self.design == Design::Take && Self::row_locked(s, own);
        if me.wake && free && !blocked && idle {
            let mut woken = *s;
            woken.replicas[r].wake = false;
            woken.replicas[r].backup = false;
            woken.replicas[r].answering = self.in_flight();
            let mut took = false;
            for queue in (0..QUEUES).filter(|&q| self.serves[r][q] && !s.paused[q]) {
                // The jobs of one queue are interchangeable: take the first.
                let job = (0..self.enqueues.len())
                    .find(|&e| self.queue_of(e) == queue && s.jobs[e] == Job::Committed);
                if let Some(e) = job {
                    took = true;
                    let mut n = woken;
                    n.jobs[e] = Job::Claimed;
                    n.replicas[r].holding = Some(queue as u8);
                    n.waiting[r][incarnation] = false;
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
                out.push((Action::Claim { replica, job: None }, woken));
            }
        }

        if !free {
            let mut n = *s;
            n.replicas[r].holding = None;
            out.push((Action::Finish { replica }, n));
        }

        if me.answering {
            let mut n = *s;
            n.replicas[r].answering = false;
            n.replicas[r].joined = registered;
            out.push((Action::Answer { replica }, n));
        }

        if me.unread > 0 {
            let mut n = *s;
            let msg = n.replicas[r].take();
            // Whether the replica takes its row for waiting: the row itself, or its belief.
            let waits = if self.design == Design::PresenceGated {
                me.joined
            } else {
                registered
            };
            match msg {
                Msg::Target { token, queue, .. } if self.serves[r][usize::from(queue)] => {
                    if token == own {
                        n.replicas[r].wake = true;
                    } else if self.design.backups() && waits {
                        n.replicas[r].backup = true;
                    }
                }
                Msg::Broadcast { queue } if self.serves[r][usize::from(queue)] => {
                    n.replicas[r].wake = true;
                    if waits || self.design != Design::PresenceGated {
                        n.replicas[r].settle[usize::from(queue)] = true;
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
                let queue = usize::from(queue);
                let given_back = (0..self.enqueues.len())
                    .find(|&e| self.queue_of(e) == queue && s.jobs[e] == Job::Claimed);
                if let Some(e) = given_back {
                    n.jobs[e] = Job::Committed;
                }
                self.deliver(&mut n, Msg::Broadcast { queue: queue as u8 });
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

    /// Whether `s` is quiescent: no enqueue transaction open, and no live replica may register,
    /// settle, claim, receive or fire its backup.
    fn quiescent(&self, s: &State) -> bool {
        let open = s.txs.iter().any(|tx| !matches!(tx, Tx::Idle | Tx::Ended));
        !open
            && s.replicas.iter().enumerate().all(|(r, me)| {
                let free = me.holding.is_none();
                !me.alive
                    || !((free && !s.waiting[r][usize::from(me.incarnation)])
                        || me.settle.iter().any(|&owed| owed)
                        || (me.wake && free)
                        || me.unread > 0
                        || me.backup
                        || me.answering)
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
    /// wake, a backup, a try of the queue, a registration, or an unread notification of the
    /// queue (named for it, it wakes it; named for another, it arms its backup while its row
    /// waits, and while its row is parked it registers).
    fn owes_claim(&self, s: &State, r: usize, queue: usize) -> bool {
        let me = &s.replicas[r];
        me.wake
            || me.backup
            || me.settle[queue]
            || !s.waiting[r][usize::from(me.incarnation)]
            || me.unread().iter().any(|msg| match *msg {
                Msg::Broadcast { queue: q } | Msg::Target { queue: q, .. } => {
                    usize::from(q) == queue
                }
                Msg::Empty => false,
            })
    }

    /// Property 2 on the step `action` from `s` to `n`; counts in `checks` the steps it applies
    /// to (a wake named for a replica that could not act, read by another that may act).
    fn spent_wake(
        &self,
        s: &State,
        action: &Action,
        n: &State,
        checks: &mut usize,
    ) -> Option<String> {
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
        let read_by_all = Self::spent_wakes_unread(s) & !Self::spent_wakes_unread(n);
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
            Some(t) => format!("names {}", token_name(t)),
            None => "finds nobody".to_owned(),
        };
        match *action {
            Action::Read { enqueuer, target } => {
                let tail = match (target, self.design) {
                    (Some(_), Design::Take) => ", locking that row",
                    (Some(_), _) => "",
                    (None, Design::V2 | Design::NoBackups | Design::PresenceGated) => {
                        ", takes the barrier (share)"
                    }
                    (None, Design::Take) => " unlocked, notifies nobody",
                    (None, Design::NoBarrier) => ", notifies nobody",
                    (None, _) => ", barrier not taken yet",
                };
                format!(
                    "{} inserts its job; trigger reads the registry: {}{tail}",
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
            Action::Register { replica } => {
                format!("R{replica} registers (row waiting; owes its tries and a claim)")
            }
            Action::Settle { replica, queue } => format!(
                "R{replica} tries barrier {}: free",
                QUEUE_NAMES[usize::from(queue)]
            ),
            Action::Claim { replica, job } => match job {
                Some(q) => format!(
                    "R{replica} claims a job of {} (full: parks)",
                    QUEUE_NAMES[usize::from(q)]
                ),
                None => format!("R{replica} claims: nothing"),
            },
            Action::Finish { replica } => format!("R{replica} finishes its job"),
            Action::Answer { replica } => format!("R{replica} gets its claim's answer"),
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

    /// For each position of `s`'s canonical form, the enqueuer of `s` that lands there: the
    /// enqueuers of one queue are interchangeable (a job is named by its queue only), so the
    /// canonical form sorts each queue's enqueuers by their job and transaction.
    fn canonical_order(&self, s: &State) -> [usize; ENQUEUERS] {
        let mut order = [0, 1, 2];
        let n = self.enqueues.len();
        // A selection sort of each queue's enqueuers, by their job and transaction.
        for i in 0..n {
            for j in i + 1..n {
                let (ei, ej) = (order[i], order[j]);
                if self.queue_of(i) == self.queue_of(j)
                    && (s.jobs[ej], s.txs[ej]) < (s.jobs[ei], s.txs[ei])
                {
                    order.swap(i, j);
                }
            }
        }
        order
    }

    /// The canonical form of `s` (see [`Scenario::canonical_order`]).
    fn canonical(&self, s: &State) -> State {
        let order = self.canonical_order(s);
        let mut c = *s;
        for (position, &e) in order.iter().enumerate().take(self.enqueues.len()) {
            c.jobs[position] = s.jobs[e];
            c.txs[position] = s.txs[e];
        }
        c
    }

    /// `action` of a canonical state, its enqueuer renamed by `order` (see
    /// [`Scenario::canonical_order`]).
    fn renamed(action: Action, order: &[usize; ENQUEUERS]) -> Action {
        let rename = |e: u8| order[usize::from(e)] as u8;
        match action {
            Action::Read { enqueuer, target } => Action::Read {
                enqueuer: rename(enqueuer),
                target,
            },
            Action::Barrier { enqueuer } => Action::Barrier {
                enqueuer: rename(enqueuer),
            },
            Action::Reread { enqueuer, target } => Action::Reread {
                enqueuer: rename(enqueuer),
                target,
            },
            Action::Commit { enqueuer } => Action::Commit {
                enqueuer: rename(enqueuer),
            },
            Action::Rollback { enqueuer } => Action::Rollback {
                enqueuer: rename(enqueuer),
            },
            other => other,
        }
    }

    /// The counterexample that `steps` (actions of canonical states, from the initial state)
    /// reach: replays them on uncanonical states so that each enqueuer keeps its name.
    fn replay(&self, what: String, steps: &[Action]) -> Counterexample {
        let mut state = self.initial();
        let mut trace = Vec::new();
        let mut next = Vec::new();
        for &step in steps {
            let action = Self::renamed(step, &self.canonical_order(&state));
            next.clear();
            self.successors(&state, &mut next);
            match next.iter().find(|(a, _)| *a == action) {
                Some(&(_, n)) => state = n,
                None => panic!("replay: {action:?} is not enabled in {state:?}"),
            }
            trace.push(self.describe(&action));
        }
        Counterexample { what, trace, state }
    }

    /// Searches every interleaving breadth first, one canonical state per class of states
    /// equal up to renaming the enqueuers of a queue, so the counterexamples it reports are
    /// shortest. With `wanted`, it stops at the first lost wake that `wanted` accepts, and
    /// reports only that one.
    fn check(&self, wanted: Option<&dyn Fn(&Counterexample) -> bool>) -> Outcome {
        let initial = self.canonical(&self.initial());
        let mut visited = Visited::default();
        let mut parents: Vec<Option<(u32, Action)>> = vec![None];
        let mut frontier = VecDeque::from([(initial, 0_u32)]);
        visited.insert(initial.key(), 0);
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
        let mut next = Vec::new();
        while let Some((s, at)) = frontier.pop_front() {
            outcome.states += 1;
            if self.quiescent(&s) {
                outcome.quiescent += 1;
                if s.jobs.contains(&Job::Claimed) {
                    outcome.quiescent_with_work_done += 1;
                }
                if outcome.lost_wake.is_none() && self.lost_wake(&s).is_some() {
                    // Described on the replayed state, whose enqueuers keep their names.
                    let mut found = self.replay(String::new(), &path(&parents, at, None));
                    found.what = self.lost_wake(&found.state).unwrap_or_default();
                    match wanted {
                        None => outcome.lost_wake = Some(found),
                        Some(wanted) if wanted(&found) => {
                            outcome.lost_wake = Some(found);
                            break;
                        }
                        Some(_) => {}
                    }
                }
            }
            next.clear();
            self.successors(&s, &mut next);
            for &(action, n) in &next {
                outcome.transitions += 1;
                let found = self.spent_wake(&s, &action, &n, &mut outcome.spent_wake_checks);
                if let (Some(what), None) = (found, &outcome.spent_wake) {
                    let steps = path(&parents, at, Some(action));
                    outcome.spent_wake = Some(self.replay(what, &steps));
                }
                let n = self.canonical(&n);
                if let Entry::Vacant(slot) = visited.entry(n.key()) {
                    let Ok(id) = u32::try_from(parents.len()) else {
                        panic!("{}: more than 2^32 states", self.name);
                    };
                    slot.insert(id);
                    parents.push(Some((at, action)));
                    frontier.push_back((n, id));
                }
            }
        }
        println!(
            "{} ({:?}): {} states, {} transitions, {} quiescent ({} after some claim), {} \
             property-2 checks",
            self.name,
            self.design,
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
        let wanted = |found: &Counterexample| {
            let mut trace = found.trace.iter();
            steps
                .iter()
                .all(|words| trace.any(|step| step.contains(words)))
        };
        let outcome = self.check(Some(&wanted));
        assert!(
            outcome.lost_wake.is_some(),
            "{}: the checker found no lost wake through {steps:?} in {} states",
            self.name,
            outcome.states
        );
        outcome
    }
}

/// The bounds every scenario starts from: v2, split queues, no job, no death, no restart, no
/// pause, replicas that start parked and claims answered at once.
const BASE: Scenario = Scenario {
    name: "",
    design: Design::V2,
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

/// Both replicas serve `a`; two jobs of `a`; a death that gives its job back, and a restart.
const SHARED_RECOVERY: Scenario = Scenario {
    name: "both serve a, jobs a a, a death that gives its job back, a restart",
    serves: SAME,
    enqueues: &[A, A],
    deaths: 1,
    restarts: 1,
    recovery: true,
    ..BASE
};

/// Both replicas serve `a`; two jobs of `a`; a death; claims answered in a later step.
const SHARED_IN_FLIGHT: Scenario = Scenario {
    name: "both serve a, jobs a a, a death, claims in flight",
    serves: SAME,
    enqueues: &[A, A],
    deaths: 1,
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

/// Split queues; three jobs (`a`, `a`, `b`); no death: where the broken designs are refuted.
const SPLIT_THREE: Scenario = Scenario {
    name: "split queues, jobs a a b",
    enqueues: &[A, A, B],
    ..BASE
};

/// `scenario` under `design`.
fn with(design: Design, scenario: Scenario) -> Scenario {
    Scenario { design, ..scenario }
}

/// v2 with split queues: wakes named for a replica that died, for its dead incarnation's stale
/// row, or for a replica that filled up, are backed up.
#[test]
fn v2_loses_no_wake_with_split_queues_a_death_and_a_restart() {
    SPLIT_DEATH.assert_holds(100_000);
}

/// v2 with more jobs than replicas: named replicas fill up.
#[test]
fn v2_loses_no_wake_when_jobs_outnumber_the_replicas() {
    SHARED_THREE.assert_holds(100_000);
}

/// v2 with both replicas serving one queue, one of them dying and restarting.
#[test]
fn v2_loses_no_wake_when_both_replicas_serve_one_queue_and_one_dies() {
    SHARED_DEATH.assert_holds(100_000);
}

/// v2 across a pause and a resume: an enqueue that read the queue paused holds the barrier, and
/// the resume's `q` wake makes every replica try it.
#[test]
fn v2_loses_no_wake_across_a_pause_and_resume() {
    SPLIT_PAUSE.assert_holds(100_000);
}

/// v2 when a dead replica's job is given back with a `q` wake.
#[test]
fn v2_loses_no_wake_when_a_dead_replicas_job_is_given_back() {
    SHARED_RECOVERY.assert_holds(100_000);
}

/// v2 as specified (backups armed by the row's state) when claims' answers come back later.
#[test]
fn v2_loses_no_wake_with_claims_in_flight() {
    SHARED_IN_FLIGHT.assert_holds(100_000);
}

/// `durable_etl_wake` as migration 0028 writes it reads the registry (and `paused`), then takes
/// the barrier in a later statement: a replica can register, try the barrier and claim in
/// between, or a resume can be heard and settled in between.
#[test]
fn reading_the_registry_before_taking_the_barrier_loses_a_wake() {
    with(Design::ReadThenBarrier, SPLIT_THREE).assert_loses_a_wake(&[
        "finds nobody, barrier not taken yet",
        "R0 registers",
        "R0 tries barrier a: free",
        "R0 claims: nothing",
        "takes the barrier",
        "commits",
    ]);
    let registered = Scenario {
        start_waiting: true,
        ..SHARED_PAUSE
    };
    with(Design::ReadThenBarrier, registered).assert_loses_a_wake(&[
        "pause a",
        "finds nobody, barrier not taken yet",
        "resume a",
        "R0 reads 'q a'",
        "R0 tries barrier a: free",
        "takes the barrier",
        "commits",
    ]);
}

/// The fix of [`Design::ReadThenBarrier`] proposed here: read again after taking the barrier.
#[test]
fn taking_the_barrier_then_reading_again_loses_no_wake() {
    with(Design::BarrierThenReread, SPLIT_DEATH).assert_holds(100_000);
    with(Design::BarrierThenReread, SPLIT_PAUSE).assert_holds(100_000);
}

/// The other fix: take the barrier before the read, always.
#[test]
fn taking_the_barrier_before_the_read_loses_no_wake() {
    with(Design::BarrierFirst, SPLIT_PAUSE).assert_holds(100_000);
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
    with(Design::Take, registered).assert_loses_a_wake(&[
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
    with(Design::NoBarrier, SPLIT_THREE).assert_loses_a_wake(&[
        "finds nobody, notifies nobody",
        "registers",
        "claims: nothing",
        "commits",
    ]);
}

/// C: without backups, a wake named for a replica that dies is lost (property 2 fails too).
#[test]
fn c_without_backups_a_wake_named_for_a_replica_that_dies_is_lost() {
    let outcome = with(Design::NoBackups, SPLIT_DEATH).assert_loses_a_wake(&["names", "dies"]);
    assert!(
        outcome.spent_wake.is_some(),
        "property 2 holds without backups"
    );
}

/// The claim loop arms a backup only while its presence is `Waiting`, which it learns from the
/// answer of the claim its registration went with: a wake named for a dead replica that arrives
/// before that answer arms nothing, though the row waits and the claim's snapshot predates the
/// job's commit.
#[test]
fn gating_backups_on_the_presence_state_loses_a_wake() {
    let outcome = with(Design::PresenceGated, SHARED_DEATH).assert_loses_a_wake(&[
        "R0 dies",
        "R1 registers",
        "R1 claims: nothing",
        "commits",
        "R1 reads 't R0 a'",
        "R1 gets its claim's answer",
    ]);
    assert!(outcome.spent_wake.is_some(), "property 2 holds");
}

/// The claim loop records a `q` wake's queue to settle only while its presence is `Waiting`: a
/// resume heard between its registration's try and that claim's answer leaves no try owed, so
/// an enqueue that read the queue paused and holds the barrier commits after every claim.
#[test]
fn gating_q_settles_on_the_presence_state_loses_a_wake() {
    with(Design::PresenceGated, SHARED_PAUSE).assert_loses_a_wake(&[
        "R0 tries barrier a: free",
        "pause a",
        "takes the barrier",
        "resume a",
        "R0 reads 'q a'",
        "R0 claims: nothing",
        "commits",
    ]);
}
