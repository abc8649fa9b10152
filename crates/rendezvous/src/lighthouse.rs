//! [`Lighthouse`]: the coordinator of a fault-tolerant replica group. It keeps the membership,
//! runs every collective as a quorum of the replicas present (a member that fails, leaves or
//! times out is dropped and the collective completes without it), and passes a live
//! replica's state to a replica that joins. Host data only: afterburner-parallel's
//! `QuorumGroup` converts tensors, the TCP server ([`LighthouseServer`](crate::LighthouseServer))
//! calls the same methods for replicas in other processes.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use crate::QuorumConfig;
use crate::RendezvousError;
use crate::agreement::Agreement;
use crate::config::invalid;
use crate::round::{Op, Outcome, Round, combine};

/// A replica's admission to the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    /// The replica id.
    pub replica: usize,
    /// Tells this connection of the replica from earlier ones (which are stale).
    pub number: u64,
    /// The replica joins a run in progress: it needs a live replica's state first.
    pub joining: bool,
}

/// The result of one collective for one member.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// One vector (sum, mean, broadcast) or one per member (gather).
    pub values: Vec<Vec<f32>>,
    /// The replicas whose values it holds.
    pub members: Vec<usize>,
    /// A joining replica waits for this member's state.
    pub donate: bool,
    /// The membership's generation when the collective finished: it changes whenever a
    /// replica enters or leaves the membership, so equal generations mean equal members
    /// (a ring between the members is rebuilt when it changes).
    pub generation: u64,
}

/// A live replica's state on its way to a joining one.
#[derive(Debug, Clone)]
pub struct Donation {
    /// The first collective the joiner takes part in.
    pub next_seq: u64,
    /// The state, encoded by the strategy.
    pub bytes: Arc<Vec<u8>>,
}

/// A member that left the group: who, why, and whether it was dropped for missing a
/// collective's deadline (a stalled or hung replica) rather than leaving or disconnecting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Departure {
    /// The replica (under `afterburner launch`, the rank).
    pub replica: usize,
    /// Why it left, e.g. "its connection closed (the process exited or was killed)" or
    /// "it did not call collective 77 within 8 s".
    pub reason: String,
    /// It missed a collective's timeout while still connected.
    pub timed_out: bool,
}

/// A member: from which collective it takes part, and its session.
#[derive(Debug, Clone, Copy)]
struct Member {
    session: u64,
    from_seq: u64,
}

#[derive(Default)]
struct State {
    members: BTreeMap<usize, Member>,
    /// The last session number given to each replica.
    sessions: BTreeMap<usize, u64>,
    /// Why a replica's session was dropped (replica, session) -> reason.
    dropped: BTreeMap<(usize, u64), String>,
    /// Joiners waiting for a live state (replica -> session).
    joiners: BTreeMap<usize, u64>,
    /// The member asked for its state, if any.
    donor: Option<usize>,
    /// States received for joiners (replica -> donation).
    donations: BTreeMap<usize, Donation>,
    rounds: BTreeMap<u64, Round>,
    /// Finished collectives (the last few), with their outcome.
    results: BTreeMap<u64, Outcome>,
    /// The members of the last finished collective (for the warning when it shrinks).
    last_members: Vec<usize>,
    /// Collective 0 finished: replicas that connect from now on join a run in progress.
    started: bool,
    next_session: u64,
    /// Bytes of live state passed to joiners.
    healing_bytes: u64,
    /// The optimizer step a member said the run ended at ([`Lighthouse::end_run`]): a joiner
    /// is told so instead of waiting for a state no live replica will send.
    ended: Option<u64>,
    /// Every collective fails with this from now on (see [`Lighthouse::abort`]).
    aborted: Option<String>,
    /// The members that left, in the order they left.
    departures: Vec<Departure>,
    /// Bumped at every change of `members` (see [`Reply::generation`]).
    generation: u64,
    /// Where each replica's session takes data from its peers (replica -> (session, address)),
    /// see lighthouse_peers.rs.
    addresses: BTreeMap<usize, (u64, String)>,
}

/// How many finished collectives are kept for members that have not read them yet (a member
/// is at most one collective behind the others, so a few suffice).
const KEPT_RESULTS: usize = 8;

/// The coordinator of one fault-tolerant run (see the module docs). Share it between replica
/// threads (afterburner-parallel's `LocalReplicas::replica`), or serve it over TCP.
pub struct Lighthouse {
    config: QuorumConfig,
    /// The restart policy, as settled so far (agreement.rs).
    pub(crate) policy: Mutex<Agreement>,
    state: Mutex<State>,
    changed: Condvar,
}

impl Lighthouse {
    /// A lighthouse for `config.replicas` replicas; errors on an invalid config.
    pub fn new(config: QuorumConfig) -> Result<Arc<Self>, RendezvousError> {
        config.validate()?;
        let members = (0..config.replicas)
            .map(|r| {
                (
                    r,
                    Member {
                        session: 0,
                        from_seq: 0,
                    },
                )
            })
            .collect();
        Ok(Arc::new(Self {
            config,
            policy: Mutex::new(Agreement::new(config.restart)),
            state: Mutex::new(State {
                members,
                ..State::default()
            }),
            changed: Condvar::new(),
        }))
    }

    /// The settings.
    pub fn config(&self) -> &QuorumConfig {
        &self.config
    }

    /// The replicas currently in the group, in order (the founding ones from the start, until
    /// dropped, whether they have connected yet or not).
    pub fn members(&self) -> Vec<usize> {
        self.lock().members.keys().copied().collect()
    }

    /// Fails every collective in progress and every later one with `reason` (a strict group
    /// whose launch failed elsewhere).
    pub fn abort(&self, reason: &str) {
        self.lock().aborted = Some(reason.to_string());
        self.changed.notify_all();
    }

    /// The members that left the group so far, in the order they left (the first is the
    /// first failure a launcher reports, before the ones it caused).
    pub fn departures(&self) -> Vec<Departure> {
        self.lock().departures.clone()
    }

    /// Bytes of live state passed from live replicas to joining ones so far.
    pub fn healing_bytes(&self) -> u64 {
        self.lock().healing_bytes
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits replica `replica`: a founding member while the run has not finished its first
    /// collective, else a joiner that must receive a live state. An earlier session of the
    /// same replica is dropped (its calls are refused from now on).
    pub fn connect(&self, replica: usize) -> Result<Session, RendezvousError> {
        if replica >= self.config.replicas {
            return Err(invalid(
                "quorum replica id",
                &replica.to_string(),
                "an id below the number of replicas",
            ));
        }
        let mut state = self.lock();
        state.next_session += 1;
        let number = state.next_session;
        if let Some(old) = state.sessions.insert(replica, number) {
            drop_session(&mut state, replica, old, "a newer session of it connected");
        }
        let joining = state.started;
        match joining {
            false => {
                state.generation += 1;
                state.members.insert(
                    replica,
                    Member {
                        session: number,
                        from_seq: 0,
                    },
                );
            }
            true => {
                state.joiners.insert(replica, number);
                tracing::info!(
                    replica,
                    "replica asks to join the run; waiting for a live state"
                );
            }
        }
        self.changed.notify_all();
        Ok(Session {
            replica,
            number,
            joining,
        })
    }

    /// Errors when `session` is no longer the replica's live one.
    fn check_session(
        state: &State,
        session: &Session,
        op: &'static str,
    ) -> Result<(), RendezvousError> {
        let current = state.sessions.get(&session.replica) == Some(&session.number);
        let reason = state.dropped.get(&(session.replica, session.number));
        match (current, reason) {
            (true, None) => Ok(()),
            (_, reason) => Err(RendezvousError::Collective {
                op,
                rank: session.replica,
                reason: format!(
                    "replica {} was dropped from the quorum ({}); a replica never rejoins with \
                     stale state: start it again to be healed from a live replica",
                    session.replica,
                    reason.map_or("a newer session of it connected", String::as_str)
                ),
            }),
        }
    }

    /// Collective number `seq` with `values` from `session`'s replica; blocks until every
    /// member present has called it, or the stragglers time out and are dropped.
    pub fn collective(
        &self,
        session: &Session,
        seq: u64,
        op: Op,
        values: Option<Vec<f32>>,
    ) -> Result<Reply, RendezvousError> {
        let replica = session.replica;
        let mut state = self.lock();
        Self::check_session(&state, session, "collective")?;
        if !state.members.contains_key(&replica) {
            return Err(RendezvousError::Collective {
                op: "collective",
                rank: replica,
                reason: format!(
                    "replica {replica} is not a member yet (it must receive a live state first)"
                ),
            });
        }
        // A collective that already ended (a mismatch failed it) is answered below.
        if !state.results.contains_key(&seq) {
            let round = state.rounds.entry(seq).or_insert_with(|| Round {
                op,
                first_at: Instant::now(),
                contributions: BTreeMap::new(),
            });
            if round.op != op {
                let reason = format!(
                    "collective {seq}: replica {replica} called {op:?}, another member {:?}",
                    round.op
                );
                let error = RendezvousError::Mismatch {
                    rank: replica,
                    reason,
                };
                state.rounds.remove(&seq);
                state.results.insert(seq, Err(error.clone()));
                self.changed.notify_all();
                return Err(error);
            }
            round.contributions.insert(replica, values);
            self.try_finish(&mut state, seq);
        }
        loop {
            Self::check_session(&state, session, "collective")?;
            if let Some(reason) = &state.aborted {
                return Err(RendezvousError::Collective {
                    op: "collective",
                    rank: replica,
                    reason: reason.clone(),
                });
            }
            if let Some(result) = state.results.get(&seq) {
                let (values, members, generation) = result.clone()?;
                let donate = self.ask_donor(&mut state, replica);
                return Ok(Reply {
                    values,
                    members,
                    donate,
                    generation,
                });
            }
            let Some(first_at) = state.rounds.get(&seq).map(|r| r.first_at) else {
                return Err(RendezvousError::Collective {
                    op: "collective",
                    rank: replica,
                    reason: format!("collective {seq} vanished"),
                });
            };
            let deadline = first_at + self.config.timeout;
            let now = Instant::now();
            if now >= deadline {
                self.drop_stragglers(&mut state, seq);
                self.try_finish(&mut state, seq);
                continue;
            }
            state = self
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Whether `replica` is the member a joiner's state should come from (the lowest member,
    /// asked once until it sends or leaves).
    fn ask_donor(&self, state: &mut State, replica: usize) -> bool {
        if state.joiners.is_empty() {
            return false;
        }
        match state.donor {
            Some(donor) => donor == replica,
            None if state.members.keys().next() == Some(&replica) => {
                state.donor = Some(replica);
                true
            }
            None => false,
        }
    }

    /// The members expected in collective `seq`.
    fn expected(state: &State, seq: u64) -> Vec<usize> {
        state
            .members
            .iter()
            .filter(|(_, m)| m.from_seq <= seq)
            .map(|(r, _)| *r)
            .collect()
    }

    /// Drops every member expected in `seq` that has not called it (past the timeout).
    fn drop_stragglers(&self, state: &mut State, seq: u64) {
        let Some(round) = state.rounds.get(&seq) else {
            return;
        };
        let late: Vec<usize> = Self::expected(state, seq)
            .into_iter()
            .filter(|r| !round.contributions.contains_key(r))
            .collect();
        let seconds = self.config.timeout.as_secs_f64();
        for replica in late {
            if let Some(member) = state.members.get(&replica).copied() {
                let reason = format!("it did not call collective {seq} within {seconds} s");
                tracing::warn!(replica, "replica dropped from the quorum: {reason}");
                drop_session(state, replica, member.session, &reason);
                if let Some(last) = state.departures.last_mut().filter(|d| d.replica == replica) {
                    last.timed_out = true;
                }
            }
        }
    }

    /// Why the replicas not in `present` left (the latest reason of each), for the error of
    /// a collective left with too few: "replica 1: it did not call collective 77 within 8 s".
    fn why_missing(state: &State, present: &[usize]) -> String {
        let mut latest: BTreeMap<usize, &str> = BTreeMap::new();
        for departure in &state.departures {
            if !present.contains(&departure.replica) {
                latest.insert(departure.replica, &departure.reason);
            }
        }
        latest
            .into_iter()
            .map(|(replica, reason)| format!("replica {replica}: {reason}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Finishes collective `seq` if every expected member has called it.
    fn try_finish(&self, state: &mut State, seq: u64) {
        let expected = Self::expected(state, seq);
        let Some(round) = state.rounds.get(&seq) else {
            return;
        };
        if expected
            .iter()
            .any(|r| !round.contributions.contains_key(r))
        {
            return;
        }
        let Some(round) = state.rounds.remove(&seq) else {
            return;
        };
        let missing = Self::why_missing(state, &expected);
        let min_replicas = self
            .agreement()
            .min_replicas(self.config.min_replicas, self.config.replicas);
        let result = combine(round, &expected, seq, min_replicas, &missing);
        if let Ok((_, members)) = &result {
            let left: Vec<usize> = state
                .last_members
                .iter()
                .filter(|r| !members.contains(r))
                .copied()
                .collect();
            if !left.is_empty() && state.started {
                tracing::warn!(
                    "collective {seq}: replica(s) {left:?} left the quorum; continuing with {} of {} replicas",
                    members.len(),
                    self.config.replicas
                );
            }
            state.last_members = members.clone();
        }
        state.started = true;
        let generation = state.generation;
        let result = result.map(|(values, members)| (values, members, generation));
        state.results.insert(seq, result);
        while state.results.len() > KEPT_RESULTS {
            state.results.pop_first();
        }
        self.changed.notify_all();
    }

    /// Takes `session`'s replica out of the group (it finished, failed or disconnected); the
    /// collectives in progress go on without it.
    pub fn leave(&self, session: &Session, reason: &str) {
        let mut state = self.lock();
        if state.sessions.get(&session.replica) != Some(&session.number) {
            return;
        }
        drop_session(&mut state, session.replica, session.number, reason);
        let seqs: Vec<u64> = state.rounds.keys().copied().collect();
        for seq in seqs {
            self.try_finish(&mut state, seq);
        }
        self.changed.notify_all();
    }
}

/// Marks `replica`'s session `number` dropped for `reason`, out of the membership.
fn drop_session(state: &mut State, replica: usize, number: u64, reason: &str) {
    if state
        .members
        .get(&replica)
        .is_some_and(|m| m.session == number)
    {
        state.members.remove(&replica);
        state.generation += 1;
        tracing::info!(replica, "replica out of the quorum: {reason}");
        state.departures.push(Departure {
            replica,
            reason: reason.to_string(),
            timed_out: false,
        });
    }
    if state.joiners.get(&replica) == Some(&number) {
        state.joiners.remove(&replica);
    }
    if state.donor == Some(replica) {
        state.donor = None; // another member is asked at its next collective
    }
    state.dropped.insert((replica, number), reason.to_string());
}

#[path = "lighthouse_donation.rs"]
mod donation;

#[path = "lighthouse_peers.rs"]
mod peers;

#[cfg(test)]
#[path = "lighthouse_tests.rs"]
mod tests;
