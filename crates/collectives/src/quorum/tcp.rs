//! A replica in another process than its lighthouse: [`connect_tcp`] connects it to a
//! [`LighthouseServer`](afterburner_rendezvous::LighthouseServer) (afterburner-rendezvous's
//! TCP server) and gives it its [`QuorumGroup`].

use std::net::ToSocketAddrs;
use std::time::Duration;

use afterburner_rendezvous::Connection;
use burn::tensor::backend::Backend;

use super::QuorumGroup;
use crate::ParallelError;

/// Connects replica `replica` to the lighthouse at `address` (retrying for up to `wait`
/// while the lighthouse starts) and returns its group, on `device`.
pub fn connect_tcp<B: Backend>(
    address: impl ToSocketAddrs,
    replica: usize,
    device: &B::Device,
    wait: Duration,
) -> Result<QuorumGroup<B>, ParallelError> {
    connect_tcp_with_token(address, replica, device, wait, None)
}

/// [`connect_tcp`] presenting `token` to a lighthouse served with
/// [`LighthouseServer::bind_with_token`](afterburner_rendezvous::LighthouseServer::bind_with_token)
/// (a wrong or missing one is refused with an error naming `AFTERBURNER_TOKEN`).
pub fn connect_tcp_with_token<B: Backend>(
    address: impl ToSocketAddrs,
    replica: usize,
    device: &B::Device,
    wait: Duration,
    token: Option<&str>,
) -> Result<QuorumGroup<B>, ParallelError> {
    let connection = afterburner_rendezvous::connect(address, replica, wait, token, None)?;
    group_of(connection, device)
}

/// The quorum group of a replica `connection` to its lighthouse made (a launched worker's,
/// which presented its declaration).
pub(crate) fn group_of<B: Backend>(
    connection: Connection,
    device: &B::Device,
) -> Result<QuorumGroup<B>, ParallelError> {
    QuorumGroup::new(
        connection.coordinator,
        connection.session,
        connection.replicas,
        connection.timeout,
        device,
    )
}
