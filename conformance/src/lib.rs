//! The shared conformance suite of the distlock family.
//!
//! - [`harness`]: the [`Target`] a driver implements in its tests, the
//!   [`Harness`] cases run against, and [`MemoryTarget`].
//! - [`process`] and [`servers`]: real servers on loopback, started from
//!   binaries on PATH in temporary directories, with pause / kill / restart.

pub mod harness;
pub mod process;
pub mod servers;

pub use harness::{Harness, MemoryTarget, SuiteConfig, Target};
pub use process::{HarnessError, OrSkip};
