//! Developer tasks' library part: the backend suite, shared by `cargo xtask gpu-check` and the
//! backend tests (`xtask/tests/backend_suite.rs`).

pub mod suite;
