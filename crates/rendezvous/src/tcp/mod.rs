//! The lighthouse over TCP, for replicas in separate processes: [`LighthouseServer`] serves a
//! [`Lighthouse`](crate::Lighthouse) (one thread per replica connection), [`connect`] gives a
//! replica its [`Connection`] (afterburner-collectives' `connect_tcp` wraps it in a process
//! group), [`ask_restart_policy`] tells a launcher on another node the policy the workers
//! settled. A replica whose connection closes (its process exited or was killed) is dropped
//! from the group at once. Messages are length-prefixed little-endian frames; values travel
//! as f32.

mod client;
mod server;

use std::io::{self, Read, Write};

pub use client::{Connection, ask_restart_policy, connect};
pub use server::LighthouseServer;

use crate::RendezvousError;
use crate::round::Op;
use crate::wire::{put_bytes, put_u64};
use crate::{RestartPolicy, Settled};

/// The largest frame accepted (a corrupt length must not allocate the machine away).
const MAX_FRAME: u64 = 1 << 34;

const HELLO: u8 = 1;
/// A launcher asking which restart policy the workers settled (no replica).
const ASK_POLICY: u8 = 6;
const COLLECTIVE: u8 = 2;
const SEND_STATE: u8 = 3;
const RECEIVE_STATE: u8 = 4;
const LEAVE: u8 = 5;
const ANNOUNCE: u8 = 7;
const PEERS: u8 = 8;
/// A replica saying the run ended at a step.
const END_RUN: u8 = 9;
const WELCOME: u8 = 10;
const REPLY: u8 = 11;
const DONE: u8 = 12;
const STATE: u8 = 13;
const ERROR: u8 = 14;
const POLICY: u8 = 15;
const ADDRESSES: u8 = 16;
/// The answer to [`RECEIVE_STATE`] when the run ended first: the step it ended at.
const RUN_ENDED: u8 = 17;

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

/// A restart policy on the wire: 0 none (open), 1 all, 2 replica.
fn encode_policy(policy: Option<RestartPolicy>) -> u8 {
    match policy {
        None => 0,
        Some(RestartPolicy::All) => 1,
        Some(RestartPolicy::Replica) => 2,
    }
}

fn decode_policy(code: u8) -> Result<Option<RestartPolicy>, RendezvousError> {
    match code {
        0 => Ok(None),
        1 => Ok(Some(RestartPolicy::All)),
        2 => Ok(Some(RestartPolicy::Replica)),
        _ => Err(protocol(0, format!("unknown restart policy {code}"))),
    }
}

/// The answer to [`ASK_POLICY`]: the settled policy and who settled it.
fn policy_frame(settled: Option<&Settled>) -> Vec<u8> {
    let mut out = vec![POLICY, encode_policy(settled.map(|s| s.policy))];
    put_bytes(&mut out, settled.map_or("", |s| s.by.as_str()).as_bytes());
    out
}
