//! `kda bench`: prefill and decode of one KDA layer, next to this machine's memory bandwidth
//! measured in the same run. The layer is a synthetic one at a published size (seeded random
//! bf16 weights), or a layer of a checkpoint (`--model`: a folder or a GGUF file, its weights in
//! their stored formats).
//!
//! * Prefill is reported in tokens/s and GFLOP/s, counting per token
//!   `2·(weight MACs) + 8·H·K·V` FLOPs: 2 per weight element applied (q/k/v/gate/beta/o
//!   projections and the short convs) plus `4·K·V` multiply-adds per head for the recurrence
//!   (decay, `kᵀS`, rank-1 update, `qᵀS`).
//! * Decode is reported in tokens/s and achieved GB/s over the bytes one step must stream:
//!   every weight once, plus each sequence's recurrent and conv states read and written.
//! * The bandwidth reference is the best of a few passes of a large `memcpy` (read + write bytes
//!   counted) and, for reads, the best of several read patterns (1/4/8 streams, with and
//!   without prefetch, the widest loads and the bf16 loads of the ISA benchmarked, and plain
//!   loops), on as many threads as the benchmark uses.
//! * Decode is also compared with passes of that best read pattern run between its steps
//!   (about 16 in all), step by step and pass by pass: a shared machine's speed moves within
//!   seconds, so the step times and the limit are taken in the same window of time (median
//!   step vs median pass, fastest step vs fastest pass).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kda_core::internals::ReadLoads;
use kda_core::{
    DecayGate, ForwardOptions, GateProj, InitialCaches, Isa, KdaConfig, KdaLayer, KdaWeights, Mode,
    Precision,
};
use rayon::prelude::*;

use crate::cache::SequenceCaches;
use crate::checkpoint::Checkpoint;
use crate::error::{HostError, Result};
use crate::format_label::{format_label, named_matrices, stored_bytes};
use crate::layer::{OwnedLayer, WeightDtype};
use crate::model::Model;
use crate::panels::Panels;
use crate::rng::Rng;
use crate::runner::Runner;

/// Published layer sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// Kimi-K3-0.40B-sized: hidden 1024, 8 heads × 32, K3 gates.
    Small,
    /// Kimi Linear 48B: hidden 2304, 32 × 128, softplus decay gate, low-rank output gate.
    KimiLinear,
    /// Kimi K3: hidden 7168, 96 × 128, lower-bound −5 decay gate, full-rank output gate.
    KimiK3,
}

impl Preset {
    /// The layer configuration.
    pub fn config(self) -> KdaConfig {
        match self {
            Preset::Small => KdaConfig::kimi_k3(1024, 8, 32),
            Preset::KimiLinear => KdaConfig::kimi_linear(2304, 32, 128),
            Preset::KimiK3 => KdaConfig::kimi_k3(7168, 96, 128),
        }
    }

    /// Name as the `kda` tool spells it.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Small => "small",
            Preset::KimiLinear => "kimi-linear",
            Preset::KimiK3 => "kimi-k3",
        }
    }
}

/// One line describing a layer configuration.
pub fn describe(cfg: &KdaConfig) -> String {
    let decay = match cfg.decay_gate {
        DecayGate::Softplus => "softplus decay gate".to_string(),
        DecayGate::LowerBound(lb) => format!("lower-bound {lb} decay gate"),
    };
    let gate = match cfg.output_gate {
        GateProj::FullRank => "full-rank output gate".to_string(),
        GateProj::LowRank { rank } => format!("low-rank ({rank}) output gate"),
    };
    format!(
        "hidden {}, {} heads x {}, conv {}, {decay}, {gate}",
        cfg.hidden, cfg.heads, cfg.head_dim, cfg.conv_width
    )
}

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Layer size (of the seeded layer; unused with [`BenchOptions::model`]).
    pub preset: Preset,
    /// A checkpoint's layer to run instead of the seeded one.
    pub model: Option<BenchModel>,
    /// Prompt tokens per sequence.
    pub prompt: usize,
    /// Decode steps.
    pub steps: usize,
    /// Prefill runs, each from empty caches (at least 1): the fastest is reported, with the
    /// first and the median.
    pub prefill_runs: usize,
    /// Sequences.
    pub batch: usize,
    /// Seed for weights and inputs.
    pub seed: u64,
    /// Threads of the pool the benchmark runs in (for the bandwidth reference).
    pub threads: usize,
    /// Draw a progress bar on stderr (only when it is a terminal).
    pub progress: bool,
    /// Run on weights repacked into the panel layout ([`crate::Panels`]) rather than the
    /// row-major checkpoint layout.
    pub panels: bool,
    /// The projections' arithmetic ([`Precision::Bf16`] needs `panels`).
    pub precision: Precision,
    /// The kernel path; `None` picks the fastest this CPU supports. The FMA peak and the
    /// read reference run on the same path, so a slower path is measured against its own
    /// limits (an AVX-512 machine times the AVX2 kernels against its 256-bit peak).
    pub isa: Option<Isa>,
}

/// A layer of a checkpoint to benchmark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchModel {
    /// A checkpoint folder or a GGUF file.
    pub path: PathBuf,
    /// The model layer (0-based); `None` for the first KDA layer the checkpoint holds.
    pub layer: Option<usize>,
}

/// The layer a run benchmarks: seeded, or loaded from a checkpoint.
enum Subject {
    Seeded(Box<OwnedLayer>),
    Loaded(Box<Model>, usize),
}

impl Subject {
    fn open(opts: &BenchOptions) -> Result<Self> {
        let Some(m) = &opts.model else {
            let cfg = opts.preset.config();
            let layer = OwnedLayer::random(cfg, WeightDtype::Bf16, opts.seed)?;
            return Ok(Subject::Seeded(Box::new(layer)));
        };
        let ckpt = Checkpoint::open(&m.path)?;
        let index = match m.layer {
            Some(n) => n,
            None => *ckpt.held_layers().first().ok_or_else(|| {
                HostError::Invalid(format!(
                    "{}: the checkpoint holds no KDA layer",
                    ckpt.name()
                ))
            })?,
        };
        Ok(Subject::Loaded(Box::new(ckpt.load(Some(&[index]))?), index))
    }

    fn weights(&self) -> Result<(KdaConfig, KdaWeights<'_>)> {
        match self {
            Subject::Seeded(l) => Ok((l.cfg, l.weights()?)),
            Subject::Loaded(m, i) => m.weights(*i).map(|(c, w)| (*c, w)),
        }
    }

    /// What the report's first line calls it.
    fn name(&self, opts: &BenchOptions) -> String {
        match self {
            Subject::Seeded(_) => format!("preset {} (seeded random weights)", opts.preset.name()),
            Subject::Loaded(m, i) => format!("{} layer {i}", m.name()),
        }
    }
}

/// The sizes the report counts, of the layer benchmarked.
#[derive(Debug, Clone)]
struct Facts {
    cfg: KdaConfig,
    macs: usize,
    weight_bytes: usize,
    /// The matrices' storage formats, e.g. `bf16` or `Q8_0/f32`.
    formats: String,
}

impl Facts {
    fn of(cfg: KdaConfig, w: &KdaWeights<'_>) -> Facts {
        let mut formats: Vec<String> = Vec::new();
        let mats = named_matrices(w);
        for (_, m) in &mats {
            let f = format_label(&m.data());
            if !formats.contains(&f) {
                formats.push(f);
            }
        }
        let vectors = [w.q_conv, w.k_conv, w.v_conv, w.o_norm]
            .into_iter()
            .chain(w.a_log)
            .chain(w.dt_bias);
        let weight_bytes = mats
            .iter()
            .map(|(_, m)| stored_bytes(&m.data()))
            .chain(vectors.map(|d| stored_bytes(&d)))
            .sum();
        Facts {
            cfg,
            macs: macs(&cfg, w),
            weight_bytes,
            formats: formats.join("/"),
        }
    }

    /// FLOPs per prefill token: `2·weight_macs + 8·H·K·V`.
    fn flops_per_token(&self) -> f64 {
        let c = &self.cfg;
        2.0 * self.macs as f64 + 8.0 * (c.heads * c.head_dim * c.head_dim) as f64
    }

    /// Bytes one decode step over `batch` sequences streams: weights once, and each sequence's
    /// recurrent and conv states read and written.
    fn decode_bytes(&self, batch: usize) -> f64 {
        let c = &self.cfg;
        let state = 4
            * (c.heads * c.head_dim * c.head_dim
                + 3 * c.proj_dim() * c.conv_width.saturating_sub(1));
        self.weight_bytes as f64 + (batch * 2 * state) as f64
    }
}

/// Multiply-adds of the weights per token: every matrix element once, and the short convs.
fn macs(cfg: &KdaConfig, w: &KdaWeights<'_>) -> usize {
    let mats: usize = named_matrices(w)
        .iter()
        .map(|(_, m)| m.rows() * m.cols())
        .sum();
    mats + 3 * cfg.proj_dim() * cfg.conv_width
}

/// Measured memory bandwidth, GB/s (1e9 bytes/s).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bandwidth {
    /// `memcpy`, read + write bytes counted.
    pub copy: f64,
    /// Read only: the best of every read pattern tried ([`READ_PATTERNS`]).
    pub read: f64,
    /// The read pattern that reached [`Bandwidth::read`].
    pub read_pattern: ReadPattern,
}

/// One way of reading a buffer for the read-bandwidth reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadPattern {
    /// Interleaved far-apart streams, as a projection reads weight rows.
    pub streams: usize,
    /// Software prefetch ahead of each stream.
    pub prefetch: bool,
    /// How the pattern loads.
    pub loads: PatternLoads,
}

/// The loads of a [`ReadPattern`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatternLoads {
    /// kda-core's probe on the ISA benchmarked, with its widest loads or its bf16 loads.
    Vector(ReadLoads),
    /// A plain integer loop the compiler vectorises (512-byte pieces).
    Plain,
}

impl ReadPattern {
    const fn simd(streams: usize, prefetch: bool, loads: ReadLoads) -> Self {
        ReadPattern {
            streams,
            prefetch,
            loads: PatternLoads::Vector(loads),
        }
    }
    const fn plain(streams: usize) -> Self {
        ReadPattern {
            streams,
            prefetch: false,
            loads: PatternLoads::Plain,
        }
    }

    /// What the pattern loads with, on `isa`, for the report.
    pub fn loads_name(&self, isa: Isa) -> String {
        match self.loads {
            PatternLoads::Vector(ReadLoads::Widest) => format!("{} widest", isa.name()),
            PatternLoads::Vector(ReadLoads::Bf16) => format!("{} bf16", isa.name()),
            PatternLoads::Plain => "plain-loop".to_string(),
        }
    }
}

/// The read patterns tried: 1, 4 and 8 streams with the widest loads of the ISA benchmarked
/// and with its bf16 loads (half as wide, as the decode kernels read weights: some CPUs, Zen 5
/// among them, stream memory faster with these), each with and without software prefetch, and
/// 1 and 8 streams of a plain loop. The reference is the best of them, so a kernel's "% of
/// read bandwidth" is measured against the strongest loop we have.
pub const READ_PATTERNS: [ReadPattern; 14] = [
    ReadPattern::simd(1, false, ReadLoads::Widest),
    ReadPattern::simd(4, false, ReadLoads::Widest),
    ReadPattern::simd(8, false, ReadLoads::Widest),
    ReadPattern::simd(1, true, ReadLoads::Widest),
    ReadPattern::simd(4, true, ReadLoads::Widest),
    ReadPattern::simd(8, true, ReadLoads::Widest),
    ReadPattern::simd(1, false, ReadLoads::Bf16),
    ReadPattern::simd(4, false, ReadLoads::Bf16),
    ReadPattern::simd(8, false, ReadLoads::Bf16),
    ReadPattern::simd(1, true, ReadLoads::Bf16),
    ReadPattern::simd(4, true, ReadLoads::Bf16),
    ReadPattern::simd(8, true, ReadLoads::Bf16),
    ReadPattern::plain(1),
    ReadPattern::plain(8),
];

/// A plain integer sum of `s` (wrapping), eight lanes the compiler vectorises.
fn plain_sum(s: &[u32]) -> u32 {
    let mut acc = [0u32; 8];
    for c in s.chunks_exact(8) {
        for (a, v) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(*v);
        }
    }
    acc.iter().fold(0, |a, b| a.wrapping_add(*b))
}

/// [`plain_sum`] over `streams` far-apart regions, 512 bytes of each in turn.
fn plain_streams(s: &[u32], streams: usize) -> u32 {
    let q = s.len() / streams / 128 * 128;
    let mut acc = 0u32;
    for off in (0..q).step_by(128) {
        for j in 0..streams {
            acc = acc.wrapping_add(plain_sum(&s[j * q + off..j * q + off + 128]));
        }
    }
    acc.wrapping_add(plain_sum(&s[streams * q..]))
}

/// The best time of four runs of `f`, in seconds.
fn best_of_four(f: &mut dyn FnMut()) -> f64 {
    (0..4)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or(Duration::from_secs(1))
        .as_secs_f64()
        .max(1e-9)
}

/// A buffer for read passes, kept after [`measure_bandwidth`] so that passes of the best
/// pattern can run between a kernel's steps (a shared machine's speed moves within seconds:
/// a kernel and its limit are compared pass by pass, in the same window of time).
pub struct ReadProbe {
    src: Vec<f32>,
    parallel: bool,
    chunk: usize,
    isa: Isa,
}

impl ReadProbe {
    /// A buffer of `bytes` (at least 256 KiB), every page faulted in; passes run on the current
    /// rayon pool's threads when `parallel`, with `isa`'s widest loads.
    pub fn new(bytes: usize, parallel: bool, isa: Isa) -> Result<Self> {
        let n = (bytes / 4).max(1 << 16);
        let mut src = crate::error::try_zeroed::<f32>(n, "the bandwidth buffer")?;
        src.fill(1.0);
        let chunk = (n / rayon::current_num_threads().max(1)).max(1 << 14);
        Ok(ReadProbe {
            src,
            parallel,
            chunk,
            isa,
        })
    }

    /// The bytes one pass reads.
    pub fn bytes(&self) -> f64 {
        (self.src.len() * 4) as f64
    }

    /// The seconds of one pass over the buffer in pattern `p`.
    pub fn pass(&self, p: ReadPattern) -> f64 {
        let sum = |s: &[f32]| match p.loads {
            PatternLoads::Vector(loads) => {
                kda_core::internals::read_sum(self.isa, s, p.streams, p.prefetch, loads)
            }
            PatternLoads::Plain => plain_streams(bytemuck::cast_slice(s), p.streams) as f32,
        };
        let t = Instant::now();
        let total: f32 = if self.parallel {
            self.src.par_chunks(self.chunk).map(sum).sum()
        } else {
            sum(&self.src)
        };
        std::hint::black_box(total);
        t.elapsed().as_secs_f64().max(1e-9)
    }
}

/// Measures memory bandwidth over buffers of `bytes` (best of a few passes), on the current
/// rayon pool's threads when `parallel`. Returns the read buffer too, for passes of the best
/// pattern later in the run ([`ReadProbe::pass`]).
pub fn measure_bandwidth(bytes: usize, parallel: bool, isa: Isa) -> Result<(Bandwidth, ReadProbe)> {
    let probe = ReadProbe::new(bytes, parallel, isa)?;
    let src = &probe.src;
    let mut dst = crate::error::try_zeroed::<f32>(src.len(), "the bandwidth buffer")?;
    dst.copy_from_slice(src); // fault every page in
    let chunk = probe.chunk;
    let copy_s = best_of_four(&mut || {
        if parallel {
            dst.par_chunks_mut(chunk)
                .zip(src.par_chunks(chunk))
                .for_each(|(d, s)| d.copy_from_slice(s));
        } else {
            dst.copy_from_slice(src);
        }
        std::hint::black_box(&mut dst);
    });
    drop(dst);
    let (read_pattern, best) = READ_PATTERNS
        .iter()
        .map(|&p| {
            (
                p,
                best_of_four(&mut || {
                    probe.pass(p);
                }),
            )
        })
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or((READ_PATTERNS[0], 1.0));
    let b = probe.bytes();
    Ok((
        Bandwidth {
            copy: 2.0 * b / copy_s / 1e9,
            read: b / best / 1e9,
            read_pattern,
        },
        probe,
    ))
}

/// The single-core f32 FMA peak in GFLOP/s (2 per FMA), best of five runs with the widest
/// vectors of `isa`.
pub fn measure_fma_peak(isa: Isa) -> f64 {
    best_rate(|| kda_core::internals::fma_peak(isa, 200_000))
}

/// The compute limit prefill is compared with: the f32 FMA peak in exact mode, the bf16 dot
/// products' peak in bf16 mode (`vdpbf16ps` does two multiply-adds per f32 lane, so the f32
/// peak is no limit there).
struct ComputePeak {
    /// GFLOP/s per core (2 per multiply-add).
    gflops: f64,
    /// What the limit is, for the report.
    name: &'static str,
    /// The operations it was measured with.
    ops: &'static str,
}

impl ComputePeak {
    fn measure(isa: Isa, precision: Precision) -> Self {
        match precision {
            Precision::Exact => ComputePeak {
                gflops: measure_fma_peak(isa),
                name: "FMA peak",
                ops: "f32 multiply-adds",
            },
            Precision::Bf16 => ComputePeak {
                gflops: measure_dot_pairs_peak(isa),
                name: "bf16 dot-product peak",
                ops: "bf16 pair dot products (2 multiply-adds per lane)",
            },
        }
    }
}

/// The single-core peak of the bf16 mode's dot products in GFLOP/s (2 per multiply-add),
/// best of five runs on `isa` (`vdpbf16ps` on avx512_bf16; elsewhere the mode's
/// emulation, two f32 multiply-adds per pair).
pub fn measure_dot_pairs_peak(isa: Isa) -> f64 {
    best_rate(|| kda_core::internals::dot_pairs_peak(isa, 100_000))
}

/// The best rate of five runs of a peak probe returning (multiply-adds, a value to keep), in
/// GFLOP/s.
fn best_rate(probe: impl Fn() -> (usize, f32)) -> f64 {
    (0..5)
        .map(|_| {
            let t = Instant::now();
            let (macs, keep) = probe();
            std::hint::black_box(keep);
            2.0 * macs as f64 / t.elapsed().as_secs_f64().max(1e-9) / 1e9
        })
        .fold(0.0, f64::max)
}

/// Weight multiply-adds per token (every matrix and conv element once).
pub fn weight_macs(layer: &OwnedLayer) -> usize {
    layer.weights().map_or(0, |w| macs(&layer.cfg, &w))
}

/// FLOPs per prefill token: `2·weight_macs + 8·H·K·V`.
pub fn flops_per_token(layer: &OwnedLayer) -> f64 {
    owned_facts(layer).flops_per_token()
}

/// Bytes one decode step over `batch` sequences streams: weights once, and each sequence's
/// recurrent and conv states read and written.
pub fn decode_bytes_per_step(layer: &OwnedLayer, batch: usize) -> f64 {
    owned_facts(layer).decode_bytes(batch)
}

fn owned_facts(layer: &OwnedLayer) -> Facts {
    match layer.weights() {
        Ok(w) => Facts::of(layer.cfg, &w),
        Err(_) => Facts {
            cfg: layer.cfg,
            macs: 0,
            weight_bytes: layer.weight_bytes(),
            formats: String::new(),
        },
    }
}

/// A progress bar on stderr, drawn only when stderr is a terminal.
#[derive(Debug)]
pub struct Progress {
    label: &'static str,
    total: usize,
    done: usize,
    on: bool,
    last: Instant,
    start: Instant,
}

impl Progress {
    /// A bar for `total` units; drawn only if `enabled` and stderr is a terminal.
    pub fn new(label: &'static str, total: usize, enabled: bool) -> Self {
        let now = Instant::now();
        Progress {
            label,
            total: total.max(1),
            done: 0,
            on: enabled && std::io::stderr().is_terminal(),
            last: now,
            start: now,
        }
    }

    /// Adds `n` units done.
    pub fn inc(&mut self, n: usize) {
        self.done = (self.done + n).min(self.total);
        // Only runs longer than half a second get a bar; redraw at most 10 times a second.
        if self.on
            && self.start.elapsed() > Duration::from_millis(500)
            && self.last.elapsed() > Duration::from_millis(100)
        {
            self.last = Instant::now();
            let w = 30;
            let filled = w * self.done / self.total;
            eprint!(
                "\r{:>8} [{}{}] {}/{}",
                self.label,
                "#".repeat(filled),
                " ".repeat(w - filled),
                self.done,
                self.total
            );
            let _ = std::io::stderr().flush();
        }
    }

    /// Clears the bar.
    pub fn finish(&mut self) {
        if self.on && self.start.elapsed() > Duration::from_millis(500) {
            eprint!("\r{}\r", " ".repeat(60));
            let _ = std::io::stderr().flush();
        }
    }
}

/// Writes one line of the report.
fn line(out: &mut dyn Write, s: String) -> Result<()> {
    writeln!(out, "{s}").map_err(|e| HostError::Invalid(format!("cannot write the report: {e}")))
}

/// Tokens per prefill slice (as large as the runner's blocks, so slicing does not change the
/// work).
const SLICE: usize = 256;

/// Runs the benchmark, writing the report to `out`.
pub fn run(opts: &BenchOptions, out: &mut dyn Write) -> Result<()> {
    if opts.batch == 0 {
        return Err(HostError::Invalid("--batch must be at least 1".into()));
    }
    if opts.precision == Precision::Bf16 && !opts.panels {
        return Err(HostError::Invalid(
            "--precision bf16 needs --layout panels (the bf16 kernels read the panel layout)"
                .into(),
        ));
    }
    let subject = Subject::open(opts)?;
    let (cfg, base) = subject.weights()?;
    let facts = Facts::of(cfg, &base);
    // The buffers sized by the options first: a batch too large fails before the measurements.
    let slice_values = opts
        .batch
        .checked_mul(opts.prompt.clamp(1, SLICE) * cfg.hidden)
        .ok_or_else(|| HostError::Invalid("--batch: too many sequences".into()))?;
    let mut slice_buf = crate::error::try_zeroed::<f32>(
        slice_values,
        "the prefill slice (--batch sequences × up to 256 tokens × hidden)",
    )?;
    let caches = SequenceCaches::try_new(&cfg, opts.batch)?;
    let isa = opts.isa.unwrap_or_else(Isa::detect);
    if !isa.is_supported() {
        return Err(HostError::Invalid(format!(
            "--isa {}: this CPU lacks {}",
            isa.name(),
            isa.feature()
        )));
    }
    let (bw, probe) = measure_bandwidth(256 << 20, opts.threads > 1, isa)?;
    let panels = if opts.panels {
        Panels::new(&base)?
    } else {
        Panels::default()
    };
    let wts = if opts.panels {
        panels.weights(&base)?
    } else {
        base
    };
    report_setup(out, opts, isa, (&subject.name(opts), &facts), &bw)?;
    let mut bench = Bench {
        opts,
        layer: KdaLayer::new(
            &cfg,
            wts,
            ForwardOptions {
                isa: Some(isa),
                ..ForwardOptions::default().with_precision(opts.precision)
            },
        )?,
        runner: Runner::default(),
        caches,
        rng: Rng::new(opts.seed ^ 0xbe9c),
    };
    let peak = ComputePeak::measure(isa, opts.precision);
    let mut runs = Vec::with_capacity(opts.prefill_runs.max(1));
    let mut sum_sq = 0.0;
    for _ in 0..opts.prefill_runs.max(1) {
        let (dt, sq) = bench.prefill(&mut slice_buf)?;
        runs.push(dt);
        sum_sq = sq;
    }
    let dt = report_prefill(out, opts, &facts, &runs, sum_sq)?;
    let gflops = (opts.prompt * opts.batch) as f64 * facts.flops_per_token() / dt / 1e9;
    line(
        out,
        format!(
            "prefill vs the {} measured now ({:.1} GFLOP/s per core, {} {}, x {} thread(s)): {:.0}%",
            peak.name,
            peak.gflops,
            isa.name(),
            peak.ops,
            opts.threads,
            100.0 * gflops / (peak.gflops * opts.threads as f64)
        ),
    )?;
    let (times, last) = bench.decode(&probe, bw.read_pattern)?;
    report_decode(out, opts, &facts, &times, &bw, probe.bytes())?;
    if !last.iter().all(|v| v.is_finite()) || !sum_sq.is_finite() {
        return Err(HostError::Invalid("bench: non-finite output".into()));
    }
    Ok(())
}

/// The state of one benchmark run.
struct Bench<'a, 'w> {
    opts: &'a BenchOptions,
    layer: KdaLayer<'w>,
    runner: Runner,
    caches: SequenceCaches,
    rng: Rng,
}

impl Bench<'_, '_> {
    /// Prefill: `batch` sequences of `prompt` tokens, in slices of [`SLICE`] tokens so a bar
    /// can move. Returns the seconds taken and the outputs' sum of squares.
    fn prefill(&mut self, slice_buf: &mut [f32]) -> Result<(f64, f64)> {
        let (opts, hd) = (self.opts, self.layer.config().hidden);
        let total = opts
            .prompt
            .checked_mul(opts.batch)
            .ok_or_else(|| HostError::Invalid("--prompt × --batch: too many tokens".into()))?;
        let mut bar = Progress::new("prefill", total, opts.progress);
        // One generator per sequence, so each slice's rows are drawn when needed (not every
        // prompt up front) and each sequence's prompt is the same however it is sliced.
        let mut seq_rngs: Vec<Rng> = (0..opts.batch)
            .map(|_| Rng::new(self.rng.next_u64()))
            .collect();
        // Only the layer calls are timed: the inputs are drawn outside the clock.
        let mut elapsed = Duration::ZERO;
        let mut t0 = 0;
        let mut sum_sq = 0.0f64;
        while t0 < opts.prompt || t0 == 0 {
            let t1 = opts.prompt.min(t0 + SLICE);
            let len = t1 - t0;
            let x = &mut slice_buf[..opts.batch * len * hd];
            for (row, r) in x.chunks_exact_mut(len * hd).zip(&mut seq_rngs) {
                row.iter_mut().for_each(|v| *v = r.normal());
            }
            let cu: Vec<usize> = (0..=opts.batch).map(|i| i * len).collect();
            let init = if t0 == 0 {
                InitialCaches::Zero
            } else {
                InitialCaches::Given
            };
            let t = Instant::now();
            let y = self
                .runner
                .forward(&self.layer, x, &cu, &mut self.caches, init)?;
            elapsed += t.elapsed();
            sum_sq += y.iter().map(|v| (*v as f64).powi(2)).sum::<f64>();
            bar.inc(len * opts.batch);
            t0 = t1;
            if opts.prompt == 0 {
                break;
            }
        }
        bar.finish();
        Ok((elapsed.as_secs_f64().max(1e-9), sum_sq))
    }

    /// Decode: `steps` steps of one token per sequence, each timed, with passes of the read
    /// reference's best pattern over `probe` between them (about 16 in all). Returns the
    /// times and the last outputs.
    fn decode(
        &mut self,
        probe: &ReadProbe,
        pattern: ReadPattern,
    ) -> Result<(DecodeTimes, Vec<f32>)> {
        let (opts, hd) = (self.opts, self.layer.config().hidden);
        let decode = self.layer.with_mode(Mode::Recurrent);
        let mut bar = Progress::new("decode", opts.steps, opts.progress);
        let mut last = Vec::new();
        let every = opts.steps.div_ceil(INTERLEAVED_PASSES).max(1);
        let mut times = DecodeTimes::default();
        for i in 0..opts.steps {
            let x = self.rng.normals(opts.batch * hd, 1.0);
            let t = Instant::now();
            last = self.runner.decode(&decode, &x, &mut self.caches)?;
            times.steps.push(t.elapsed().as_secs_f64().max(1e-9));
            if i % every == 0 {
                times.passes.push(probe.pass(pattern));
            }
            bar.inc(1);
        }
        bar.finish();
        Ok((times, last))
    }
}

/// Passes of the read reference run between decode steps.
const INTERLEAVED_PASSES: usize = 16;

/// Seconds of each decode step, and of each read pass run between them.
#[derive(Debug, Default)]
struct DecodeTimes {
    steps: Vec<f64>,
    passes: Vec<f64>,
}

/// The median and the minimum of `x` (`(0, 0)` if empty).
fn median_min(x: &[f64]) -> (f64, f64) {
    let mut v = x.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => (0.0, 0.0),
        n => (v[n / 2], v[0]),
    }
}

/// `subject`: the layer's name and sizes.
fn report_setup(
    out: &mut dyn Write,
    opts: &BenchOptions,
    isa: Isa,
    (name, facts): (&str, &Facts),
    bw: &Bandwidth,
) -> Result<()> {
    line(
        out,
        format!(
            "kda bench: {name} ({}), {} weights {:.1} MiB in the {} layout, batch {}, {} thread(s), ISA {}, precision {}",
            describe(&facts.cfg),
            facts.formats,
            facts.weight_bytes as f64 / (1 << 20) as f64,
            if opts.panels { "panel" } else { "row-major" },
            opts.batch,
            opts.threads,
            isa.name(),
            opts.precision.name()
        ),
    )?;
    line(
        out,
        format!(
            "memory bandwidth of this machine ({} thread(s), 256 MiB buffers): memcpy {:.1} GB/s (read+write bytes), read {:.1} GB/s (best of {} patterns: {} stream(s){}, {} loads)",
            opts.threads,
            bw.copy,
            bw.read,
            READ_PATTERNS.len(),
            bw.read_pattern.streams,
            if bw.read_pattern.prefetch { " + prefetch" } else { "" },
            bw.read_pattern.loads_name(isa)
        ),
    )
}

/// Reports the prefill runs' times (`runs`, seconds, at least one) and returns the fastest.
fn report_prefill(
    out: &mut dyn Write,
    opts: &BenchOptions,
    facts: &Facts,
    runs: &[f64],
    sum_sq: f64,
) -> Result<f64> {
    let cfg = &facts.cfg;
    let toks = (opts.prompt * opts.batch) as f64;
    let fpt = facts.flops_per_token();
    let (median, dt) = median_min(runs);
    let first = runs.first().copied().unwrap_or(dt);
    line(
        out,
        format!(
            "prefill: {} x {} tokens in {dt:.3} s = {:.1} tokens/s, {:.2} GFLOP/s (fastest of {} run(s) from empty caches: first {first:.3} s, median {median:.3} s; FLOPs/token = 2*weight MACs + 8*H*K*V = 2*{} + 8*{}*{}*{} = {:.3} GFLOP; output RMS {:.4})",
            opts.batch,
            opts.prompt,
            toks / dt,
            toks * fpt / dt / 1e9,
            runs.len(),
            facts.macs,
            cfg.heads,
            cfg.head_dim,
            cfg.head_dim,
            fpt / 1e9,
            (sum_sq / (toks * cfg.hidden as f64).max(1.0)).sqrt()
        ),
    )?;
    Ok(dt)
}

fn report_decode(
    out: &mut dyn Write,
    opts: &BenchOptions,
    facts: &Facts,
    times: &DecodeTimes,
    bw: &Bandwidth,
    pass_bytes: f64,
) -> Result<()> {
    let bytes = facts.decode_bytes(opts.batch);
    let dt: f64 = times.steps.iter().sum::<f64>().max(1e-9);
    let gbs = bytes * opts.steps as f64 / dt / 1e9;
    line(
        out,
        format!(
            "decode: {} steps x batch {} in {dt:.3} s = {:.1} tokens/s ({:.3} ms/step), {gbs:.2} GB/s achieved = {:.0}% of measured read bandwidth (bytes/step = weights + batch*2*(recurrent + conv states) = {:.1} MB)",
            opts.steps,
            opts.batch,
            (opts.steps * opts.batch) as f64 / dt,
            1e3 * dt / opts.steps.max(1) as f64,
            100.0 * gbs / bw.read.max(1e-9),
            bytes / 1e6
        ),
    )?;
    if times.steps.is_empty() || times.passes.is_empty() {
        return Ok(());
    }
    let ((step_med, step_min), (pass_med, pass_min)) =
        (median_min(&times.steps), median_min(&times.passes));
    let gb = |b: f64, s: f64| b / s / 1e9;
    line(
        out,
        format!(
            "decode vs read passes interleaved ({} steps, {} passes of the best pattern between them): median step {:.3} ms = {:.2} GB/s, {:.0}% of the median pass ({:.2} GB/s); fastest step {:.2} GB/s, {:.0}% of the fastest pass ({:.2} GB/s)",
            times.steps.len(),
            times.passes.len(),
            1e3 * step_med,
            gb(bytes, step_med),
            100.0 * gb(bytes, step_med) / gb(pass_bytes, pass_med),
            gb(pass_bytes, pass_med),
            gb(bytes, step_min),
            100.0 * gb(bytes, step_min) / gb(pass_bytes, pass_min),
            gb(pass_bytes, pass_min),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_min_of_steps() {
        assert_eq!(median_min(&[]), (0.0, 0.0));
        assert_eq!(median_min(&[3.0]), (3.0, 3.0));
        assert_eq!(median_min(&[5.0, 1.0, 4.0, 2.0, 3.0]), (3.0, 1.0));
        // An even count takes the upper middle.
        assert_eq!(median_min(&[4.0, 1.0, 3.0, 2.0]), (3.0, 1.0));
    }

    #[test]
    fn read_probe_passes_every_pattern() {
        for isa in Isa::all_supported() {
            let probe = ReadProbe::new(1 << 20, false, isa).unwrap();
            assert_eq!(probe.bytes(), (1 << 20) as f64);
            for p in READ_PATTERNS {
                let s = probe.pass(p);
                assert!(s > 0.0 && s < 10.0, "{isa:?} {p:?}: {s} s");
            }
        }
    }
}
