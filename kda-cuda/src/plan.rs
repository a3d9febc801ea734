//! Pure host-side planning: layer dimensions, limits, launch configurations, shared-memory
//! sizes, the chunk table and the workspace layout. No CUDA call happens here, so all of it is
//! unit-tested on machines without a GPU.

use kda_core::{GateProj, KdaConfig, KdaError};

use crate::error::CudaError;

/// Rows of the diagonal blocks of `A` in the chunked kernel (as on the CPU).
pub const SUB: usize = 16;
/// Largest chunk size the chunked kernels take.
pub const MAX_CHUNK: usize = 64;
/// Value columns per `kda_chunk_state` block.
pub const VT: usize = 32;
/// Threads of the chunked kernels' blocks.
pub const CHUNK_THREADS: u32 = 256;
/// Most threads of the per-row kernels' blocks (conv, norm, recurrent, decode).
pub const ROW_THREADS_MAX: u32 = 256;
/// Threads of the grid-stride elementwise kernels.
pub const ELEMENTWISE_THREADS: u32 = 256;
/// In `Mode::Auto`, a call runs chunked when its longest sequence has at least this many
/// tokens (fla switches to its token-by-token kernel at 64 tokens as well).
pub const AUTO_CHUNK_MIN_TOKENS: usize = 64;
/// CUDA's limit on `gridDim.y` and `gridDim.z`.
pub const GRID_YZ_MAX: usize = 65_535;
/// Workspace regions start on multiples of this many f32 (256 bytes), for cuBLAS.
pub const ALIGN_F32: usize = 64;

/// Storage format of activations and weight matrices on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE f32.
    F32,
    /// bfloat16.
    Bf16,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 => 2,
        }
    }
}

fn unsupported(what: String) -> CudaError {
    CudaError::Unsupported(what)
}

/// `v` as an `i32` kernel argument, or an error naming it.
pub fn to_i32(what: &str, v: usize) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| unsupported(format!("{what} = {v} does not fit in i32")))
}

/// The core's checked size arithmetic, with its error converted.
fn mul(what: &'static str, a: usize, b: usize) -> Result<usize, CudaError> {
    Ok(kda_core::error::mul(what, a, b)?)
}

/// The core's checked size arithmetic, with its error converted.
fn add(what: &'static str, a: usize, b: usize) -> Result<usize, CudaError> {
    Ok(kda_core::error::add(what, a, b)?)
}

/// The layer's widths and the column layout of the fused input projection.
///
/// All projections that read `x` are concatenated into one matrix `W_in` `[P, hidden]`, in this
/// row order: q `[D]`, k `[D]`, v `[D]`, decay (full `[D]` or the low-rank down `[r_f]`), beta
/// `[H]`, output gate (full `[D]` or the low-rank down `[r_g]`); so one GEMM gives
/// `proj = x · W_inᵀ` `[T, P]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerDims {
    /// Model width.
    pub hidden: usize,
    /// Heads `H`.
    pub heads: usize,
    /// Key head dim `K`.
    pub k: usize,
    /// Value head dim `V` (= `K` in every KDA config).
    pub v: usize,
    /// `H·K`.
    pub d: usize,
    /// Conv width `W`.
    pub width: usize,
    /// Bottleneck of the decay projection (0 when full rank).
    pub rank_f: usize,
    /// Bottleneck of the output gate (0 when full rank).
    pub rank_g: usize,
    /// Columns of `proj`.
    pub p: usize,
    /// First column of the decay part of `proj`.
    pub f_off: usize,
    /// Width of the decay part (`D` or `r_f`).
    pub f_width: usize,
    /// Column of beta's logits.
    pub b_off: usize,
    /// First column of the output-gate part.
    pub g_off: usize,
    /// Width of the output-gate part (`D` or `r_g`).
    pub g_width: usize,
}

impl LayerDims {
    /// Validates `cfg` (core rules, then this backend's limits) and lays out the projection.
    pub fn new(cfg: &KdaConfig) -> Result<Self, CudaError> {
        cfg.validate()?;
        let (hidden, heads, k) = (cfg.hidden, cfg.heads, cfg.head_dim);
        let v = k;
        let d = mul("heads * head_dim", heads, k)?;
        let rank_f = cfg.decay_proj.rank();
        let rank_g = cfg.output_gate.rank();
        let f_width = if cfg.decay_proj == GateProj::FullRank {
            d
        } else {
            rank_f
        };
        let g_width = if cfg.output_gate == GateProj::FullRank {
            d
        } else {
            rank_g
        };
        let f_off = mul("in-projection", 3, d)?;
        let b_off = add("in-projection", f_off, f_width)?;
        let g_off = add("in-projection", b_off, heads)?;
        let p = add("in-projection", g_off, g_width)?;
        let dims = LayerDims {
            hidden,
            heads,
            k,
            v,
            d,
            width: cfg.conv_width,
            rank_f,
            rank_g,
            p,
            f_off,
            f_width,
            b_off,
            g_off,
            g_width,
        };
        dims.check_limits()?;
        Ok(dims)
    }

    fn check_limits(&self) -> Result<(), CudaError> {
        // Every width is passed to kernels and cuBLAS as a 32-bit int.
        for (what, v) in [
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("head_dim", self.k),
            ("conv_width", self.width),
            ("in-projection width", self.p),
            ("3 * heads * head_dim", 3 * self.d),
        ] {
            to_i32(what, v)?;
        }
        // conv_prefill's grid is (T, 3H).
        if 3 * self.heads > GRID_YZ_MAX {
            return Err(unsupported(format!(
                "{} heads: at most {} (grid y of the conv kernel is 3·H)",
                self.heads,
                GRID_YZ_MAX / 3
            )));
        }
        if self.v.div_ceil(VT) > GRID_YZ_MAX {
            return Err(unsupported(format!("head_dim {} too large", self.k)));
        }
        Ok(())
    }

    /// Whether the decay projection is low-rank (needs the up-projection GEMM).
    pub fn decay_low_rank(&self) -> bool {
        self.rank_f > 0
    }

    /// Whether the output gate is low-rank.
    pub fn gate_low_rank(&self) -> bool {
        self.rank_g > 0
    }
}

/// A kernel launch shape: grid, threads per block, dynamic shared memory in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    /// `gridDim`.
    pub grid: (u32, u32, u32),
    /// `blockDim.x` (blocks are one-dimensional, a multiple of 32).
    pub block: u32,
    /// Dynamic shared memory per block, bytes.
    pub smem: u32,
}

fn grid_dim(what: &str, v: usize, max: usize) -> Result<u32, CudaError> {
    if v == 0 || v > max {
        return Err(unsupported(format!(
            "grid dimension {what} = {v} outside 1..={max}"
        )));
    }
    Ok(v as u32)
}

const GRID_X_MAX: usize = i32::MAX as usize;

/// Threads for a block that walks a row of `n` values: a multiple of 32 in 32..=256.
pub fn row_threads(n: usize) -> u32 {
    (n.div_ceil(32) * 32).clamp(32, ROW_THREADS_MAX as usize) as u32
}

/// A grid-stride launch over `total` elements (`None` when there is nothing to do).
pub fn elementwise(total: usize) -> Option<Launch> {
    if total == 0 {
        return None;
    }
    let blocks = total.div_ceil(ELEMENTWISE_THREADS as usize).min(1 << 20);
    Some(Launch {
        grid: (blocks as u32, 1, 1),
        block: ELEMENTWISE_THREADS,
        smem: 0,
    })
}

/// `kda_conv_prefill`: one block per (token, q/k/v head).
pub fn conv_prefill(dims: &LayerDims, tokens: usize) -> Result<Launch, CudaError> {
    Ok(Launch {
        grid: (
            grid_dim("tokens", tokens, GRID_X_MAX)?,
            grid_dim("3·heads", 3 * dims.heads, GRID_YZ_MAX)?,
            1,
        ),
        block: row_threads(dims.k),
        smem: 0,
    })
}

/// `kda_gated_norm`: one block per (token, head).
pub fn gated_norm(dims: &LayerDims, tokens: usize) -> Result<Launch, CudaError> {
    Ok(Launch {
        grid: (
            grid_dim("tokens", tokens, GRID_X_MAX)?,
            grid_dim("heads", dims.heads, GRID_YZ_MAX)?,
            1,
        ),
        block: row_threads(dims.v),
        smem: 0,
    })
}

fn smem_u32(bytes: usize) -> Result<u32, CudaError> {
    u32::try_from(bytes).map_err(|_| unsupported(format!("{bytes} bytes of shared memory")))
}

/// `kda_recurrent`: one block per (sequence, head); shared memory `3·K` floats.
pub fn recurrent(dims: &LayerDims, seqs: usize) -> Result<Launch, CudaError> {
    Ok(Launch {
        grid: (
            grid_dim("sequences", seqs, GRID_X_MAX)?,
            grid_dim("heads", dims.heads, GRID_YZ_MAX)?,
            1,
        ),
        block: row_threads(dims.v),
        smem: smem_u32(4 * 3 * dims.k)?,
    })
}

/// `kda_decode`: one block per (sequence, head); shared memory `3·K + 2·V` floats.
pub fn decode(dims: &LayerDims, seqs: usize) -> Result<Launch, CudaError> {
    Ok(Launch {
        grid: (
            grid_dim("sequences", seqs, GRID_X_MAX)?,
            grid_dim("heads", dims.heads, GRID_YZ_MAX)?,
            1,
        ),
        block: row_threads(dims.v),
        smem: smem_u32(4 * (3 * dims.k + 2 * dims.v))?,
    })
}

/// Floats of `kda_chunk_intra`'s dynamic shared memory (mirrors chunked.cu):
/// `bh, bl [C·K] | qt, kt, kh [16·(K+1)] | A_qk, N, M [C·C] | beta [C]`.
pub fn intra_smem_floats(chunk: usize, k: usize) -> usize {
    2 * chunk * k + 3 * SUB * (k + 1) + 3 * chunk * chunk + chunk
}

/// Floats of `kda_chunk_state`'s dynamic shared memory (mirrors chunked.cu):
/// `S [K·32] | Δ [C·32] | X [C·K] | A_qk [C·C] | γ [K]`.
pub fn state_smem_floats(chunk: usize, k: usize) -> usize {
    k * VT + chunk * VT + chunk * k + chunk * chunk + k
}

/// Largest shared memory, in bytes, either chunked kernel needs for chunk `chunk` and key dim `k`.
pub fn chunked_smem_bytes(chunk: usize, k: usize) -> usize {
    4 * intra_smem_floats(chunk, k).max(state_smem_floats(chunk, k))
}

/// Static shared memory the chunked kernels declare besides the dynamic part (`red[32]`).
pub const CHUNK_STATIC_SMEM: usize = 128;

/// The chunk size: `requested` when given (1..=[`MAX_CHUNK`], and it must fit), else the
/// largest of 64, 32, 16 whose shared memory fits in `smem_limit` bytes per block (the
/// device's opt-in maximum). Results do not depend on the chunk size beyond f32 rounding.
pub fn choose_chunk(
    k: usize,
    smem_limit: usize,
    requested: Option<usize>,
) -> Result<usize, CudaError> {
    let fits = |c: usize| chunked_smem_bytes(c, k) + CHUNK_STATIC_SMEM <= smem_limit;
    match requested {
        Some(c) if c == 0 || c > MAX_CHUNK => Err(CudaError::Core(KdaError::Config {
            field: "chunk_size",
            reason: "the CUDA chunked kernels take 1..=64",
        })),
        Some(c) if fits(c) => Ok(c),
        Some(c) => Err(unsupported(format!(
            "chunk size {c} with head_dim {k} needs {} bytes of shared memory per block; the device allows {smem_limit}",
            chunked_smem_bytes(c, k) + CHUNK_STATIC_SMEM
        ))),
        None => [64, 32, 16].into_iter().find(|&c| fits(c)).ok_or_else(|| {
            unsupported(format!(
                "head_dim {k}: even chunk 16 needs {} bytes of shared memory per block; the device allows {smem_limit}",
                chunked_smem_bytes(16, k) + CHUNK_STATIC_SMEM
            ))
        }),
    }
}

/// `kda_chunk_intra`: one block per (chunk, head).
pub fn chunk_intra(dims: &LayerDims, n_chunks: usize, chunk: usize) -> Result<Launch, CudaError> {
    Ok(Launch {
        grid: (
            grid_dim("chunks", n_chunks, GRID_X_MAX)?,
            grid_dim("heads", dims.heads, GRID_YZ_MAX)?,
            1,
        ),
        block: CHUNK_THREADS,
        smem: smem_u32(4 * intra_smem_floats(chunk, dims.k))?,
    })
}

/// `kda_chunk_state`: one block per (sequence, head, 32 value columns).
pub fn chunk_state(dims: &LayerDims, seqs: usize, chunk: usize) -> Result<Launch, CudaError> {
    Ok(Launch {
        grid: (
            grid_dim("sequences", seqs, GRID_X_MAX)?,
            grid_dim("heads", dims.heads, GRID_YZ_MAX)?,
            grid_dim("value tiles", dims.v.div_ceil(VT), GRID_YZ_MAX)?,
        ),
        block: CHUNK_THREADS,
        smem: smem_u32(4 * state_smem_floats(chunk, dims.k))?,
    })
}

/// The chunks of packed sequences: each sequence is cut into chunks of `chunk` tokens from its
/// own first token (the last one partial); empty sequences have none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkTable {
    /// `(first token, length)` of every chunk, sequence by sequence.
    pub chunks: Vec<[i32; 2]>,
    /// `[N+1]`: sequence `n` owns chunks `first[n]..first[n+1]`.
    pub first: Vec<i32>,
}

impl ChunkTable {
    /// Builds the table for (already validated) offsets `cu`.
    pub fn new(cu: &[usize], chunk: usize) -> Result<Self, CudaError> {
        if chunk == 0 {
            return Err(CudaError::Core(KdaError::Config {
                field: "chunk_size",
                reason: "must be at least 1",
            }));
        }
        let mut chunks = Vec::new();
        let mut first = Vec::with_capacity(cu.len());
        for pair in cu.windows(2) {
            first.push(to_i32("chunks", chunks.len())?);
            let mut t = pair[0];
            while t < pair[1] {
                let len = chunk.min(pair[1] - t);
                chunks.push([to_i32("token", t)?, to_i32("chunk length", len)?]);
                t += len;
            }
        }
        first.push(to_i32("chunks", chunks.len())?);
        Ok(ChunkTable { chunks, first })
    }

    /// Number of chunks.
    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    /// True when there are no chunks.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }
}

/// The `i32` index data one forward uploads: `cu [N+1] | chunk_first [N+1] | chunks [2·n]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexData {
    /// The flat array.
    pub data: Vec<i32>,
    /// Offset of `chunk_first` (elements).
    pub first_off: usize,
    /// Offset of the chunk pairs (elements).
    pub chunks_off: usize,
}

impl IndexData {
    /// Packs `cu` and, for a chunked call, its chunk table.
    pub fn new(cu: &[usize], table: Option<&ChunkTable>) -> Result<Self, CudaError> {
        let mut data = cu
            .iter()
            .map(|&c| to_i32("cu_seqlens entry", c))
            .collect::<Result<Vec<i32>, _>>()?;
        let first_off = data.len();
        if let Some(t) = table {
            data.extend_from_slice(&t.first);
        }
        let chunks_off = data.len();
        if let Some(t) = table {
            data.extend(t.chunks.iter().flatten());
        }
        Ok(IndexData {
            data,
            first_off,
            chunks_off,
        })
    }
}

/// A region of the workspace, in f32 elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Region {
    /// First element.
    pub off: usize,
    /// Elements (0: unused by this call).
    pub len: usize,
}

/// Where each intermediate lives in the f32 workspace. Sizes are worst cases over the input,
/// weight and output formats, so the same layout serves every call of the same shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkspaceLayout {
    /// Raw projections `[T, P]`.
    pub proj: Region,
    /// Up-projected decay logits `[T, D]` (low-rank decay only).
    pub f_up: Region,
    /// Up-projected output-gate logits `[T, D]` (low-rank output gate only).
    pub g_up: Region,
    /// `x` converted to the weights' format `[T, hidden]`.
    pub x_cast: Region,
    /// Low-rank bottlenecks converted to bf16 `[T, r_f + r_g]`.
    pub low_cast: Region,
    /// Conv'd (and q/k normalised) rows `[T, 3D]`.
    pub qkv: Region,
    /// Log-decay `[T, D]`.
    pub g: Region,
    /// Beta `[T, H]`.
    pub beta: Region,
    /// Chunked: `scale·q·e^b` `[T, D]`.
    pub qg: Region,
    /// Chunked: `k·e^(b_last−b)` `[T, D]`.
    pub kg: Region,
    /// Chunked: `w` `[T, D]`.
    pub w: Region,
    /// Chunked: `u` `[T, H·V]`.
    pub u: Region,
    /// Chunked: `A_qk` rows `[T, H, C_max]`.
    pub aqk: Region,
    /// Delta-rule output `[T, H·V]`.
    pub o: Region,
    /// Gated-norm output, the `o_proj` operand `[T, H·V]`.
    pub normed: Region,
    /// f32 staging of the output when it is converted afterwards `[T, hidden]`.
    pub out_stage: Region,
    /// Total f32 elements.
    pub total: usize,
}

struct Carver {
    next: usize,
}

impl Carver {
    fn take(&mut self, len: usize) -> Result<Region, CudaError> {
        let off = self.next;
        let padded = len
            .checked_next_multiple_of(ALIGN_F32)
            .ok_or(CudaError::Core(KdaError::Overflow { what: "workspace" }))?;
        self.next = add("workspace", off, padded)?;
        Ok(Region { off, len })
    }
}

impl WorkspaceLayout {
    /// Layout for a forward over `tokens` tokens (`chunked`: whether chunk buffers are needed;
    /// they are sized for [`MAX_CHUNK`], so any chunk size fits).
    pub fn forward(dims: &LayerDims, tokens: usize, chunked: bool) -> Result<Self, CudaError> {
        let t = tokens;
        let dv = mul("workspace", dims.heads, dims.v)?;
        let td = mul("workspace", t, dims.d)?;
        let tdv = mul("workspace", t, dv)?;
        let mut c = Carver { next: 0 };
        let mut l = WorkspaceLayout {
            proj: c.take(mul("workspace", t, dims.p)?)?,
            f_up: c.take(if dims.decay_low_rank() { td } else { 0 })?,
            g_up: c.take(if dims.gate_low_rank() { td } else { 0 })?,
            x_cast: c.take(mul("workspace", t, dims.hidden)?)?,
            low_cast: c.take(mul("workspace", t, dims.rank_f + dims.rank_g)?)?,
            qkv: c.take(mul("workspace", td, 3)?)?,
            g: c.take(td)?,
            beta: c.take(mul("workspace", t, dims.heads)?)?,
            ..Default::default()
        };
        if chunked {
            l.qg = c.take(td)?;
            l.kg = c.take(td)?;
            l.w = c.take(td)?;
            l.u = c.take(tdv)?;
            l.aqk = c.take(mul(
                "workspace",
                mul("workspace", t, dims.heads)?,
                MAX_CHUNK,
            )?)?;
        }
        l.o = c.take(tdv)?;
        l.normed = c.take(tdv)?;
        l.out_stage = c.take(mul("workspace", t, dims.hidden)?)?;
        l.total = c.next.max(1);
        Ok(l)
    }

    /// Layout for a decode step over `seqs` sequences (projections, casts, the normed rows).
    pub fn decode(dims: &LayerDims, seqs: usize) -> Result<Self, CudaError> {
        let n = seqs;
        let nd = mul("workspace", n, dims.d)?;
        let ndv = mul("workspace", n, mul("workspace", dims.heads, dims.v)?)?;
        let mut c = Carver { next: 0 };
        let mut l = WorkspaceLayout {
            proj: c.take(mul("workspace", n, dims.p)?)?,
            f_up: c.take(if dims.decay_low_rank() { nd } else { 0 })?,
            g_up: c.take(if dims.gate_low_rank() { nd } else { 0 })?,
            x_cast: c.take(mul("workspace", n, dims.hidden)?)?,
            low_cast: c.take(mul("workspace", n, dims.rank_f + dims.rank_g)?)?,
            ..Default::default()
        };
        l.normed = c.take(ndv)?;
        l.out_stage = c.take(mul("workspace", n, dims.hidden)?)?;
        l.total = c.next.max(1);
        Ok(l)
    }
}

/// The checked host-side shape of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallShape {
    /// Rows of `x` (tokens; for decode, sequences).
    pub tokens: usize,
    /// Sequences `N`.
    pub seqs: usize,
    /// Tokens of the longest sequence.
    pub longest: usize,
}

fn rows_of(arg: &'static str, len: usize, width: usize) -> Result<usize, CudaError> {
    if width == 0 || !len.is_multiple_of(width) {
        return Err(CudaError::Core(KdaError::Length {
            arg,
            expected: len - len % width.max(1),
            actual: len,
        }));
    }
    Ok(len / width)
}

fn same_len(arg: &'static str, expected: usize, actual: usize) -> Result<(), CudaError> {
    if expected == actual {
        Ok(())
    } else {
        Err(CudaError::Core(KdaError::Length {
            arg,
            expected,
            actual,
        }))
    }
}

/// Checks a forward call's host-side arguments (as the CPU does, plus this backend's 32-bit
/// limits): `x_len` and `out_len` elements of `[T, hidden]` rows, `cu_seqlens` `[N+1]`.
pub fn forward_shape(
    cfg: &KdaConfig,
    x_len: usize,
    out_len: usize,
    cu_seqlens: &[usize],
) -> Result<CallShape, CudaError> {
    LayerDims::new(cfg)?;
    let tokens = rows_of("x", x_len, cfg.hidden)?;
    same_len("out", x_len, out_len)?;
    let seqs = kda_core::validate_offsets(cu_seqlens, tokens)?;
    to_i32("tokens", tokens)?;
    to_i32("sequences", seqs)?;
    let longest = cu_seqlens
        .windows(2)
        .map(|p| p[1] - p[0])
        .max()
        .unwrap_or(0);
    Ok(CallShape {
        tokens,
        seqs,
        longest,
    })
}

/// Checks a decode step's host-side arguments: `x_len` and `out_len` elements of `[N, hidden]`.
pub fn decode_shape(cfg: &KdaConfig, x_len: usize, out_len: usize) -> Result<CallShape, CudaError> {
    LayerDims::new(cfg)?;
    let seqs = rows_of("x", x_len, cfg.hidden)?;
    same_len("out", x_len, out_len)?;
    to_i32("sequences", seqs)?;
    Ok(CallShape {
        tokens: seqs,
        seqs,
        longest: seqs.min(1),
    })
}

/// f32 elements of workspace a forward over up to `tokens` tokens needs (any mode, any input,
/// weight and output format) — what [`kda_core::KdaBackend::forward_workspace_len`] returns.
pub fn forward_workspace_len(cfg: &KdaConfig, tokens: usize) -> Result<usize, CudaError> {
    Ok(WorkspaceLayout::forward(&LayerDims::new(cfg)?, tokens, true)?.total)
}

/// f32 elements of workspace a decode step over `batch` sequences needs.
pub fn decode_workspace_len(cfg: &KdaConfig, batch: usize) -> Result<usize, CudaError> {
    Ok(WorkspaceLayout::decode(&LayerDims::new(cfg)?, batch)?.total)
}

/// How a GEMM's activation operand reaches cuBLAS: as given, or converted to the weights'
/// format first (cuBLAS needs both operands in one format).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    /// Already in the weights' format.
    Direct,
    /// Convert into workspace first.
    Convert,
}

/// [`Operand`] for activations in `act` against weights in `weights`.
pub fn operand(act: Dtype, weights: Dtype) -> Operand {
    if act == weights {
        Operand::Direct
    } else {
        Operand::Convert
    }
}

/// How a GEMM's result reaches a destination of format `out`: cuBLAS writes f32 from either
/// weight format and bf16 only from bf16 weights (`CUBLAS_COMPUTE_32F`); f32 weights with a
/// bf16 destination go through an f32 staging buffer and a conversion.
pub fn result_path(weights: Dtype, out: Dtype) -> Operand {
    match (weights, out) {
        (Dtype::F32, Dtype::Bf16) => Operand::Convert,
        _ => Operand::Direct,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(h: usize, k: usize, full: bool) -> KdaConfig {
        if full {
            KdaConfig::kimi_k3(64, h, k)
        } else {
            KdaConfig::kimi_linear(64, h, k)
        }
    }

    #[test]
    fn in_projection_columns_are_contiguous() {
        let d = LayerDims::new(&cfg(3, 16, false)).unwrap();
        assert_eq!(
            (d.d, d.f_off, d.f_width, d.b_off, d.g_off, d.g_width),
            (48, 144, 16, 160, 163, 16)
        );
        assert_eq!(d.p, 179);
        let d = LayerDims::new(&cfg(3, 16, true)).unwrap();
        // K3: low-rank decay, full-rank output gate.
        assert_eq!((d.f_width, d.g_width, d.p), (16, 48, 144 + 16 + 3 + 48));
        assert!(d.decay_low_rank() && !d.gate_low_rank());
    }

    #[test]
    fn invalid_configs_are_errors_not_panics() {
        let mut c = cfg(2, 8, false);
        c.head_dim = 0;
        assert!(matches!(LayerDims::new(&c), Err(CudaError::Core(_))));
        let c = cfg(30_000, 8, false);
        assert!(matches!(LayerDims::new(&c), Err(CudaError::Unsupported(_))));
        let mut c = cfg(2, 8, false);
        c.hidden = usize::MAX / 2;
        assert!(LayerDims::new(&c).is_err());
    }

    #[test]
    fn launch_shapes() {
        let d = LayerDims::new(&cfg(96, 128, false)).unwrap();
        let l = conv_prefill(&d, 8192).unwrap();
        assert_eq!((l.grid, l.block, l.smem), ((8192, 288, 1), 128, 0));
        assert!(conv_prefill(&d, 0).is_err());
        let l = decode(&d, 64).unwrap();
        assert_eq!(
            (l.grid, l.block, l.smem),
            ((64, 96, 1), 128, 4 * (3 * 128 + 2 * 128))
        );
        let l = recurrent(&d, 3).unwrap();
        assert_eq!((l.grid, l.block, l.smem), ((3, 96, 1), 128, 4 * 3 * 128));
        let l = chunk_state(&d, 2, 64).unwrap();
        assert_eq!((l.grid, l.block), ((2, 96, 4), CHUNK_THREADS));
        let l = chunk_intra(&d, 130, 32).unwrap();
        assert_eq!(l.grid, (130, 96, 1));
        assert_eq!(l.smem as usize, 4 * intra_smem_floats(32, 128));
        assert_eq!(row_threads(1), 32);
        assert_eq!(row_threads(33), 64);
        assert_eq!(row_threads(1000), 256);
        assert_eq!(elementwise(0), None);
        assert_eq!(elementwise(257).unwrap().grid.0, 2);
        assert_eq!(elementwise(usize::MAX / 2).unwrap().grid.0, 1 << 20);
    }

    #[test]
    fn shared_memory_formulas_and_chunk_choice() {
        // Hand-checked against chunked.cu's carving.
        assert_eq!(
            intra_smem_floats(64, 128),
            2 * 64 * 128 + 48 * 129 + 3 * 4096 + 64
        );
        assert_eq!(
            state_smem_floats(64, 128),
            128 * 32 + 64 * 32 + 64 * 128 + 4096 + 128
        );
        let h100 = 227 * 1024;
        let a100 = 163 * 1024;
        assert_eq!(choose_chunk(128, h100, None).unwrap(), 64);
        assert_eq!(choose_chunk(128, a100, None).unwrap(), 64);
        assert_eq!(choose_chunk(256, a100, None).unwrap(), 32);
        assert_eq!(choose_chunk(128, 48 * 1024, None).unwrap(), 16);
        assert!(matches!(
            choose_chunk(4096, a100, None),
            Err(CudaError::Unsupported(_))
        ));
        assert_eq!(choose_chunk(64, a100, Some(48)).unwrap(), 48);
        assert!(matches!(
            choose_chunk(64, a100, Some(0)),
            Err(CudaError::Core(_))
        ));
        assert!(matches!(
            choose_chunk(64, a100, Some(65)),
            Err(CudaError::Core(_))
        ));
        assert!(matches!(
            choose_chunk(256, a100, Some(64)),
            Err(CudaError::Unsupported(_))
        ));
    }

    #[test]
    fn chunk_table_restarts_at_every_sequence() {
        let t = ChunkTable::new(&[0, 5, 5, 12, 13], 4).unwrap();
        assert_eq!(t.chunks, vec![[0, 4], [4, 1], [5, 4], [9, 3], [12, 1]]);
        assert_eq!(t.first, vec![0, 2, 2, 4, 5]);
        let t = ChunkTable::new(&[0, 0], 16).unwrap();
        assert!(t.is_empty());
        assert_eq!(t.first, vec![0, 0]);
        assert!(ChunkTable::new(&[0, 3], 0).is_err());
        let idx = IndexData::new(
            &[0, 5, 5, 12, 13],
            Some(&ChunkTable::new(&[0, 5, 5, 12, 13], 4).unwrap()),
        )
        .unwrap();
        assert_eq!((idx.first_off, idx.chunks_off, idx.data.len()), (5, 10, 20));
        assert_eq!(&idx.data[10..14], &[0, 4, 4, 1]);
        let idx = IndexData::new(&[0, 3], None).unwrap();
        assert_eq!((idx.first_off, idx.chunks_off, idx.data.len()), (2, 2, 2));
        assert!(IndexData::new(&[0, usize::MAX], None).is_err());
    }

    #[test]
    fn workspace_regions_are_aligned_disjoint_and_in_bounds() {
        for full in [false, true] {
            let d = LayerDims::new(&cfg(3, 16, full)).unwrap();
            for (l, t) in [
                (WorkspaceLayout::forward(&d, 37, true).unwrap(), 37),
                (WorkspaceLayout::forward(&d, 5, false).unwrap(), 5),
                (WorkspaceLayout::decode(&d, 7).unwrap(), 7),
            ] {
                let regions = [
                    l.proj,
                    l.f_up,
                    l.g_up,
                    l.x_cast,
                    l.low_cast,
                    l.qkv,
                    l.g,
                    l.beta,
                    l.qg,
                    l.kg,
                    l.w,
                    l.u,
                    l.aqk,
                    l.o,
                    l.normed,
                    l.out_stage,
                ];
                let mut used: Vec<Region> = regions.into_iter().filter(|r| r.len > 0).collect();
                used.sort_by_key(|r| r.off);
                for r in &used {
                    assert_eq!(r.off % ALIGN_F32, 0);
                    assert!(r.off + r.len <= l.total);
                }
                for p in used.windows(2) {
                    assert!(p[0].off + p[0].len <= p[1].off, "overlap");
                }
                assert_eq!(l.proj.len, t * d.p);
                assert_eq!(l.f_up.len > 0, d.decay_low_rank());
            }
        }
        let d = LayerDims::new(&cfg(1, 8, false)).unwrap();
        assert!(WorkspaceLayout::forward(&d, usize::MAX / 4, true).is_err());
        let empty = WorkspaceLayout::forward(&d, 0, true).unwrap();
        assert_eq!(empty.total, 1);
    }

    #[test]
    fn call_shapes_are_checked() {
        let c = cfg(2, 8, false);
        let s = forward_shape(&c, 5 * 64, 5 * 64, &[0, 2, 2, 5]).unwrap();
        assert_eq!((s.tokens, s.seqs, s.longest), (5, 3, 3));
        assert!(matches!(
            forward_shape(&c, 5 * 64 + 1, 5 * 64 + 1, &[0, 5]),
            Err(CudaError::Core(KdaError::Length { arg: "x", .. }))
        ));
        assert!(matches!(
            forward_shape(&c, 5 * 64, 4 * 64, &[0, 5]),
            Err(CudaError::Core(KdaError::Length { arg: "out", .. }))
        ));
        assert!(matches!(
            forward_shape(&c, 5 * 64, 5 * 64, &[0, 4]),
            Err(CudaError::Core(KdaError::Offsets { .. }))
        ));
        assert!(matches!(
            forward_shape(&c, 5 * 64, 5 * 64, &[]),
            Err(CudaError::Core(KdaError::Offsets { .. }))
        ));
        assert!(matches!(
            forward_shape(&c, 5 * 64, 5 * 64, &[0, 3, 2, 5]),
            Err(CudaError::Core(KdaError::Offsets { .. }))
        ));
        let s = forward_shape(&c, 0, 0, &[0, 0, 0]).unwrap();
        assert_eq!((s.tokens, s.seqs, s.longest), (0, 2, 0));
        let s = decode_shape(&c, 3 * 64, 3 * 64).unwrap();
        assert_eq!((s.tokens, s.seqs), (3, 3));
        assert!(decode_shape(&c, 3 * 64, 2 * 64).is_err());
        let mut bad = c;
        bad.hidden = 0;
        assert!(forward_shape(&bad, 0, 0, &[0, 0]).is_err());
        assert!(forward_workspace_len(&c, 100).unwrap() > decode_workspace_len(&c, 100).unwrap());
    }

    #[test]
    fn gemm_format_paths() {
        assert_eq!(operand(Dtype::F32, Dtype::F32), Operand::Direct);
        assert_eq!(operand(Dtype::F32, Dtype::Bf16), Operand::Convert);
        assert_eq!(operand(Dtype::Bf16, Dtype::F32), Operand::Convert);
        assert_eq!(result_path(Dtype::Bf16, Dtype::Bf16), Operand::Direct);
        assert_eq!(result_path(Dtype::Bf16, Dtype::F32), Operand::Direct);
        assert_eq!(result_path(Dtype::F32, Dtype::Bf16), Operand::Convert);
        assert_eq!(Dtype::Bf16.size(), 2);
    }
}
