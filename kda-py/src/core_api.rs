//! The one place where kda-py calls into `kda_core` and `kda_host`.
//!
//! Everything else in this crate goes through the functions and types here, so a change of
//! the core's public surface (e.g. `ops` / `simd` behind a facade, a validated layer object)
//! is absorbed in this file alone.

use std::path::Path;

use kda_core::ops::chunked::Chunks;
pub use kda_core::ops::chunked::{RowsHint, StridedHead, StridedInputs, StridedRows};
use kda_core::ops::{chunked, gate, norm, recurrent, HeadRows};
use kda_core::weights::Data;
use kda_core::DecayGate;
pub use kda_core::Isa;

pub use kda_host::{HostError, Model, ModelCache, Runner};

/// Errors of the core, as one-line messages.
pub type CoreResult<T> = Result<T, String>;

fn msg(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The ε inside the square root of fla's q/k L2 norm.
pub const L2_EPS: f32 = 1e-6;

/// The chunk size the core runs fastest with.
pub const DEFAULT_CHUNK: usize = kda_core::DEFAULT_CHUNK;

/// The largest chunk size of the chunked kernel.
pub const MAX_CHUNK: usize = chunked::MAX_CHUNK;

/// The decay-gate form applied in the kernel (fla's `use_gate_in_kernel`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GateForm {
    /// `g = −exp(A_log)·softplus(g + dt_bias)`.
    Softplus,
    /// `g = lb·sigmoid(exp(A_log)·(g + dt_bias))`, or `lb·sigmoid(g + dt_bias)` without `A_log`.
    LowerBound(f32),
}

/// The fastest kernel path of this CPU.
pub fn isa() -> Isa {
    Isa::detect()
}

/// `x ← x / sqrt(Σx² + 1e-6)` per row of `dim`.
pub fn l2_norm(x: &mut [f32], dim: usize) -> CoreResult<()> {
    norm::l2_norm(x, dim, L2_EPS).map_err(msg)
}

/// The decay gate in place over `[T, K]` rows of one head, on path `isa`: `a_log` is that
/// head's `[1]`, `dt_bias` its `[K]`.
pub fn decay_gate(
    isa: Isa,
    raw: &mut [f32],
    form: GateForm,
    a_log: Option<&[f32]>,
    dt_bias: Option<&[f32]>,
    head_dim: usize,
) -> CoreResult<()> {
    let form = match form {
        GateForm::Softplus => DecayGate::Softplus,
        GateForm::LowerBound(lb) => DecayGate::LowerBound(lb),
    };
    let arrays = (a_log.map(Data::F32), dt_bias.map(Data::F32));
    gate::decay_gate_on(isa, raw, form, arrays, (1, head_dim)).map_err(msg)
}

/// `β ← sigmoid(β)` in place, on path `isa`.
pub fn beta_sigmoid(isa: Isa, beta: &mut [f32]) {
    gate::beta_sigmoid_on(isa, beta)
}

/// One head of one sequence, the inputs of the per-head kernels: `q`, `k`, `g` `[T, K]`,
/// `v_o` `[T, V]` (values in, outputs out), `beta` `[T]`, `state` `[K, V]` in/out.
pub struct HeadTask<'a> {
    /// Queries (L2-normalised if asked).
    pub q: &'a [f32],
    /// Keys.
    pub k: &'a [f32],
    /// Values in, outputs out.
    pub v_o: &'a mut [f32],
    /// Log decays.
    pub g: &'a [f32],
    /// Betas.
    pub beta: &'a [f32],
    /// State `[K, V]`, K-first.
    pub state: &'a mut [f32],
}

impl<'a> HeadTask<'a> {
    /// The core's view of the task.
    fn rows(self, scale: f32) -> HeadRows<'a> {
        HeadRows {
            q: self.q,
            k: self.k,
            g: self.g,
            beta: self.beta,
            v_o: self.v_o,
            state: self.state,
            scale,
        }
    }
}

/// f32 elements of scratch [`recurrent_head`] needs for key dim `k`, value dim `v`.
pub fn recurrent_scratch_len(k: usize, v: usize) -> usize {
    recurrent::recurrent_scratch_len(k, v)
}

/// f32 elements of scratch [`chunked_head`] needs for chunk size `chunk`, key dim `k`, value
/// dim `v`.
pub fn chunked_scratch_len(chunk: usize, k: usize, v: usize) -> usize {
    chunked::chunked_scratch_len(chunk, k, v)
}

/// The token-by-token recurrence over one head of one sequence, from `initial` `[K, V]`
/// (left as it was; `t.state`'s content is then not read) or, with `None`, from `t.state`;
/// `scratch`: at least [`recurrent_scratch_len`] elements.
pub fn recurrent_head(
    isa: Isa,
    t: HeadTask<'_>,
    scale: f32,
    initial: Option<&[f32]>,
    scratch: &mut [f32],
) -> CoreResult<()> {
    match initial {
        Some(s0) => recurrent::recurrent_head_from(isa, t.rows(scale), s0, scratch),
        None => recurrent::recurrent_head(isa, t.rows(scale), scratch),
    }
    .map_err(msg)
}

/// The chunked (WY) form over one head of one sequence, chunks of `chunk` tokens from the
/// first row; `scratch`: at least [`chunked_scratch_len`] elements.
pub fn chunked_head(
    isa: Isa,
    t: HeadTask<'_>,
    scale: f32,
    chunk: usize,
    scratch: &mut [f32],
) -> CoreResult<()> {
    chunked::chunked_head(isa, t.rows(scale), Chunks::of(chunk), scratch).map_err(msg)
}

/// [`chunked_head`] reading the inputs in place (no gathering), the outputs handed to `out`
/// chunk by chunk: `out(t0, o)`, `o` the `[l, V]` outputs of tokens `t0..t0 + l`.
pub fn chunked_head_view(
    isa: Isa,
    head: StridedHead<'_>,
    chunk: usize,
    scratch: &mut [f32],
    out: impl FnMut(usize, &[f32]),
) -> CoreResult<()> {
    chunked::chunked_head_strided(isa, head, Chunks::of(chunk), scratch, out).map_err(msg)
}

/// The shapes of one loaded KDA layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerShape {
    /// Model hidden size.
    pub hidden: usize,
    /// KDA heads.
    pub heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Short-conv width.
    pub conv_width: usize,
}

/// Loads model layer `layer` (0-based) of the checkpoint folder `dir`, with the projections'
/// arithmetic `precision` (`"exact"` or `"bf16"`; bf16 repacks the weights into the panel
/// layout it needs).
pub fn open_layer(dir: &Path, layer: usize, precision: &str) -> CoreResult<(Model, LayerShape)> {
    let precision = match precision {
        "exact" => kda_core::Precision::Exact,
        "bf16" => kda_core::Precision::Bf16,
        p => return Err(format!("precision: expected 'exact' or 'bf16', got {p:?}")),
    };
    let mut model = Model::open_layers(dir, &[layer]).map_err(msg)?;
    if precision == kda_core::Precision::Bf16 {
        model.repack_panels().map_err(msg)?;
    }
    model.set_precision(precision).map_err(msg)?;
    let cfg = model.layer(layer).map_err(msg)?.cfg;
    let shape = LayerShape {
        hidden: cfg.hidden,
        heads: cfg.heads,
        head_dim: cfg.head_dim,
        conv_width: cfg.conv_width,
    };
    Ok((model, shape))
}

/// A zeroed cache of `sequences` sequences for the model's loaded layers.
pub fn new_cache(model: &Model, sequences: usize) -> CoreResult<ModelCache> {
    model.new_cache(sequences).map_err(msg)
}

/// Prefill of packed sequences `x` `[T, hidden]` from (and into) `cache`.
pub fn prefill(
    model: &Model,
    runner: &mut Runner,
    layer: usize,
    x: &[f32],
    cu_seqlens: &[usize],
    cache: &mut ModelCache,
) -> CoreResult<Vec<f32>> {
    model
        .forward(runner, layer, x, cu_seqlens, cache, kda_host::Mode::Auto)
        .map_err(msg)
}

/// One decode step of every sequence of `cache`; `x` is `[N, hidden]`.
pub fn decode(
    model: &Model,
    runner: &mut Runner,
    layer: usize,
    x: &[f32],
    cache: &mut ModelCache,
) -> CoreResult<Vec<f32>> {
    model.decode(runner, layer, x, cache).map_err(msg)
}

/// The cache as a safetensors file image (the `kda` tool's state-file format).
pub fn cache_to_bytes(cache: &ModelCache, model: &Model) -> CoreResult<Vec<u8>> {
    cache.to_bytes(model).map_err(msg)
}

/// A cache read back from [`cache_to_bytes`]'s format, checked against the model.
pub fn cache_from_bytes(bytes: &[u8], name: &str, model: &Model) -> CoreResult<ModelCache> {
    ModelCache::from_bytes(bytes, name, model).map_err(msg)
}

/// Writes the cache to `path` atomically (a temporary file next to it, fsync, rename):
/// `ModelCache::save` writes in place, so a crash could leave half a file.
pub fn save_cache(cache: &ModelCache, model: &Model, path: &Path) -> CoreResult<()> {
    use std::io::Write;
    let bytes = cache_to_bytes(cache, model)?;
    let name = path
        .file_name()
        .ok_or_else(|| format!("{}: not a file path", path.display()))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let io = |e: std::io::Error| format!("{}: {e}", path.display());
    let result = (|| {
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(&bytes).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Reads a cache written by [`save_cache`].
pub fn load_cache(path: &Path, model: &Model) -> CoreResult<ModelCache> {
    ModelCache::load(path, model).map_err(msg)
}

/// The recurrent state of layer `layer` of the cache, `[N, H, K, V]` K-first.
pub fn recurrent_state(cache: &ModelCache, layer: usize) -> CoreResult<&[f32]> {
    Ok(&cache.layer(layer).map_err(msg)?.recurrent)
}
