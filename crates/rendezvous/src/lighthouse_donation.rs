//! Healing through the lighthouse: a live replica's state handed to the replicas waiting to
//! join, which take part from the collective after it; once the run ended, a joiner is told
//! so instead.

use std::sync::{Arc, PoisonError};
use std::time::Instant;

use super::{Donation, Lighthouse, Member, Session};
use crate::RendezvousError;

impl Lighthouse {
    /// The optimizer step the run ended at, once a member said so ([`end_run`](Self::end_run)).
    pub fn ended_at(&self) -> Option<u64> {
        self.lock().ended
    }

    /// The replicas waiting for a live state to join the run, in order.
    pub fn joiners(&self) -> Vec<usize> {
        self.lock().joiners.keys().copied().collect()
    }

    /// `session`'s replica finished training at optimizer `step`, after its last collective of
    /// the run: no live replica will send a state from now on, so a replica waiting to join
    /// (or joining later) is told the run ended rather than left waiting.
    pub fn end_run(&self, session: &Session, step: u64) -> Result<(), RendezvousError> {
        let mut state = self.lock();
        Self::check_session(&state, session, "end_run")?;
        if state.ended.is_none() {
            tracing::info!(
                replica = session.replica,
                step,
                "the run ended; replicas that ask to join from now on are told so"
            );
        }
        state.ended = Some(state.ended.map_or(step, |s| s.max(step)));
        self.changed.notify_all();
        Ok(())
    }

    /// The donor's state for every waiting joiner: they take part from collective `next_seq`.
    pub fn send_state(
        &self,
        session: &Session,
        next_seq: u64,
        bytes: Vec<u8>,
    ) -> Result<(), RendezvousError> {
        let mut state = self.lock();
        Self::check_session(&state, session, "send_state")?;
        if state.donor != Some(session.replica) {
            return Ok(()); // nobody waits for this replica's state any more
        }
        state.healing_bytes += bytes.len() as u64;
        let donation = Donation {
            next_seq,
            bytes: Arc::new(bytes),
        };
        let joiners = std::mem::take(&mut state.joiners);
        for (replica, number) in joiners {
            state.generation += 1;
            state.members.insert(
                replica,
                Member {
                    session: number,
                    from_seq: next_seq,
                },
            );
            state.donations.insert(replica, donation.clone());
            tracing::info!(
                replica,
                from = session.replica,
                collective = next_seq,
                "replica healed from a live replica; it joins at collective {next_seq}"
            );
        }
        state.donor = None;
        // The joiners load the state before their first collective: the collectives they take
        // part in count their timeout from now.
        let now = Instant::now();
        state
            .rounds
            .range_mut(next_seq..)
            .for_each(|(_, round)| round.first_at = now);
        self.changed.notify_all();
        Ok(())
    }

    /// Blocks until a live replica's state arrives for `session`'s joining replica.
    pub fn receive_state(&self, session: &Session) -> Result<Donation, RendezvousError> {
        let deadline = Instant::now() + self.config.join_timeout;
        let mut state = self.lock();
        loop {
            Self::check_session(&state, session, "receive_state")?;
            if let Some(donation) = state.donations.remove(&session.replica) {
                return Ok(donation);
            }
            if let Some(step) = state.ended {
                state.joiners.remove(&session.replica);
                return Err(RendezvousError::RunEnded {
                    rank: session.replica,
                    step,
                });
            }
            if state.started && state.members.is_empty() {
                state.joiners.remove(&session.replica);
                return Err(RendezvousError::Collective {
                    op: "receive_state",
                    rank: session.replica,
                    reason: "no live replica is left to send its state (the run ended or \
                             every replica failed)"
                        .into(),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                state.joiners.remove(&session.replica);
                return Err(RendezvousError::Timeout {
                    op: "receive_state (no live replica sent its state)",
                    rank: session.replica,
                    seconds: self.config.join_timeout.as_secs_f64(),
                });
            }
            state = self
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}
