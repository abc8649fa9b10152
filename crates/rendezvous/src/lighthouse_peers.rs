//! The lighthouse's address book: where each replica takes data from its peers (a ring
//! between the members moves the values; the lighthouse only says who is where).

use std::collections::BTreeMap;

use super::{Lighthouse, Session};
use crate::RendezvousError;

impl Lighthouse {
    /// Records where `session`'s replica accepts data connections from its peers (a
    /// `host:port`); a later session of the replica replaces it.
    pub fn announce(&self, session: &Session, address: &str) -> Result<(), RendezvousError> {
        let mut state = self.lock();
        Self::check_session(&state, session, "announce")?;
        state
            .addresses
            .insert(session.replica, (session.number, address.to_string()));
        Ok(())
    }

    /// The announced address of each of `replicas` (replica -> address), for `session`'s
    /// replica building a ring with them; a replica that announced none, or whose announcing
    /// session is no longer its live one, is an error naming it.
    pub fn peers(
        &self,
        session: &Session,
        replicas: &[usize],
    ) -> Result<BTreeMap<usize, String>, RendezvousError> {
        let state = self.lock();
        Self::check_session(&state, session, "peers")?;
        replicas
            .iter()
            .map(|&replica| {
                let live = state.sessions.get(&replica);
                match state.addresses.get(&replica) {
                    Some((number, address)) if live == Some(number) => {
                        Ok((replica, address.clone()))
                    }
                    _ => Err(RendezvousError::Collective {
                        op: "peers",
                        rank: session.replica,
                        reason: format!(
                            "replica {replica} has announced no data address in its live \
                             session (it left, or connected without one)"
                        ),
                    }),
                }
            })
            .collect()
    }
}
