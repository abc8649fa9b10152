//! The lighthouse over TCP, for replicas in separate processes: [`LighthouseServer`] serves a
//! [`Lighthouse`] (one thread per replica connection), [`connect`] gives a replica its
//! [`Connection`] (afterburner-parallel's `connect_tcp` wraps it in a process group). A
//! replica whose connection closes (its process exited or was killed) is dropped from the
//! group at once. Messages are length-prefixed little-endian frames; values travel as f32.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::coordinator::Coordinator;
use crate::lighthouse::{Donation, Reply, Session};
use crate::round::Op;
use crate::wire::{Frame, put_bytes, put_f32s, put_u64};
use crate::{Lighthouse, QuorumConfig, RendezvousError};

/// The largest frame accepted (a corrupt length must not allocate the machine away).
const MAX_FRAME: u64 = 1 << 34;

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

/// One replica's connection: a hello, then requests until it leaves or the connection closes.
fn serve(stream: TcpStream, lighthouse: &Lighthouse, token: Option<&str>) {
    let _ = stream.set_nodelay(true);
    let Ok(write_half) = stream.try_clone() else {
        return;
    };
    let (mut reader, mut writer) = (BufReader::new(stream), BufWriter::new(write_half));
    let Ok(mut hello) = read_frame(&mut reader).map(|bytes| Frame::new("a hello", bytes)) else {
        return; // not a replica (e.g. the server waking its own accept loop)
    };
    if hello.u8() != Ok(HELLO) {
        return;
    }
    let replica = hello.u64();
    if !admitted(token, &mut hello) {
        let refused = RendezvousError::InvalidConfig {
            field: "AFTERBURNER_TOKEN",
            value: "a token that does not match the lighthouse's (or none)".into(),
            expected: "the token the lighthouse was started with (the same \
                       AFTERBURNER_TOKEN on every host)"
                .into(),
        };
        tracing::warn!("a replica presented a wrong token: refused");
        let _ = send(&mut writer, &error_frame(&refused));
        return;
    }
    let session = replica.and_then(|replica| lighthouse.connect(replica as usize));
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
        RECEIVE_STATE => {
            let donation = lighthouse.receive_state(session)?;
            let mut out = vec![STATE];
            put_u64(&mut out, donation.next_seq);
            put_bytes(&mut out, &donation.bytes);
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

/// A replica admitted by a [`LighthouseServer`]: what its process group calls, its session and
/// the number of replicas the lighthouse serves.
pub struct Connection {
    /// The connection, as the calls a replica's group makes.
    pub coordinator: Arc<dyn Coordinator>,
    /// The replica's admission (a founding member, or a joiner).
    pub session: Session,
    /// The replicas the lighthouse serves.
    pub replicas: usize,
}

/// Connects replica `replica` to the lighthouse at `address` (retrying for up to `wait` while
/// the lighthouse starts), presenting `token` to a lighthouse served with
/// [`LighthouseServer::bind_with_token`] (a wrong or missing one is refused with an error
/// naming `AFTERBURNER_TOKEN`).
pub fn connect(
    address: impl ToSocketAddrs,
    replica: usize,
    wait: Duration,
    token: Option<&str>,
) -> Result<Connection, RendezvousError> {
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
    let client = TcpCoordinator {
        stream: Mutex::new(stream),
        replica,
    };
    let mut hello = vec![HELLO];
    put_u64(&mut hello, replica as u64);
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
    Ok(Connection {
        coordinator: Arc::new(client),
        session,
        replicas,
    })
}

/// A replica's connection to a [`LighthouseServer`].
struct TcpCoordinator {
    stream: Mutex<TcpStream>,
    replica: usize,
}

impl TcpCoordinator {
    /// Sends `request` and reads the answer, which must carry tag `expected`.
    fn request(&self, request: &[u8], expected: u8) -> Result<Frame, RendezvousError> {
        let mut stream = self.stream.lock().unwrap_or_else(PoisonError::into_inner);
        let replica = self.replica;
        send(&mut *stream, request).map_err(|e| io_error("lighthouse", replica, e))?;
        let mut answer = Frame::new(
            "a lighthouse message",
            read_frame(&mut *stream).map_err(|e| io_error("lighthouse", replica, e))?,
        );
        match answer.u8()? {
            tag if tag == expected => Ok(answer),
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
        let mut state = self.request(&[RECEIVE_STATE], STATE)?;
        Ok(Donation {
            next_seq: state.u64()?,
            bytes: Arc::new(state.bytes()?),
        })
    }

    fn leave(&self, _session: &Session, reason: &str) {
        let mut out = vec![LEAVE];
        put_bytes(&mut out, reason.as_bytes());
        let mut stream = self.stream.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = send(&mut *stream, &out);
    }
}

const HELLO: u8 = 1;
const COLLECTIVE: u8 = 2;
const SEND_STATE: u8 = 3;
const RECEIVE_STATE: u8 = 4;
const LEAVE: u8 = 5;
const WELCOME: u8 = 10;
const REPLY: u8 = 11;
const DONE: u8 = 12;
const STATE: u8 = 13;
const ERROR: u8 = 14;

fn encode_op(op: Op) -> (u8, u64) {
    match op {
        Op::Sum => (0, 0),
        Op::Mean => (1, 0),
        Op::Broadcast(root) => (2, root as u64),
        Op::Gather => (3, 0),
    }
}

fn decode_op(code: u8, root: u64) -> Result<Op, RendezvousError> {
    match code {
        0 => Ok(Op::Sum),
        1 => Ok(Op::Mean),
        2 => Ok(Op::Broadcast(root as usize)),
        3 => Ok(Op::Gather),
        _ => Err(protocol(0, format!("unknown collective {code}"))),
    }
}

fn error_frame(error: &RendezvousError) -> Vec<u8> {
    let (rank, reason) = match error {
        RendezvousError::Collective { rank, reason, .. } => (*rank, reason.clone()),
        RendezvousError::Mismatch { rank, reason } => (*rank, reason.clone()),
        RendezvousError::Timeout { rank, .. } | RendezvousError::PeerFailed { rank, .. } => {
            (*rank, error.to_string())
        }
        other => (0, other.to_string()),
    };
    let mut out = vec![ERROR];
    put_u64(&mut out, rank as u64);
    put_bytes(&mut out, reason.as_bytes());
    out
}

fn io_error(op: &'static str, rank: usize, error: io::Error) -> RendezvousError {
    RendezvousError::Collective {
        op,
        rank,
        reason: format!("lighthouse connection: {error}"),
    }
}

fn protocol(rank: usize, reason: String) -> RendezvousError {
    RendezvousError::Collective {
        op: "lighthouse",
        rank,
        reason: format!("protocol error: {reason}"),
    }
}

fn send(writer: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    writer.write_all(&(payload.len() as u64).to_le_bytes())?;
    writer.write_all(payload)?;
    writer.flush()
}

fn read_frame(reader: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 8];
    reader.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes"),
        ));
    }
    let mut payload = vec![0u8; len as usize];
    reader.read_exact(&mut payload)?;
    Ok(payload)
}
