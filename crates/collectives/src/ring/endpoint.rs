//! [`Endpoint`]: where a member accepts its ring predecessor's connection. A listener thread
//! reads each connection's greeting (who connects, for which generation) and keeps it until
//! the ring of that generation takes it.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::ParallelError;

/// The first bytes of every ring connection (a stray connection is told apart).
const MAGIC: &[u8; 8] = b"ABRING01";

/// How long an accepted connection may take to greet.
const GREETING_TIMEOUT: Duration = Duration::from_secs(10);

/// A greeted connection: from which replica, for which generation.
struct Greeted {
    from: usize,
    generation: u64,
    stream: TcpStream,
}

#[derive(Default)]
struct Inbox {
    greeted: Vec<Greeted>,
}

/// A member's listener for ring connections; stops when dropped.
pub(crate) struct Endpoint {
    address: SocketAddr,
    inbox: Arc<(Mutex<Inbox>, Condvar)>,
    stop: Arc<AtomicBool>,
}

impl Endpoint {
    /// Listens on `ip` (a free port) and accepts greetings on a thread.
    pub fn bind(ip: IpAddr, rank: usize) -> Result<Self, ParallelError> {
        let io = |e: std::io::Error| ParallelError::Collective {
            op: "ring",
            rank,
            reason: format!("cannot listen for ring peers on {ip}: {e}"),
        };
        let listener = TcpListener::bind((ip, 0)).map_err(io)?;
        let address = listener.local_addr().map_err(io)?;
        let inbox = Arc::new((Mutex::new(Inbox::default()), Condvar::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (filled, stopping) = (inbox.clone(), stop.clone());
        std::thread::Builder::new()
            .name("afterburner-ring-accept".into())
            .spawn(move || accept(listener, &filled, &stopping))
            .map_err(io)?;
        Ok(Self {
            address,
            inbox,
            stop,
        })
    }

    /// Where peers connect (`host:port`).
    pub fn address(&self) -> String {
        self.address.to_string()
    }

    /// Waits up to `timeout` for `from`'s connection for `generation`, dropping connections of
    /// older generations.
    pub fn take(
        &self,
        from: usize,
        generation: u64,
        timeout: Duration,
    ) -> Result<TcpStream, Option<u64>> {
        let (inbox, arrived) = &*self.inbox;
        let deadline = Instant::now() + timeout;
        let mut inbox = inbox.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            inbox.greeted.retain(|g| g.generation >= generation);
            if let Some(at) = inbox
                .greeted
                .iter()
                .position(|g| g.from == from && g.generation == generation)
            {
                return Ok(inbox.greeted.swap_remove(at).stream);
            }
            let now = Instant::now();
            if now >= deadline {
                let newer = inbox.greeted.iter().map(|g| g.generation).max();
                return Err(newer);
            }
            inbox = arrived
                .wait_timeout(inbox, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.address); // wakes the accept loop
    }
}

fn accept(listener: TcpListener, inbox: &Arc<(Mutex<Inbox>, Condvar)>, stop: &AtomicBool) {
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let inbox = inbox.clone();
        // A slow or stray connection must not hold up the next one's greeting.
        let _ = std::thread::Builder::new()
            .name("afterburner-ring-greeting".into())
            .spawn(move || greet(stream, &inbox));
    }
}

/// Reads `stream`'s greeting and puts it in `inbox` (a connection that does not greet as a
/// ring peer is closed).
fn greet(mut stream: TcpStream, inbox: &(Mutex<Inbox>, Condvar)) {
    let Some((from, generation)) = read_greeting(&mut stream) else {
        return;
    };
    let (inbox, arrived) = inbox;
    inbox
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .greeted
        .push(Greeted {
            from,
            generation,
            stream,
        });
    arrived.notify_all();
}

/// Connects to `address` as `from` for `generation` (retrying until `timeout`: the peer may
/// still be starting its listener).
pub(crate) fn connect(
    address: &str,
    from: usize,
    generation: u64,
    timeout: Duration,
) -> std::io::Result<TcpStream> {
    let deadline = Instant::now() + timeout;
    let mut stream = loop {
        match TcpStream::connect(address) {
            Ok(stream) => break stream,
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    stream.set_nodelay(true)?;
    let mut greeting = MAGIC.to_vec();
    greeting.extend_from_slice(&(from as u64).to_le_bytes());
    greeting.extend_from_slice(&generation.to_le_bytes());
    stream.write_all(&greeting)?;
    Ok(stream)
}

fn read_greeting(stream: &mut TcpStream) -> Option<(usize, u64)> {
    stream.set_read_timeout(Some(GREETING_TIMEOUT)).ok()?;
    let mut greeting = [0u8; 24];
    stream.read_exact(&mut greeting).ok()?;
    if &greeting[..8] != MAGIC {
        return None;
    }
    let from = u64::from_le_bytes(greeting[8..16].try_into().ok()?) as usize;
    let generation = u64::from_le_bytes(greeting[16..24].try_into().ok()?);
    stream.set_nodelay(true).ok()?;
    Some((from, generation))
}
