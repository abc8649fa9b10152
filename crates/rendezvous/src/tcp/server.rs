//! [`LighthouseServer`]: a lighthouse served over TCP, one thread per connection (a replica's,
//! or a launcher asking for the settled restart policy).

use std::io::{BufReader, BufWriter};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{
    ADDRESSES, ANNOUNCE, ASK_POLICY, COLLECTIVE, DONE, END_RUN, HELLO, LEAVE, PEERS, RECEIVE_STATE,
    REPLY, RUN_ENDED, SEND_STATE, STATE, WELCOME, decode_op, decode_policy, error_frame, io_error,
    policy_frame, protocol, read_frame, send,
};
use crate::lighthouse::Session;
use crate::wire::{Frame, put_bytes, put_f32s, put_u64};
use crate::{Declaration, Lighthouse, QuorumConfig, RendezvousError};

/// A [`Lighthouse`] served over TCP; stops accepting connections when dropped.
pub struct LighthouseServer {
    lighthouse: Arc<Lighthouse>,
    address: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl LighthouseServer {
    /// Serves a new lighthouse for `config` on `address` (e.g. `"127.0.0.1:0"` for a free
    /// port: read it back with [`address`](Self::address)).
    pub fn bind(
        address: impl ToSocketAddrs,
        config: QuorumConfig,
    ) -> Result<Self, RendezvousError> {
        Self::bind_with_token(address, config, None)
    }

    /// [`bind`](Self::bind), admitting only replicas that present `token` (a shared secret,
    /// see [`connect`]); `None` admits any.
    pub fn bind_with_token(
        address: impl ToSocketAddrs,
        config: QuorumConfig,
        token: Option<String>,
    ) -> Result<Self, RendezvousError> {
        let lighthouse = Lighthouse::new(config)?;
        let token = Arc::new(token);
        let listener = TcpListener::bind(address).map_err(|e| io_error("bind", 0, e))?;
        let address = listener.local_addr().map_err(|e| io_error("bind", 0, e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (served, stopping) = (lighthouse.clone(), stop.clone());
        std::thread::Builder::new()
            .name("afterburner-lighthouse".into())
            .spawn(move || accept(listener, served, stopping, token))
            .map_err(|e| io_error("bind", 0, e))?;
        tracing::info!(%address, replicas = config.replicas, "lighthouse listening");
        Ok(Self {
            lighthouse,
            address,
            stop,
        })
    }

    /// Where replicas connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The lighthouse served (its membership, or replicas of this process).
    pub fn lighthouse(&self) -> &Arc<Lighthouse> {
        &self.lighthouse
    }
}

impl Drop for LighthouseServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.address); // wakes the accept loop
    }
}

fn accept(
    listener: TcpListener,
    lighthouse: Arc<Lighthouse>,
    stop: Arc<AtomicBool>,
    token: Arc<Option<String>>,
) {
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let (lighthouse, token) = (lighthouse.clone(), token.clone());
        let _ = std::thread::Builder::new()
            .name("afterburner-lighthouse-replica".into())
            .spawn(move || serve(stream, &lighthouse, token.as_deref()));
    }
}

/// The declaration a hello carries: a flag, then the policy and the strategy's name.
fn read_declaration(hello: &mut Frame) -> Result<Option<Declaration>, RendezvousError> {
    if hello.u8()? == 0 {
        return Ok(None);
    }
    let policy = decode_policy(hello.u8()?)?
        .ok_or_else(|| protocol(0, "a declaration without a restart policy".into()))?;
    let strategy = String::from_utf8_lossy(&hello.bytes()?).into_owned();
    Ok(Some(Declaration { strategy, policy }))
}

/// Whether a hello's `presented` token (the rest of the frame) admits it under `token`.
fn admitted(token: Option<&str>, hello: &mut Frame) -> bool {
    let Some(token) = token else {
        return true;
    };
    let presented = match hello.is_done() {
        true => Vec::new(),
        false => hello.bytes().unwrap_or_default(),
    };
    // Compared in full whatever the first difference (no early exit to time).
    presented.len() == token.len()
        && presented
            .iter()
            .zip(token.as_bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// One connection: a replica's (a hello, then requests until it leaves or the connection
/// closes), or a launcher's question about the restart policy.
fn serve(stream: TcpStream, lighthouse: &Lighthouse, token: Option<&str>) {
    let _ = stream.set_nodelay(true);
    let Ok(write_half) = stream.try_clone() else {
        return;
    };
    let (mut reader, mut writer) = (BufReader::new(stream), BufWriter::new(write_half));
    let Ok(mut hello) = read_frame(&mut reader).map(|bytes| Frame::new("a hello", bytes)) else {
        return; // not a replica (e.g. the server waking its own accept loop)
    };
    let (asking, replica, declaration) = match hello.u8() {
        Ok(HELLO) => (false, hello.u64(), read_declaration(&mut hello)),
        Ok(ASK_POLICY) => (true, Ok(0), Ok(None)),
        _ => return,
    };
    if !admitted(token, &mut hello) {
        let refused = RendezvousError::InvalidConfig {
            field: "AFTERBURNER_TOKEN",
            value: "a token that does not match the lighthouse's (or none)".into(),
            expected: "the token the lighthouse was started with (the same \
                       AFTERBURNER_TOKEN on every host)"
                .into(),
        };
        tracing::warn!("a connection presented a wrong token: refused");
        let _ = send(&mut writer, &error_frame(&refused));
        return;
    }
    if asking {
        let _ = send(
            &mut writer,
            &policy_frame(lighthouse.restart_policy().as_ref()),
        );
        return;
    }
    let session = replica.and_then(|replica| {
        let replica = replica as usize;
        if let Some(declaration) = declaration? {
            lighthouse.declare(replica, &declaration)?;
        }
        lighthouse.connect(replica)
    });
    let session = match session {
        Ok(session) => session,
        Err(error) => {
            let _ = send(&mut writer, &error_frame(&error));
            return;
        }
    };
    let mut welcome = vec![WELCOME];
    put_u64(&mut welcome, session.number);
    welcome.push(u8::from(session.joining));
    put_u64(&mut welcome, lighthouse.config().replicas as u64);
    put_u64(&mut welcome, lighthouse.config().timeout.as_micros() as u64);
    if send(&mut writer, &welcome).is_err() {
        lighthouse.leave(&session, "its connection closed");
        return;
    }
    loop {
        let request = match read_frame(&mut reader) {
            Ok(frame) => frame,
            Err(_) => {
                let reason = "its connection closed (the process exited or was killed)";
                tracing::warn!(replica = session.replica, "{reason}");
                lighthouse.leave(&session, reason);
                return;
            }
        };
        let answer = match answer(
            lighthouse,
            &session,
            Frame::new("a lighthouse message", request),
        ) {
            Ok(Some(answer)) => answer,
            Ok(None) => return, // left
            Err(error) => error_frame(&error),
        };
        if send(&mut writer, &answer).is_err() {
            lighthouse.leave(&session, "its connection closed");
            return;
        }
    }
}

/// The answer to one request (`None` once the replica left).
fn answer(
    lighthouse: &Lighthouse,
    session: &Session,
    mut request: Frame,
) -> Result<Option<Vec<u8>>, RendezvousError> {
    match request.u8()? {
        COLLECTIVE => {
            let seq = request.u64()?;
            let op = decode_op(request.u8()?, request.u64()?)?;
            let values = match request.u8()? {
                0 => None,
                _ => Some(request.f32s()?),
            };
            let reply = lighthouse.collective(session, seq, op, values)?;
            let mut out = vec![REPLY, u8::from(reply.donate)];
            put_u64(&mut out, reply.generation);
            put_u64(&mut out, reply.members.len() as u64);
            reply
                .members
                .iter()
                .for_each(|m| put_u64(&mut out, *m as u64));
            put_u64(&mut out, reply.values.len() as u64);
            reply.values.iter().for_each(|v| put_f32s(&mut out, v));
            Ok(Some(out))
        }
        SEND_STATE => {
            let next_seq = request.u64()?;
            let bytes = request.bytes()?;
            lighthouse.send_state(session, next_seq, bytes)?;
            Ok(Some(vec![DONE]))
        }
        RECEIVE_STATE => match lighthouse.receive_state(session) {
            Ok(donation) => {
                let mut out = vec![STATE];
                put_u64(&mut out, donation.next_seq);
                put_bytes(&mut out, &donation.bytes);
                Ok(Some(out))
            }
            Err(RendezvousError::RunEnded { step, .. }) => {
                let mut out = vec![RUN_ENDED];
                put_u64(&mut out, step);
                Ok(Some(out))
            }
            Err(error) => Err(error),
        },
        END_RUN => {
            lighthouse.end_run(session, request.u64()?)?;
            Ok(Some(vec![DONE]))
        }
        ANNOUNCE => {
            let address = String::from_utf8_lossy(&request.bytes()?).into_owned();
            lighthouse.announce(session, &address)?;
            Ok(Some(vec![DONE]))
        }
        PEERS => {
            let replicas = (0..request.u64()?)
                .map(|_| request.u64().map(|r| r as usize))
                .collect::<Result<Vec<_>, _>>()?;
            let peers = lighthouse.peers(session, &replicas)?;
            let mut out = vec![ADDRESSES];
            put_u64(&mut out, peers.len() as u64);
            for (replica, address) in peers {
                put_u64(&mut out, replica as u64);
                put_bytes(&mut out, address.as_bytes());
            }
            Ok(Some(out))
        }
        LEAVE => {
            let reason = String::from_utf8_lossy(&request.bytes()?).into_owned();
            lighthouse.leave(session, &reason);
            Ok(None)
        }
        tag => Err(protocol(session.replica, format!("unknown request {tag}"))),
    }
}
