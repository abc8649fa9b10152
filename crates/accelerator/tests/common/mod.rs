//! Helpers shared by the integration tests: afterburner-demos' `testing` module.
#![allow(unused_imports)]

pub use afterburner_demos::testing::*;
