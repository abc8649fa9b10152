//! [`Coordinator`]: what a replica's process group calls, the lighthouse itself (replicas on
//! threads of its process) or a TCP connection to one ([`connect`](crate::connect)).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

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
    /// Says the run ended at optimizer `step` (see [`Lighthouse::end_run`]).
    fn end_run(&self, session: &Session, step: u64) -> Result<(), RendezvousError>;
    /// Leaves the group.
    fn leave(&self, session: &Session, reason: &str);
    /// Records where this replica accepts data from its peers (see [`Lighthouse::announce`]).
    fn announce(&self, session: &Session, address: &str) -> Result<(), RendezvousError>;
    /// Where `replicas` accept data (see [`Lighthouse::peers`]).
    fn peers(
        &self,
        session: &Session,
        replicas: &[usize],
    ) -> Result<BTreeMap<usize, String>, RendezvousError>;
    /// The address of this machine that reaches the lighthouse, where a replica listens for
    /// its peers (loopback for replicas on threads of the lighthouse's process).
    fn local_ip(&self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    }
    /// Why the lighthouse is gone, when it is known to be (its connection closed: the process
    /// serving it exited or was killed); `None` while it may be there. Cheap (no round trip):
    /// a group whose values bypass the lighthouse asks before each collective.
    fn lost(&self) -> Option<String> {
        None
    }
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

    fn end_run(&self, session: &Session, step: u64) -> Result<(), RendezvousError> {
        Lighthouse::end_run(self, session, step)
    }

    fn leave(&self, session: &Session, reason: &str) {
        Lighthouse::leave(self, session, reason)
    }

    fn announce(&self, session: &Session, address: &str) -> Result<(), RendezvousError> {
        Lighthouse::announce(self, session, address)
    }

    fn peers(
        &self,
        session: &Session,
        replicas: &[usize],
    ) -> Result<BTreeMap<usize, String>, RendezvousError> {
        Lighthouse::peers(self, session, replicas)
    }
}
