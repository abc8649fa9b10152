//! A live replica's state for a joining one: the model (parameters and their ids), the
//! optimizer state, the strategy's own state, the step and the caller's attachment
//! ([`Quorum::attach`]: the Accelerator's loss scale), encoded in one message. The
//! replica strategies send it after a sync when the group asks
//! ([`donate_live_state`]) and a joining replica loads it ([`receive_live_state`]).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;

use crate::Quorum;
use crate::{ParallelError, StrategyState};
use afterburner_rendezvous::wire::{Frame, put_bytes, put_f32s, put_u64};

/// How records are encoded in the live state (full precision: the joiner gets every bit).
type Codec = NamedMpkBytesRecorder<FullPrecisionSettings>;

/// The first bytes of a live state (format version 2: with the caller's attachment).
const MAGIC: &[u8; 8] = b"ABLIVE02";

/// If a joining replica waits for this replica's state (`quorum` asked it at a collective),
/// sends `model`, `optimizer`'s state, the strategy's `own_state` and `step`; else nothing.
/// Call it right after a sync, where every replica holds the same global state.
pub fn donate_live_state<B, M, O>(
    quorum: Option<Arc<dyn Quorum>>,
    model: &M,
    optimizer: &O,
    own_state: impl FnOnce() -> Result<StrategyState, ParallelError>,
    step: u64,
) -> Result<(), ParallelError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    let Some(quorum) = quorum.filter(|q| q.state_requested()) else {
        return Ok(());
    };
    let record = |what: &str, e: burn::record::RecorderError| {
        ParallelError::Record(format!("encoding the live {what}: {e}"))
    };
    let model_bytes = Recorder::<B>::record(&Codec::default(), model.clone().into_record(), ())
        .map_err(|e| record("model", e))?;
    let optimizer_bytes = Recorder::<B>::record(&Codec::default(), optimizer.to_record(), ())
        .map_err(|e| record("optimizer state", e))?;
    let strategy = own_state()?;
    let mut out = MAGIC.to_vec();
    put_u64(&mut out, step);
    put_bytes(&mut out, &model_bytes);
    put_bytes(&mut out, &optimizer_bytes);
    put_u64(&mut out, strategy.counters.len() as u64);
    for (name, value) in &strategy.counters {
        put_bytes(&mut out, name.as_bytes());
        put_u64(&mut out, *value);
    }
    put_u64(&mut out, strategy.tensors.len() as u64);
    for (name, values) in &strategy.tensors {
        put_bytes(&mut out, name.as_bytes());
        put_f32s(&mut out, values);
    }
    put_bytes(&mut out, &quorum.attached());
    tracing::info!(
        replica = quorum.replica(),
        step,
        bytes = out.len(),
        "sending the live state to the replica(s) joining"
    );
    quorum.send_state(out)
}

/// On a joining replica: waits for a live replica's state and returns `model` with its
/// parameters (values and ids), `optimizer` loaded with its state, the strategy's own state to
/// load, and the step the live replica had reached (training continues after it).
pub fn receive_live_state<B, M, O>(
    quorum: &dyn Quorum,
    model: M,
    optimizer: &mut O,
    device: &B::Device,
) -> Result<(M, StrategyState, u64), ParallelError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    let mut state = Frame::new("a live state", quorum.receive_state()?);
    for byte in MAGIC {
        if state.u8()? != *byte {
            return Err(ParallelError::Record(
                "the live state does not start with afterburner's header (another program?)".into(),
            ));
        }
    }
    let step = state.u64()?;
    let model_bytes = state.bytes()?;
    let optimizer_bytes = state.bytes()?;
    let mut strategy = StrategyState::default();
    for _ in 0..state.u64()? {
        let name = String::from_utf8_lossy(&state.bytes()?).into_owned();
        strategy.counters.push((name, state.u64()?));
    }
    for _ in 0..state.u64()? {
        let name = String::from_utf8_lossy(&state.bytes()?).into_owned();
        strategy.tensors.push((name, state.f32s()?));
    }
    quorum.attach(state.bytes()?);
    if !state.is_done() {
        return Err(ParallelError::Record(
            "the live state holds bytes after its end".into(),
        ));
    }
    let record = |what: &str, e: burn::record::RecorderError| {
        ParallelError::Record(format!("decoding the live {what}: {e}"))
    };
    let model_record = Recorder::<B>::load(&Codec::default(), model_bytes, device)
        .map_err(|e| record("model", e))?;
    let model =
        catch_unwind(AssertUnwindSafe(|| model.load_record(model_record))).map_err(|_| {
            ParallelError::Mismatch {
                rank: quorum.replica(),
                reason: "the live replica's model has another structure than this one's".into(),
            }
        })?;
    let optimizer_record = Recorder::<B>::load(&Codec::default(), optimizer_bytes, device)
        .map_err(|e| record("optimizer state", e))?;
    *optimizer = optimizer.clone().load_record(optimizer_record);
    Ok((model, strategy, step))
}
