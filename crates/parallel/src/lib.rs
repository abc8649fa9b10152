//! Data parallel training for Burn: a process-group interface (rank, world size,
//! collectives) over burn-collective (threads in one process) and MPI (processes and nodes),
//! DDP and FSDP strategies, a distributed sampler and a launcher.
//!
//! Not built yet: this crate is empty until its issue ("Multi-device and multi-node data
//! parallel") lands. It holds no API today, on purpose.
