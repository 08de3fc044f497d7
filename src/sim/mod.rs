//! Crash testing: a simulated disk, a harness that crashes it at every I/O step,
//! and the check functions shared by the tests and the fuzz targets.
//!
//! Compiled only with the `testing` feature. Nothing here is for production use.

pub mod bugs;
mod disk;
pub mod harness;

pub use bugs::Bug;
pub use disk::{CrashModel, DiskStats, Fault, FaultRule, Rng, SECTOR, SimDisk};
