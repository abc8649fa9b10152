//! Developer tasks' library part, shared by `cargo xtask` and the backend tests
//! (`xtask/tests/backend_suite.rs`): the backend suite and device memory figures.

pub mod memory;
pub mod suite;
