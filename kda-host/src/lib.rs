//! # kda-host
//!
//! The desktop side of kda: layers and caches that own their memory, a runner that owns its
//! workspace, seeded synthetic weights for demos and benchmarks, and the `kda` command-line tool.
//! Everything numeric is done by [`kda_core`]; this crate only allocates and orchestrates.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod cache;
pub mod layer;
pub mod rng;

pub use cache::SequenceCaches;
pub use layer::{HostError, OwnedLayer, Runner, WeightDtype};
