//! The layer configuration and options as C structs, and the sizing functions that need no
//! weights.

use kda_core::{DecayGate, ForwardOptions, GateProj, Isa, Mode, Precision};

use crate::ffi::{get, put};
use crate::status::{guard, KdaStatus, Res};

/// `KdaConfig::decay_gate`: Kimi Linear's `g = −exp(A_log) · softplus(f + dt_bias)` (needs
/// `A_log`).
pub const KDA_DECAY_SOFTPLUS: u32 = 0;
/// `KdaConfig::decay_gate`: Kimi K3's `g = lower_bound · sigmoid(exp(A_log) · (f + dt_bias))`.
pub const KDA_DECAY_LOWER_BOUND: u32 = 1;

/// `KdaOptions::mode`: chunked from 8 tokens on, else token by token.
pub const KDA_MODE_AUTO: u32 = 0;
/// `KdaOptions::mode`: token by token.
pub const KDA_MODE_RECURRENT: u32 = 1;
/// `KdaOptions::mode`: the chunked (WY/UT) form.
pub const KDA_MODE_CHUNKED: u32 = 2;

/// `KdaOptions::isa`: the fastest kernel path this CPU supports.
pub const KDA_ISA_AUTO: u32 = 0;
/// `KdaOptions::isa`: portable kernels (the only ones on Cortex-M; bitwise the same on every
/// target).
pub const KDA_ISA_PORTABLE: u32 = 1;
/// `KdaOptions::isa`: x86-64 AVX2 + FMA (`KDA_STATUS_CONFIG` where the CPU lacks them).
pub const KDA_ISA_AVX2_FMA: u32 = 2;
/// `KdaOptions::isa`: x86-64 AVX-512F with AVX2 and FMA (`KDA_STATUS_CONFIG` where the CPU
/// lacks them).
pub const KDA_ISA_AVX512F: u32 = 3;
/// `KdaOptions::isa`: aarch64 NEON (`KDA_STATUS_CONFIG` on other CPUs).
pub const KDA_ISA_NEON: u32 = 4;
/// `KdaOptions::isa`: x86-64 AVX-512F with AVX512BW and AVX512_BF16 (native `vdpbf16ps` for
/// `KDA_PRECISION_BF16`; `KDA_STATUS_CONFIG` where the CPU lacks them).
pub const KDA_ISA_AVX512_BF16: u32 = 5;

/// `KdaOptions::precision`: f32 activations, one f32 chain per output (the default).
pub const KDA_PRECISION_EXACT: u32 = 0;
/// `KdaOptions::precision`: each projection's input rounded to bf16, bf16 products summed in
/// f32 (`vdpbf16ps` where the CPU has avx512_bf16, the same bits emulated elsewhere). Needs
/// every projection as bf16 in `KDA_LAYOUT_PANELS` (`KDA_STATUS_CONFIG` otherwise).
pub const KDA_PRECISION_BF16: u32 = 1;

/// Shapes and gate forms of one KDA layer (`K = V = head_dim`). Fill it by hand or start from
/// `kda_config_kimi_linear` / `kda_config_kimi_k3`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KdaConfig {
    /// Model width.
    pub hidden: usize,
    /// Number of heads `H`.
    pub heads: usize,
    /// Head dim `K` (= `V`).
    pub head_dim: usize,
    /// Short-conv width `W ≥ 1` (4 in every Kimi model).
    pub conv_width: usize,
    /// `KDA_DECAY_SOFTPLUS` or `KDA_DECAY_LOWER_BOUND`.
    pub decay_gate: u32,
    /// Lower bound of `KDA_DECAY_LOWER_BOUND` (finite, negative; K3 uses −5). Ignored for
    /// softplus.
    pub lower_bound: f32,
    /// Rank of the decay projection: 0 = one full-rank matrix `f_proj`, else `f_a_proj` /
    /// `f_b_proj` of this rank.
    pub decay_rank: usize,
    /// Rank of the output-gate projection: 0 = full-rank `g_proj`, else `g_a_proj` / `g_b_proj`.
    pub output_gate_rank: usize,
    /// Epsilon of the gated RMSNorm (Kimi: 1e-5).
    pub rms_eps: f32,
    /// Epsilon of the q/k L2 norm (1e-6).
    pub l2_eps: f32,
    /// Query scale; 0 means `head_dim^-0.5`.
    pub scale: f32,
}

/// How a layer runs: mode, chunk size and kernel path.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KdaOptions {
    /// `KDA_MODE_AUTO`, `KDA_MODE_RECURRENT` or `KDA_MODE_CHUNKED`.
    pub mode: u32,
    /// Chunk size of the chunked form, 1..=256 (16 by default).
    pub chunk_size: usize,
    /// `KDA_ISA_AUTO`, `KDA_ISA_PORTABLE`, `KDA_ISA_AVX2_FMA`, `KDA_ISA_AVX512F`,
    /// `KDA_ISA_AVX512_BF16` or `KDA_ISA_NEON`.
    pub isa: u32,
    /// `KDA_PRECISION_EXACT` (0, the default) or `KDA_PRECISION_BF16`.
    pub precision: u32,
}

fn gate_proj(rank: usize) -> GateProj {
    if rank == 0 {
        GateProj::FullRank
    } else {
        GateProj::LowRank { rank }
    }
}

fn config_err(field: &'static str, reason: &'static str) -> kda_core::KdaError {
    kda_core::KdaError::Config { field, reason }
}

impl KdaConfig {
    /// The core's config, validated.
    pub(crate) fn to_core(self) -> Result<kda_core::KdaConfig, kda_core::KdaError> {
        let decay_gate = match self.decay_gate {
            KDA_DECAY_SOFTPLUS => DecayGate::Softplus,
            KDA_DECAY_LOWER_BOUND => DecayGate::LowerBound(self.lower_bound),
            _ => return Err(config_err("decay_gate", "unknown KDA_DECAY_* value")),
        };
        let c = kda_core::KdaConfig {
            hidden: self.hidden,
            heads: self.heads,
            head_dim: self.head_dim,
            conv_width: self.conv_width,
            decay_gate,
            decay_proj: gate_proj(self.decay_rank),
            output_gate: gate_proj(self.output_gate_rank),
            rms_eps: self.rms_eps,
            l2_eps: self.l2_eps,
            scale: (self.scale != 0.0).then_some(self.scale),
        };
        c.validate()?;
        Ok(c)
    }

    fn from_core(c: &kda_core::KdaConfig) -> Self {
        let (decay_gate, lower_bound) = match c.decay_gate {
            DecayGate::Softplus => (KDA_DECAY_SOFTPLUS, 0.0),
            DecayGate::LowerBound(lb) => (KDA_DECAY_LOWER_BOUND, lb),
        };
        KdaConfig {
            hidden: c.hidden,
            heads: c.heads,
            head_dim: c.head_dim,
            conv_width: c.conv_width,
            decay_gate,
            lower_bound,
            decay_rank: c.decay_proj.rank(),
            output_gate_rank: c.output_gate.rank(),
            rms_eps: c.rms_eps,
            l2_eps: c.l2_eps,
            scale: c.scale.unwrap_or(0.0),
        }
    }
}

impl KdaOptions {
    /// The core's options (the ISA is checked by `KdaLayer::new` / the sizing functions).
    pub(crate) fn to_core(self) -> Result<ForwardOptions, kda_core::KdaError> {
        let mode = match self.mode {
            KDA_MODE_AUTO => Mode::Auto,
            KDA_MODE_RECURRENT => Mode::Recurrent,
            KDA_MODE_CHUNKED => Mode::Chunked,
            _ => return Err(config_err("mode", "unknown KDA_MODE_* value")),
        };
        let isa = match self.isa {
            KDA_ISA_AUTO => None,
            KDA_ISA_PORTABLE => Some(Isa::Portable),
            KDA_ISA_AVX2_FMA => Some(Isa::Avx2Fma),
            KDA_ISA_AVX512F => Some(Isa::Avx512F),
            KDA_ISA_NEON => Some(Isa::Neon),
            KDA_ISA_AVX512_BF16 => Some(Isa::Avx512Bf16),
            _ => return Err(config_err("isa", "unknown KDA_ISA_* value")),
        };
        let precision = match self.precision {
            KDA_PRECISION_EXACT => Precision::Exact,
            KDA_PRECISION_BF16 => Precision::Bf16,
            _ => return Err(config_err("precision", "unknown KDA_PRECISION_* value")),
        };
        Ok(ForwardOptions {
            mode,
            chunk_size: self.chunk_size,
            isa,
            precision,
        })
    }
}

/// Options from a pointer that may be NULL (the defaults).
///
/// # Safety
/// A non-NULL `opts` must point to a valid `KdaOptions`.
pub(crate) unsafe fn options(opts: *const KdaOptions) -> Res<ForwardOptions> {
    if opts.is_null() {
        return Ok(ForwardOptions::default());
    }
    // SAFETY: the caller's contract.
    Ok(unsafe { get(opts) }?.to_core()?)
}

/// The config behind `cfg`, validated.
///
/// # Safety
/// A non-NULL `cfg` must point to a valid `KdaConfig`.
pub(crate) unsafe fn config(cfg: *const KdaConfig) -> Res<kda_core::KdaConfig> {
    // SAFETY: the caller's contract.
    Ok(unsafe { get(cfg) }?.to_core()?)
}

/// A Kimi Linear layer: softplus decay gate, low-rank decay and output-gate projections of rank
/// `head_dim`, conv width 4, eps 1e-5 / 1e-6.
#[no_mangle]
pub extern "C" fn kda_config_kimi_linear(
    hidden: usize,
    heads: usize,
    head_dim: usize,
) -> KdaConfig {
    KdaConfig::from_core(&kda_core::KdaConfig::kimi_linear(hidden, heads, head_dim))
}

/// A Kimi K3 layer: lower-bound −5 decay gate (low-rank projection of rank `head_dim`),
/// full-rank output gate, conv width 4, eps 1e-5 / 1e-6.
#[no_mangle]
pub extern "C" fn kda_config_kimi_k3(hidden: usize, heads: usize, head_dim: usize) -> KdaConfig {
    KdaConfig::from_core(&kda_core::KdaConfig::kimi_k3(hidden, heads, head_dim))
}

/// The default options: `KDA_MODE_AUTO`, chunk 16, `KDA_ISA_AUTO`, `KDA_PRECISION_EXACT`.
#[no_mangle]
pub extern "C" fn kda_options_default() -> KdaOptions {
    KdaOptions {
        mode: KDA_MODE_AUTO,
        chunk_size: kda_core::DEFAULT_CHUNK,
        isa: KDA_ISA_AUTO,
        precision: KDA_PRECISION_EXACT,
    }
}

/// Writes `f(config)` through `out`.
///
/// # Safety
/// As the entry points: `cfg` a valid config or NULL, `out` writable or NULL.
unsafe fn size_of_cfg(
    cfg: *const KdaConfig,
    out: *mut usize,
    f: impl FnOnce(&kda_core::KdaConfig) -> Res<usize>,
) -> KdaStatus {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { config(cfg) }?;
        // SAFETY: the caller's contract.
        unsafe { put(out, f(&c)?) }
    })
}

/// Floats in one sequence's recurrent state `[H, K, V]` (K-first), written to `*len`. The
/// caller owns the state buffer: `N` sequences need `N · len` floats.
///
/// # Safety
/// `cfg`: a valid `KdaConfig`; `len`: writable.
#[no_mangle]
pub unsafe extern "C" fn kda_state_len(cfg: *const KdaConfig, len: *mut usize) -> KdaStatus {
    // SAFETY: forwarded contract.
    unsafe { size_of_cfg(cfg, len, |c| Ok(c.state_len()?)) }
}

/// Floats in one sequence's conv state for one of q, k, v (`[H·K, W−1]`), written to `*len`.
/// The caller owns the three conv-state buffers: `N` sequences need `N · len` floats each.
///
/// # Safety
/// `cfg`: a valid `KdaConfig`; `len`: writable.
#[no_mangle]
pub unsafe extern "C" fn kda_conv_state_len(cfg: *const KdaConfig, len: *mut usize) -> KdaStatus {
    // SAFETY: forwarded contract.
    unsafe { size_of_cfg(cfg, len, |c| Ok(c.conv_state_len()?)) }
}

/// Floats in one sequence's whole cache (recurrent state + three conv states), written to
/// `*len`.
///
/// # Safety
/// `cfg`: a valid `KdaConfig`; `len`: writable.
#[no_mangle]
pub unsafe extern "C" fn kda_cache_len(cfg: *const KdaConfig, len: *mut usize) -> KdaStatus {
    // SAFETY: forwarded contract.
    unsafe { size_of_cfg(cfg, len, |c| Ok(c.cache_len()?)) }
}

/// Floats of workspace for `kda_forward` with blocks of up to `block_tokens` tokens, before
/// the weights exist (static buffers); `opts` may be NULL (defaults). The caller owns the
/// workspace. Any size from `block_tokens = 1`'s works; in `KDA_MODE_AUTO` pass the longest
/// sequence length (or more) so the chunked scratch is included. Same figure as
/// `kda_layer_workspace_len`.
///
/// # Safety
/// `cfg`: a valid `KdaConfig`; `opts`: valid or NULL; `len`: writable.
#[no_mangle]
pub unsafe extern "C" fn kda_workspace_len(
    cfg: *const KdaConfig,
    opts: *const KdaOptions,
    block_tokens: usize,
    len: *mut usize,
) -> KdaStatus {
    // SAFETY: forwarded contract.
    unsafe {
        size_of_cfg(cfg, len, |c| {
            let o = options(opts)?;
            Ok(kda_core::workspace_len(c, &o, block_tokens, 1)?)
        })
    }
}

/// Floats of workspace for `kda_decode_step` over `batch` sequences in one block (a smaller
/// one, down to `batch = 1`'s, also works). The caller owns the workspace.
///
/// # Safety
/// `cfg`: a valid `KdaConfig`; `len`: writable.
#[no_mangle]
pub unsafe extern "C" fn kda_decode_workspace_len(
    cfg: *const KdaConfig,
    batch: usize,
    len: *mut usize,
) -> KdaStatus {
    // SAFETY: forwarded contract.
    unsafe { size_of_cfg(cfg, len, |c| Ok(kda_core::decode_workspace_len(c, batch)?)) }
}
