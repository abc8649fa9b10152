//! [`Coordinator`]: what a replica's process group calls, the lighthouse itself (replicas on
//! threads of its process) or a TCP connection to one ([`connect`](crate::connect)).

use crate::lighthouse::{Donation, Reply, Session};
use crate::round::Op;
use crate::{Lighthouse, RendezvousError};

/// What a replica's handle calls: the lighthouse itself, or a connection to one.
pub trait Coordinator: Send + Sync {
    /// Collective `seq` (see [`Lighthouse::collective`]).
    fn collective(
        &self,
        session: &Session,
        seq: u64,
        op: Op,
        values: Option<Vec<f32>>,
    ) -> Result<Reply, RendezvousError>;
    /// A live state for the joiners (see [`Lighthouse::send_state`]).
    fn send_state(
        &self,
        session: &Session,
        next_seq: u64,
        bytes: Vec<u8>,
    ) -> Result<(), RendezvousError>;
    /// Waits for a live state (see [`Lighthouse::receive_state`]).
    fn receive_state(&self, session: &Session) -> Result<Donation, RendezvousError>;
    /// Leaves the group.
    fn leave(&self, session: &Session, reason: &str);
}

impl Coordinator for Lighthouse {
    fn collective(
        &self,
        session: &Session,
        seq: u64,
        op: Op,
        values: Option<Vec<f32>>,
    ) -> Result<Reply, RendezvousError> {
        Lighthouse::collective(self, session, seq, op, values)
    }

    fn send_state(
        &self,
        session: &Session,
        next_seq: u64,
        bytes: Vec<u8>,
    ) -> Result<(), RendezvousError> {
        Lighthouse::send_state(self, session, next_seq, bytes)
    }

    fn receive_state(&self, session: &Session) -> Result<Donation, RendezvousError> {
        Lighthouse::receive_state(self, session)
    }

    fn leave(&self, session: &Session, reason: &str) {
        Lighthouse::leave(self, session, reason)
    }
}
