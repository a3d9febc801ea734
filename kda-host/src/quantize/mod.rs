//! `kda quantize`: the KDA layers of a bf16 / f16 / f32 Kimi Linear checkpoint folder written
//! as a GGUF file, with llama.cpp's tensor names and metadata and its reference quantisers'
//! bytes.
//!
//! The checkpoint opens as [`Model::open`] opens it (the weights memory-mapped, nothing
//! copied); each matrix is quantised by kda-core's [`BlockFormat::quantize_row`], which
//! writes what ggml's `quantize_row_*_ref` writes bit for bit, so a file made here holds, for
//! each quantised tensor, the bytes `llama-quantize` (without an importance matrix) makes of
//! the same bf16 values. The types per tensor are llama-quantize's ([`mix`]); names, shapes and
//! transforms are the converter's ([`crate::checkpoint::gguf::kimi_names`]); the keys are in
//! [`meta`]. Only the KDA tensors are written (see [`meta`] for what that means for llama.cpp).
//!
//! The file is written through [`GgufWriter::write_file`]: a temporary beside `OUT`, renamed
//! over it once complete, so an error (a bad checkpoint, a non-finite weight, a full disk)
//! leaves an existing `OUT` as it was. Each tensor is quantised as it is written (rows in
//! parallel on the rayon pool), so memory holds one quantised tensor at a time. Only Kimi
//! Linear checkpoints (softplus gate, low-rank output gate) map to a llama.cpp architecture;
//! Kimi K3 layers are refused. [`Output::CtInt4G32`] writes a compressed-tensors folder
//! instead ([`ct`]).

pub mod ct;
pub mod meta;
pub mod mix;

use std::cell::Cell;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use kda_core::quant::BlockFormat;
use kda_core::Data;
use rayon::prelude::*;

use crate::checkpoint::config::Layout;
use crate::checkpoint::gguf::kimi_names::{ssm_a_from_a_log, KdaTensor, Transform};
use crate::checkpoint::gguf::{GgufWriter, Source};
use crate::checkpoint::layout::{GateTensors, LayerTensors, WeightTensor};
use crate::checkpoint::{Checkpoint, CONFIG_FILE};
use crate::error::{HostError, Result};
use crate::fsio;
use crate::model::Model;

use self::meta::Meta;
use self::mix::{choose, OutType, QuantType, Site};

/// What `kda quantize` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// A kimi-linear GGUF file of this type.
    Gguf(QuantType),
    /// A compressed-tensors `pack-quantized` folder, int4 groups of 32 ([`ct`]).
    CtInt4G32,
}

/// What `kda quantize` does.
#[derive(Debug, Clone)]
pub struct QuantizeOptions {
    /// The checkpoint folder.
    pub model: PathBuf,
    /// The GGUF file (or, for [`Output::CtInt4G32`], the folder) to write, replaced
    /// atomically.
    pub out: PathBuf,
    /// What to write.
    pub output: Output,
    /// Model layers to write (0-based, each a KDA layer); `None`: every KDA layer.
    pub layers: Option<Vec<usize>>,
    /// Report progress on stderr (for a terminal).
    pub progress: bool,
}

/// One tensor written.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorReport {
    /// Its name in the output.
    pub name: String,
    /// Its type (`Q4_K`, `F32`, `int4-g32`, …).
    pub kind: &'static str,
    /// True when it was quantised.
    pub quantised: bool,
    /// Elements.
    pub elems: usize,
    /// Bytes in the file.
    pub bytes: u64,
    /// Bytes in the checkpoint.
    pub source_bytes: usize,
}

/// What was written.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizeReport {
    /// Model layers written (0-based).
    pub layers: Vec<usize>,
    /// Every tensor, in file order.
    pub tensors: Vec<TensorReport>,
}

impl QuantizeReport {
    /// `(type name, tensor count)` for each type used, in order of first use.
    pub fn type_counts(&self) -> Vec<(&'static str, usize)> {
        let mut v: Vec<(&'static str, usize)> = Vec::new();
        for t in &self.tensors {
            match v.iter_mut().find(|(n, _)| *n == t.kind) {
                Some((_, c)) => *c += 1,
                None => v.push((t.kind, 1)),
            }
        }
        v
    }

    /// Bits per weight of the quantised matrices (scales included).
    pub fn matrix_bits_per_weight(&self) -> f64 {
        let q = self.tensors.iter().filter(|t| t.quantised);
        let (bytes, elems) = q.fold((0u64, 0usize), |(b, e), t| (b + t.bytes, e + t.elems));
        8.0 * bytes as f64 / elems.max(1) as f64
    }
}

/// One tensor to write: where its values are and what it becomes.
struct Planned<'m> {
    tensor: KdaTensor,
    name: String,
    data: Data<'m>,
    rows: usize,
    cols: usize,
    ne: Vec<u64>,
    out: OutType,
    source_bytes: usize,
}

/// Quantises the checkpoint folder `opts.model` into `opts.out`.
pub fn quantize(opts: &QuantizeOptions) -> Result<QuantizeReport> {
    let qtype = match opts.output {
        Output::Gguf(q) => q,
        Output::CtInt4G32 => return quantize_ct(opts),
    };
    fsio::check_output(&opts.out)?;
    let ckpt = Checkpoint::open(&opts.model)?;
    not_gguf(&ckpt)?;
    check_supported(&ckpt)?;
    let text = read_text_config(&opts.model)?;
    let n_kda = ckpt.config.kda_layers.len();
    let model = ckpt.load(opts.layers.as_deref())?;
    let layers: Vec<usize> = model.layers().iter().map(|l| l.index).collect();
    let name = folder_name(&opts.model);
    let meta = Meta::new(model.config(), &text, &name, qtype.file_type(), &layers)?;
    let plan = plan(&model, qtype, n_kda)?;
    let total: u64 = plan.iter().map(|p| (p.rows * p.cols) as u64).sum();
    let progress = Progress::new(opts.progress, total);
    let mut w = GgufWriter::new(opts.out.display().to_string());
    meta.add_to(&mut w, model.config().rms_eps)?;
    let mut tensors = Vec::with_capacity(plan.len());
    for p in &plan {
        let ty = p.out.ggml_type();
        let bytes = ty.tensor_bytes(&p.ne).map_err(HostError::Invalid)?;
        tensors.push(TensorReport {
            name: p.name.clone(),
            kind: p.out.name(),
            quantised: p.out != OutType::F32,
            elems: p.rows * p.cols,
            bytes,
            source_bytes: p.source_bytes,
        });
        let progress = &progress;
        let source = Source::Stream(Box::new(move |out: &mut dyn Write| {
            write_tensor(out, p)?;
            progress.advance((p.rows * p.cols) as u64, &p.name);
            Ok(())
        }));
        w.add_tensor(&p.name, &p.ne, ty, source)?;
    }
    let written = w.write_file(&opts.out);
    progress.finish();
    written?;
    Ok(QuantizeReport { layers, tensors })
}

/// `--type int4-g32`: the KDA layers as a compressed-tensors folder ([`ct`]); any Kimi
/// checkpoint (Kimi K3 too), since no llama.cpp architecture is involved.
fn quantize_ct(opts: &QuantizeOptions) -> Result<QuantizeReport> {
    let ckpt = Checkpoint::open(&opts.model)?;
    not_gguf(&ckpt)?;
    let top = read_text_config(&opts.model)?;
    let model = ckpt.load(opts.layers.as_deref())?;
    let written = ct::write_folder(&model, top, &opts.out)?;
    let tensors = written
        .into_iter()
        .map(|(name, kind, elems, bytes, source_bytes)| TensorReport {
            name,
            kind,
            quantised: kind == "int4-g32",
            elems,
            bytes,
            source_bytes,
        })
        .collect();
    let layers = model.layers().iter().map(|l| l.index).collect();
    Ok(QuantizeReport { layers, tensors })
}

/// Refuses a GGUF input: quantising reads the float weights of a Hugging Face folder.
fn not_gguf(ckpt: &Checkpoint) -> Result<()> {
    if ckpt.is_gguf() {
        return Err(HostError::file(
            ckpt.name(),
            "is a GGUF file; kda quantize reads a Hugging Face checkpoint folder (config.json + bf16/f16/f32 safetensors)",
        ));
    }
    Ok(())
}

/// Refuses checkpoints llama.cpp's `kimi-linear` cannot describe.
fn check_supported(ckpt: &Checkpoint) -> Result<()> {
    let c = &ckpt.config;
    let why = if c.layout == Layout::KimiK3 {
        Some("is a Kimi K3 checkpoint (text_config)")
    } else if c.full_rank_gate {
        Some("has a full-rank output gate (`use_full_rank_gate`)")
    } else if c.lower_bound.is_some() {
        Some("has a lower-bound decay gate (`gate_lower_bound`)")
    } else {
        None
    };
    match why {
        Some(why) => Err(HostError::file(
            ckpt.name(),
            format!(
                "{why}; kda quantize writes llama.cpp's kimi-linear architecture (softplus decay gate, low-rank output gate) only"
            ),
        )),
        None => Ok(()),
    }
}

/// The top-level object of `config.json` (already parsed once by [`Checkpoint::open`]).
fn read_text_config(dir: &Path) -> Result<serde_json::Map<String, serde_json::Value>> {
    let path = dir.join(CONFIG_FILE);
    let bytes = fsio::read_regular(&path)?;
    match serde_json::from_slice(&bytes) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        _ => Err(HostError::file(
            path.display().to_string(),
            "is not a JSON object",
        )),
    }
}

fn folder_name(dir: &Path) -> String {
    let canon = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    canon
        .file_name()
        .map_or_else(|| "model".to_string(), |n| n.to_string_lossy().into_owned())
}

/// The down (`up` false) or up matrix of a low-rank gate.
fn low_rank(g: &GateTensors, up: bool) -> Option<&WeightTensor> {
    match g {
        GateTensors::LowRank(a, b) => Some(if up { b } else { a }),
        GateTensors::FullRank(_) => None,
    }
}

/// The checkpoint tensor behind `t` in `layer`, if the layer has it.
fn source_of(layer: &LayerTensors, t: KdaTensor) -> Option<&WeightTensor> {
    Some(match t {
        KdaTensor::QProj => &layer.qkv[0],
        KdaTensor::KProj => &layer.qkv[1],
        KdaTensor::VProj => &layer.qkv[2],
        KdaTensor::QConv => &layer.conv[0],
        KdaTensor::KConv => &layer.conv[1],
        KdaTensor::VConv => &layer.conv[2],
        KdaTensor::ALog => &layer.a_log,
        KdaTensor::DtBias => &layer.dt_bias,
        KdaTensor::FA => return low_rank(&layer.decay_proj, false),
        KdaTensor::FB => return low_rank(&layer.decay_proj, true),
        KdaTensor::Beta => &layer.b_proj,
        KdaTensor::GA => return low_rank(&layer.output_gate, false),
        KdaTensor::GB => return low_rank(&layer.output_gate, true),
        KdaTensor::ONorm => &layer.o_norm,
        KdaTensor::OProj => &layer.o_proj,
    })
}

/// Every tensor of every loaded layer, with its type, values checked finite.
fn plan(model: &Model, qt: QuantType, n_kda: usize) -> Result<Vec<Planned<'_>>> {
    let kda = &model.config().kda_layers;
    let mut out = Vec::new();
    for layer in model.layers() {
        let kda_rank = kda.iter().position(|&l| l == layer.index).unwrap_or(0);
        for t in KdaTensor::ALL {
            let src = source_of(&layer.tensors, t).ok_or_else(|| {
                HostError::Invalid(format!(
                    "layer {}: no `{}` (a full-rank gate has no kimi-linear form)",
                    layer.index,
                    t.hf_suffix()
                ))
            })?;
            let (rows, cols) = match (t.is_matrix(), src.shape.as_slice()) {
                (true, [r, c]) => (*r, *c),
                (false, [p, .., w])
                    if matches!(t, KdaTensor::QConv | KdaTensor::KConv | KdaTensor::VConv) =>
                {
                    (*p, *w)
                }
                _ => (1, src.used),
            };
            let site = Site {
                tensor: t,
                ne0: cols,
                kda_rank,
                n_kda,
            };
            let p = Planned {
                tensor: t,
                name: t.gguf_name(layer.index),
                data: src.data(model.files())?,
                rows,
                cols,
                ne: t.gguf_ne(rows, cols, layer.cfg.heads),
                out: choose(qt, site),
                source_bytes: src.bytes(),
            };
            if let OutType::Blocks(_) = p.out {
                check_finite(&p.data).map_err(|i| {
                    HostError::tensor(
                        model.name(),
                        &src.name,
                        format!(
                            "element {i} is not finite (NaN or infinity), which cannot be quantised"
                        ),
                    )
                })?;
            }
            out.push(p);
        }
    }
    Ok(out)
}

/// `Err(index)` of the first non-finite value.
fn check_finite(d: &Data<'_>) -> std::result::Result<(), usize> {
    const CHUNK: usize = 1 << 16;
    let first = |ok: &(dyn Fn(usize) -> bool + Sync), n: usize| {
        let chunks = n.div_ceil(CHUNK);
        let bad = (0..chunks)
            .into_par_iter()
            .find_map_first(|c| (c * CHUNK..((c + 1) * CHUNK).min(n)).find(|&i| !ok(i)));
        bad.map_or(Ok(()), Err)
    };
    match d {
        Data::F32(s) => first(&|i| s[i].is_finite(), s.len()),
        Data::Bf16(s) => first(&|i| s[i].is_finite(), s.len()),
        Data::F16(s) => first(&|i| s[i].is_finite(), s.len()),
        _ => first(&|i| d.get(i).is_some_and(f32::is_finite), d.len()),
    }
}

/// Values `start..start + out.len()` of `d` as f32.
fn fill(d: &Data<'_>, start: usize, out: &mut [f32]) {
    let end = start + out.len();
    match d {
        Data::F32(s) => out.copy_from_slice(&s[start..end]),
        Data::Bf16(s) => out
            .iter_mut()
            .zip(&s[start..end])
            .for_each(|(o, v)| *o = v.to_f32()),
        Data::F16(s) => out
            .iter_mut()
            .zip(&s[start..end])
            .for_each(|(o, v)| *o = v.to_f32()),
        _ => out
            .iter_mut()
            .enumerate()
            .for_each(|(i, o)| *o = d.get(start + i).unwrap_or(f32::NAN)),
    }
}

/// Rows quantised per batch: about 8 MiB of output.
const BATCH_BYTES: usize = 8 << 20;

/// Writes tensor `p` in its output type.
fn write_tensor(w: &mut dyn Write, p: &Planned<'_>) -> io::Result<()> {
    match p.out {
        OutType::Blocks(f) => write_blocks(w, p, f),
        OutType::F32 | OutType::F16 => {
            let mut row = vec![0.0f32; p.cols];
            for r in 0..p.rows {
                fill(&p.data, r * p.cols, &mut row);
                if p.tensor.transform() == Transform::NegExp {
                    row.iter_mut().for_each(|v| *v = ssm_a_from_a_log(*v));
                }
                let bytes: Vec<u8> = if p.out == OutType::F16 {
                    let h = row.iter().map(|&v| half::f16::from_f32(v).to_bits());
                    h.flat_map(u16::to_le_bytes).collect()
                } else {
                    row.iter().flat_map(|v| v.to_le_bytes()).collect()
                };
                w.write_all(&bytes)?;
            }
            Ok(())
        }
    }
}

/// Quantises `p` into blocks of `f`, batches of rows in parallel.
fn write_blocks(w: &mut dyn Write, p: &Planned<'_>, f: BlockFormat) -> io::Result<()> {
    let row_bytes = f
        .bytes_for(p.cols)
        .ok_or_else(|| io::Error::other(format!("{}: rows do not fit {}", p.name, f.name())))?;
    let batch = (BATCH_BYTES / row_bytes.max(1)).clamp(1, p.rows.max(1));
    let mut buf = vec![0u8; batch * row_bytes];
    for r0 in (0..p.rows).step_by(batch) {
        let n = batch.min(p.rows - r0);
        let chunk = &mut buf[..n * row_bytes];
        chunk
            .par_chunks_mut(row_bytes)
            .enumerate()
            .try_for_each_init(
                || vec![0.0f32; p.cols],
                |x, (i, out)| {
                    fill(&p.data, (r0 + i) * p.cols, x);
                    f.quantize_row(x, out).map_err(|e| {
                        io::Error::other(format!("tensor `{}` row {}: {e}", p.name, r0 + i))
                    })
                },
            )?;
        w.write_all(chunk)?;
    }
    Ok(())
}

/// Progress on stderr: the share of weights written and the tensor, at most ten times a
/// second; nothing when off.
struct Progress {
    on: bool,
    total: u64,
    done: Cell<u64>,
    last: Cell<Option<Instant>>,
}

impl Progress {
    fn new(on: bool, total: u64) -> Self {
        Progress {
            on,
            total: total.max(1),
            done: Cell::new(0),
            last: Cell::new(None),
        }
    }

    fn advance(&self, n: u64, what: &str) {
        self.done.set(self.done.get() + n);
        let now = Instant::now();
        let due = self
            .last
            .get()
            .is_none_or(|t| now - t >= std::time::Duration::from_millis(100));
        if self.on && due {
            self.last.set(Some(now));
            let pct = 100 * self.done.get() / self.total;
            let mut e = io::stderr().lock();
            let _ = write!(e, "\rkda quantize: {pct:>3}% {what:<48}");
            let _ = e.flush();
        }
    }

    fn finish(&self) {
        if self.on && self.last.get().is_some() {
            let mut e = io::stderr().lock();
            let _ = write!(e, "\r{:<72}\r", "");
            let _ = e.flush();
        }
    }
}
