//! # kda-host
//!
//! The desktop side of kda: loading KDA layers from Kimi Linear / Kimi K3 checkpoints
//! (memory-mapped safetensors, used in place), layers and caches that own their memory, a
//! runner that owns its workspace, the file formats of the `kda` tool, seeded synthetic weights
//! for demos and benchmarks. Everything numeric is done by [`kda_core`]; this crate only loads,
//! allocates and orchestrates.
//!
//! * [`checkpoint`]: a checkpoint folder (`config.json` + `model.safetensors` or shards) →
//!   [`Model`]. [`checkpoint::config`] reads the config, [`checkpoint::layout`] the tensors of
//!   one layer, [`checkpoint::safetensors`] the files; [`checkpoint::export`] writes checkpoints.
//! * [`Model`] / [`ModelCache`]: every KDA layer of a checkpoint and their per-sequence caches.
//! * [`io`] and [`state_file`]: the input/output and state files of `kda forward`.
//! * [`fsio`]: how every file is read (regular files only, bounded, allocated fallibly) and
//!   written (streamed to a temporary, `fsync`ed, renamed into place).
//! * [`cli`]: the `kda` command line and the checks on its sizes and thread counts.
//! * [`bench`](mod@bench): the measurements behind `kda bench`.
//! * [`parallel`]: the rayon executor; layers run on the caller's rayon pool, with results
//!   bitwise identical for any number of threads.
//!
//! Every parser has an entry point taking bytes (the fuzz targets in `fuzz/` drive them), and
//! every error is a [`HostError`] whose message is one line naming the file, tensor or field.
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod bench;
pub mod cache;
pub mod checkpoint;
pub mod cli;
pub mod error;
pub mod fsio;
pub mod io;
pub mod layer;
pub mod log;
pub mod model;
pub mod panels;
pub mod parallel;
pub mod rng;
pub mod runner;
pub mod state_file;

pub use cache::SequenceCaches;
pub use checkpoint::Checkpoint;
pub use error::HostError;
pub use kda_core::Mode;
pub use layer::{OwnedData, OwnedGate, OwnedLayer, OwnedMat, WeightDtype};
pub use model::{Model, ModelCache, ModelLayer, ModelRollback, ModelSnapshots};
pub use panels::Panels;
pub use runner::Runner;
