//! A replica's side of the TCP lighthouse ([`connect`]), and a launcher's question about the
//! settled restart policy ([`ask_restart_policy`]).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{
    ADDRESSES, ANNOUNCE, ASK_POLICY, COLLECTIVE, DONE, END_RUN, ERROR, HELLO, LEAVE, PEERS, POLICY,
    RECEIVE_STATE, REPLY, RUN_ENDED, SEND_STATE, STATE, WELCOME, decode_policy, encode_op,
    encode_policy, io_error, protocol, read_frame, send,
};
use crate::coordinator::Coordinator;
use crate::lighthouse::{Donation, Reply, Session};
use crate::round::Op;
use crate::wire::{Frame, put_bytes, put_f32s, put_u64};
use crate::{Declaration, RendezvousError, Settled};

/// A replica admitted by a [`LighthouseServer`](super::LighthouseServer): what its process group calls, its session and
/// the number of replicas the lighthouse serves.
pub struct Connection {
    /// The connection, as the calls a replica's group makes.
    pub coordinator: Arc<dyn Coordinator>,
    /// The replica's admission (a founding member, or a joiner).
    pub session: Session,
    /// The replicas the lighthouse serves.
    pub replicas: usize,
    /// The lighthouse's collective timeout (a ring between the replicas waits as long).
    pub timeout: Duration,
}

/// Connects replica `replica` to the lighthouse at `address` (retrying for up to `wait` while
/// the lighthouse starts), presenting `token` to a lighthouse served with
/// [`LighthouseServer::bind_with_token`](super::LighthouseServer::bind_with_token) (a wrong or missing one is refused with an error
/// naming `AFTERBURNER_TOKEN`). A launched worker presents its `declaration` (the strategy it
/// runs and the restart policy it needs): a launch's lighthouse refuses a strategy that does
/// not fit the launch's policy with an error naming both.
pub fn connect(
    address: impl ToSocketAddrs,
    replica: usize,
    wait: Duration,
    token: Option<&str>,
    declaration: Option<&Declaration>,
) -> Result<Connection, RendezvousError> {
    let client = TcpCoordinator {
        stream: Mutex::new(reach(address, replica, wait)?),
        replica,
    };
    let mut hello = vec![HELLO];
    put_u64(&mut hello, replica as u64);
    match declaration {
        None => hello.push(0),
        Some(declaration) => {
            hello.extend([1, encode_policy(Some(declaration.policy))]);
            put_bytes(&mut hello, declaration.strategy.as_bytes());
        }
    }
    if let Some(token) = token {
        put_bytes(&mut hello, token.as_bytes());
    }
    let mut welcome = client.request(&hello, WELCOME)?;
    let session = Session {
        replica,
        number: welcome.u64()?,
        joining: welcome.u8()? != 0,
    };
    let replicas = welcome.u64()? as usize;
    let timeout = Duration::from_micros(welcome.u64()?);
    Ok(Connection {
        coordinator: Arc::new(client),
        session,
        replicas,
        timeout,
    })
}

/// The restart policy the workers of the launch served at `address` settled (`None` while no
/// worker has declared one and none was given), asked by a launcher of another node (retrying
/// for up to `wait` while the lighthouse starts).
pub fn ask_restart_policy(
    address: impl ToSocketAddrs,
    wait: Duration,
    token: Option<&str>,
) -> Result<Option<Settled>, RendezvousError> {
    let client = TcpCoordinator {
        stream: Mutex::new(reach(address, 0, wait)?),
        replica: 0,
    };
    let mut ask = vec![ASK_POLICY];
    if let Some(token) = token {
        put_bytes(&mut ask, token.as_bytes());
    }
    let mut answer = client.request(&ask, POLICY)?;
    let policy = decode_policy(answer.u8()?)?;
    let by = String::from_utf8_lossy(&answer.bytes()?).into_owned();
    Ok(policy.map(|policy| Settled { policy, by }))
}

/// A connection to the lighthouse at `address`, retried for up to `wait` while it starts.
fn reach(
    address: impl ToSocketAddrs,
    replica: usize,
    wait: Duration,
) -> Result<TcpStream, RendezvousError> {
    let addresses: Vec<SocketAddr> = address
        .to_socket_addrs()
        .map_err(|e| io_error("connect", replica, e))?
        .collect();
    let deadline = Instant::now() + wait;
    let stream = loop {
        match TcpStream::connect(addresses.as_slice()) {
            Ok(stream) => break stream,
            Err(e) if Instant::now() >= deadline => return Err(io_error("connect", replica, e)),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// A replica's connection to a [`LighthouseServer`](super::LighthouseServer).
struct TcpCoordinator {
    stream: Mutex<TcpStream>,
    replica: usize,
}

impl TcpCoordinator {
    /// Sends `request` and reads the answer, which must carry tag `expected`.
    fn request(&self, request: &[u8], expected: u8) -> Result<Frame, RendezvousError> {
        self.request_one_of(request, &[expected])
            .map(|(_, frame)| frame)
    }

    /// Sends `request` and reads the answer, whose tag must be one of `expected`.
    fn request_one_of(
        &self,
        request: &[u8],
        expected: &[u8],
    ) -> Result<(u8, Frame), RendezvousError> {
        let mut stream = self.stream.lock().unwrap_or_else(PoisonError::into_inner);
        let replica = self.replica;
        send(&mut *stream, request).map_err(|e| io_error("lighthouse", replica, e))?;
        let mut answer = Frame::new(
            "a lighthouse message",
            read_frame(&mut *stream).map_err(|e| io_error("lighthouse", replica, e))?,
        );
        match answer.u8()? {
            tag if expected.contains(&tag) => Ok((tag, answer)),
            ERROR => {
                let rank = answer.u64()? as usize;
                let reason = String::from_utf8_lossy(&answer.bytes()?).into_owned();
                Err(RendezvousError::Collective {
                    op: "lighthouse",
                    rank,
                    reason,
                })
            }
            tag => Err(protocol(replica, format!("unexpected answer {tag}"))),
        }
    }
}

impl Coordinator for TcpCoordinator {
    /// A look at the connection without waiting: closed by the lighthouse's side (the end of
    /// the stream) or broken is lost; nothing to read is alive. Skipped while a request holds
    /// the connection (it would see a loss itself).
    fn lost(&self) -> Option<String> {
        let stream = self.stream.try_lock().ok()?;
        stream.set_nonblocking(true).ok()?;
        let mut byte = [0u8; 1];
        let looked = stream.peek(&mut byte);
        let _ = stream.set_nonblocking(false);
        let address = stream
            .peer_addr()
            .map_or_else(|_| "its address".to_string(), |a| a.to_string());
        match looked {
            Ok(0) => Some(format!(
                "the lighthouse at {address} closed the connection (the process serving it, \
                 node 0's launcher under `afterburner launch`, exited or was killed)"
            )),
            Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => Some(format!(
                "the connection to the lighthouse at {address} failed: {e}"
            )),
            _ => None,
        }
    }

    fn collective(
        &self,
        _session: &Session,
        seq: u64,
        op: Op,
        values: Option<Vec<f32>>,
    ) -> Result<Reply, RendezvousError> {
        let mut out = vec![COLLECTIVE];
        put_u64(&mut out, seq);
        let (code, root) = encode_op(op);
        out.push(code);
        put_u64(&mut out, root);
        match &values {
            None => out.push(0),
            Some(values) => {
                out.push(1);
                put_f32s(&mut out, values);
            }
        }
        let mut reply = self.request(&out, REPLY)?;
        let donate = reply.u8()? != 0;
        let generation = reply.u64()?;
        let members = (0..reply.u64()?)
            .map(|_| reply.u64().map(|m| m as usize))
            .collect::<Result<_, _>>()?;
        let values = (0..reply.u64()?)
            .map(|_| reply.f32s())
            .collect::<Result<_, _>>()?;
        Ok(Reply {
            values,
            members,
            donate,
            generation,
        })
    }

    fn send_state(
        &self,
        _session: &Session,
        next_seq: u64,
        bytes: Vec<u8>,
    ) -> Result<(), RendezvousError> {
        let mut out = vec![SEND_STATE];
        put_u64(&mut out, next_seq);
        put_bytes(&mut out, &bytes);
        self.request(&out, DONE).map(|_| ())
    }

    fn receive_state(&self, _session: &Session) -> Result<Donation, RendezvousError> {
        let (tag, mut state) = self.request_one_of(&[RECEIVE_STATE], &[STATE, RUN_ENDED])?;
        match tag {
            RUN_ENDED => Err(RendezvousError::RunEnded {
                rank: self.replica,
                step: state.u64()?,
            }),
            _ => Ok(Donation {
                next_seq: state.u64()?,
                bytes: Arc::new(state.bytes()?),
            }),
        }
    }

    fn end_run(&self, _session: &Session, step: u64) -> Result<(), RendezvousError> {
        let mut out = vec![END_RUN];
        put_u64(&mut out, step);
        self.request(&out, DONE).map(|_| ())
    }

    fn leave(&self, _session: &Session, reason: &str) {
        let mut out = vec![LEAVE];
        put_bytes(&mut out, reason.as_bytes());
        let mut stream = self.stream.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = send(&mut *stream, &out);
    }

    fn announce(&self, _session: &Session, address: &str) -> Result<(), RendezvousError> {
        let mut out = vec![ANNOUNCE];
        put_bytes(&mut out, address.as_bytes());
        self.request(&out, DONE).map(|_| ())
    }

    fn peers(
        &self,
        _session: &Session,
        replicas: &[usize],
    ) -> Result<BTreeMap<usize, String>, RendezvousError> {
        let mut out = vec![PEERS];
        put_u64(&mut out, replicas.len() as u64);
        replicas.iter().for_each(|r| put_u64(&mut out, *r as u64));
        let mut answer = self.request(&out, ADDRESSES)?;
        (0..answer.u64()?)
            .map(|_| {
                let replica = answer.u64()? as usize;
                let address = String::from_utf8_lossy(&answer.bytes()?).into_owned();
                Ok((replica, address))
            })
            .collect()
    }

    fn local_ip(&self) -> IpAddr {
        let stream = self.stream.lock().unwrap_or_else(PoisonError::into_inner);
        stream
            .local_addr()
            .map_or(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), |a| a.ip())
    }
}
