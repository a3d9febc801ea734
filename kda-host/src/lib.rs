//! # kda-host
//!
//! The desktop side of kda: loading KDA layers from Kimi Linear / Kimi K3 checkpoints
//! (memory-mapped safetensors, used in place), layers and caches that own their memory, a
//! runner that owns its workspace, the file formats of the `kda` tool, seeded synthetic weights
//! for demos and benchmarks. Everything numeric is done by [`kda_core`]; this crate only loads,
//! allocates and orchestrates.
//!
//! ```
//! use kda_host::checkpoint::config::Layout;
//! use kda_host::checkpoint::export::{export_dir, ExportOptions};
//! use kda_host::rng::Rng;
//! use kda_host::{Mode, Model, OwnedLayer, Runner, WeightDtype};
//!
//! // A one-layer Kimi Linear checkpoint folder (`config.json` + `model.safetensors`) holding
//! // seeded random bf16 weights: hidden 16, 2 heads of dim 8.
//! let cfg = kda_core::KdaConfig::kimi_linear(16, 2, 8);
//! let layer = OwnedLayer::random(cfg, WeightDtype::Bf16, 1)?;
//! let dir = std::env::temp_dir().join(format!("kda-host-doc-{}", std::process::id()));
//! export_dir(&dir, &[(0, &layer)], &ExportOptions::published(Layout::KimiLinear, 1))?;
//!
//! // Load it (the weights stay in the memory-mapped file), make a cache for one sequence and
//! // a runner (it owns the workspace, grown as calls need).
//! let model = Model::open(&dir)?;
//! let hd = model.config().hidden;
//! let mut cache = model.new_cache(1)?;
//! let mut runner = Runner::default();
//!
//! // A prompt of 4 tokens through model layer 0, then one decode step.
//! let x = Rng::new(2).normals(5 * hd, 1.0);
//! let prompt = model.forward(&mut runner, 0, &x[..4 * hd], &[0, 4], &mut cache, Mode::Recurrent)?;
//! let next = model.decode(&mut runner, 0, &x[4 * hd..], &mut cache)?;
//!
//! // The same as one forward over all 5 tokens, bit for bit, caches included.
//! let mut whole_cache = model.new_cache(1)?;
//! let whole = model.forward(&mut runner, 0, &x, &[0, 5], &mut whole_cache, Mode::Recurrent)?;
//! let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
//! assert_eq!(bits(&[prompt, next].concat()), bits(&whole));
//! assert_eq!(cache, whole_cache);
//! std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
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
pub mod format_label;
pub mod fsio;
pub mod io;
pub mod layer;
pub mod log;
pub mod model;
pub mod panels;
pub mod parallel;
pub mod quantize;
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

/// The README's Rust examples, run as doctests so the published page stays correct.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
