//! Local SGD and DiLoCo for Burn, over `afterburner-parallel`'s collectives: workers step
//! alone and average parameters every K steps (DiLoCo adds an outer Nesterov step).
//!
//! Not built yet: this crate is empty until its issue lands. It holds no API today, on purpose.

#![warn(missing_docs)]
