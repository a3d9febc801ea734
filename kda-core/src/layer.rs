//! The whole layer: sequence forward (prefill) and decode step, with their workspace sizes.
//!
//! Per token, in order (spec §9.2):
//! projections → short convs (+SiLU) → decay gate, beta → q/k L2 norm → delta-rule recurrence →
//! gated RMSNorm → `o_proj`.
//!
//! Tokens are processed in **blocks**: the workspace holds the intermediates of `B` tokens and
//! the caller chooses `B` by the workspace it passes ([`forward_workspace_len`]). Blocks are
//! consecutive, and the caches carry everything from one block to the next, so the result does
//! not depend on `B` (bitwise): a microcontroller can run a long prompt in a 1-token workspace.

use crate::cache::CachesMut;
use crate::config::{GateProj, KdaConfig};
use crate::error::{add, check_len, mul, KdaError};
use crate::ops::conv::short_conv_prefill;
use crate::ops::gate::{beta_sigmoid, decay_gate};
use crate::ops::linear::linear;
use crate::ops::norm::{gated_rms_norm, l2_norm};
use crate::ops::recurrent::step_unchecked;
use crate::weights::{GateWeights, KdaWeights};

/// Where a forward call's caches start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitialCaches {
    /// Every sequence starts fresh: the caches are zeroed first (their contents are ignored).
    Zero,
    /// The caches hold each sequence's state so far (a continuation, or a prefix cache).
    /// To start some sequences fresh and continue others, zero the former with
    /// [`CachesMut::reset_sequence`] and pass `Given`.
    Given,
}

/// f32 elements of workspace per token of a block: q, k, v, g, output gate (`H·K` each),
/// beta (`H`) and the low-rank bottleneck (largest rank).
pub(crate) fn per_token_workspace(cfg: &KdaConfig) -> Result<usize, KdaError> {
    let d = cfg.proj_dim_checked()?;
    let r = cfg.decay_proj.rank().max(cfg.output_gate.rank());
    add(
        "workspace",
        add("workspace", mul("workspace", 5, d)?, cfg.heads)?,
        r,
    )
}

/// f32 elements of workspace independent of the block size: the conv's `W−1` scratch and one
/// head's output row.
fn fixed_workspace(cfg: &KdaConfig) -> Result<usize, KdaError> {
    add("workspace", cfg.conv_width.saturating_sub(1), cfg.head_dim)
}

/// f32 elements of workspace for [`forward`] processing up to `block_tokens` tokens at a time
/// (any `block_tokens ≥ 1` gives the same result; larger blocks reuse each weight row more).
pub fn forward_workspace_len(cfg: &KdaConfig, block_tokens: usize) -> Result<usize, KdaError> {
    cfg.validate()?;
    let per = mul("workspace", per_token_workspace(cfg)?, block_tokens.max(1))?;
    add("workspace", fixed_workspace(cfg)?, per)
}

/// f32 elements of workspace for a [`decode_step`] over `batch` sequences in one block.
/// (A smaller workspace, down to one sequence's worth, also works, in more blocks.)
pub fn decode_workspace_len(cfg: &KdaConfig, batch: usize) -> Result<usize, KdaError> {
    forward_workspace_len(cfg, batch)
}

/// Checks `cu_seqlens` (`[N+1]`, starts at 0, non-decreasing, ends at `tokens`); returns `N`.
pub fn validate_offsets(cu_seqlens: &[usize], tokens: usize) -> Result<usize, KdaError> {
    let bad = |reason| Err(KdaError::Offsets { reason });
    let (Some(&first), Some(&last)) = (cu_seqlens.first(), cu_seqlens.last()) else {
        return bad("is empty (needs at least [0, T])");
    };
    if cu_seqlens.len() < 2 {
        return bad("needs at least two entries [0, T]");
    }
    if first != 0 {
        return bad("must start at 0");
    }
    if cu_seqlens.windows(2).any(|p| p[1] < p[0]) {
        return bad("must be non-decreasing");
    }
    if last != tokens {
        return bad("must end at the number of tokens (rows of x)");
    }
    Ok(cu_seqlens.len() - 1)
}

fn rows_of(arg: &'static str, len: usize, width: usize) -> Result<usize, KdaError> {
    if len % width != 0 {
        return Err(KdaError::Length {
            arg,
            expected: len - len % width,
            actual: len,
        });
    }
    Ok(len / width)
}

/// Runs the layer over `T` tokens of `N` packed sequences.
///
/// * `x`: `[T, hidden]` input rows; `out`: `[T, hidden]` output rows.
/// * `cu_seqlens`: `[N+1]` offsets; sequence `n` is rows `cu[n]..cu[n+1]` (may be empty).
/// * `caches`: the `N` sequences' caches, read as initial caches when `init` is
///   [`InitialCaches::Given`] and always left holding the final caches.
/// * `workspace`: at least [`forward_workspace_len`]`(cfg, 1)` elements; the block size is
///   whatever fits.
///
/// Every length, shape and offset is checked before anything is written. NaN or ±∞ in the
/// inputs, weights or caches propagate to the outputs; they never cause a panic.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    cfg: &KdaConfig,
    w: &KdaWeights<'_>,
    x: &[f32],
    cu_seqlens: &[usize],
    mut caches: CachesMut<'_>,
    init: InitialCaches,
    out: &mut [f32],
    workspace: &mut [f32],
) -> Result<(), KdaError> {
    w.validate(cfg)?;
    let t_len = rows_of("x", x.len(), cfg.hidden)?;
    check_len("out", out.len(), x.len())?;
    let n = validate_offsets(cu_seqlens, t_len)?;
    caches.validate(cfg, n)?;
    let block = block_tokens(cfg, workspace.len(), t_len)?;
    if init == InitialCaches::Zero {
        caches.reset();
    }
    run(
        cfg,
        w,
        x,
        n,
        |i| cu_seqlens[i],
        caches,
        out,
        workspace,
        block,
    )
}

/// One decode step: one token for each of `N` sequences, each with its own caches
/// (`x`, `out`: `[N, hidden]`; caches hold `N` sequences and are updated in place).
pub fn decode_step(
    cfg: &KdaConfig,
    w: &KdaWeights<'_>,
    x: &[f32],
    caches: CachesMut<'_>,
    out: &mut [f32],
    workspace: &mut [f32],
) -> Result<(), KdaError> {
    w.validate(cfg)?;
    let n = rows_of("x", x.len(), cfg.hidden)?;
    check_len("out", out.len(), x.len())?;
    caches.validate(cfg, n)?;
    let block = block_tokens(cfg, workspace.len(), n)?;
    run(cfg, w, x, n, |i| i, caches, out, workspace, block)
}

fn block_tokens(cfg: &KdaConfig, ws: usize, tokens: usize) -> Result<usize, KdaError> {
    let fixed = fixed_workspace(cfg)?;
    let per = per_token_workspace(cfg)?;
    let needed = add("workspace", fixed, per)?;
    if ws < needed {
        return Err(KdaError::TooSmall {
            arg: "workspace",
            needed,
            actual: ws,
        });
    }
    Ok(((ws - fixed) / per).min(tokens.max(1)))
}

/// `out = gate projection of x` (full rank, or down then up through `low`).
fn project_gate(
    x: &[f32],
    gw: &GateWeights<'_>,
    form: GateProj,
    low: &mut [f32],
    out: &mut [f32],
) -> Result<(), KdaError> {
    match gw {
        GateWeights::FullRank(m) => linear(x, m, out),
        GateWeights::LowRank { down, up } => {
            let rows = out.len() / up.rows().max(1);
            let low = &mut low[..rows * form.rank()];
            linear(x, down, low)?;
            linear(low, up, out)
        }
    }
}

/// The layer after validation. `bound(i)` is the first token of sequence `i` (`bound(n)` = T).
#[allow(clippy::too_many_arguments)]
fn run(
    cfg: &KdaConfig,
    w: &KdaWeights<'_>,
    x: &[f32],
    n_seq: usize,
    bound: impl Fn(usize) -> usize,
    caches: CachesMut<'_>,
    out: &mut [f32],
    workspace: &mut [f32],
    block: usize,
) -> Result<(), KdaError> {
    let (hd, d, h, k) = (cfg.hidden, cfg.proj_dim(), cfg.heads, cfg.head_dim);
    let r = cfg.decay_proj.rank().max(cfg.output_gate.rank());
    let (sl, cl) = (cfg.state_len()?, cfg.conv_state_len()?);
    let scale = cfg.scale();

    let (conv_tmp, rest) = workspace.split_at_mut(cfg.conv_width - 1);
    let (o_tmp, rest) = rest.split_at_mut(k);
    let (q_all, rest) = rest.split_at_mut(block * d);
    let (k_all, rest) = rest.split_at_mut(block * d);
    let (v_all, rest) = rest.split_at_mut(block * d);
    let (g_all, rest) = rest.split_at_mut(block * d);
    let (gate_all, rest) = rest.split_at_mut(block * d);
    let (beta_all, rest) = rest.split_at_mut(block * h);
    let low_all = &mut rest[..block * r];

    let t_total = bound(n_seq);
    let mut seq = 0;
    let mut t0 = 0;
    while t0 < t_total {
        let t1 = t_total.min(t0 + block);
        let bt = t1 - t0;
        let xb = &x[t0 * hd..t1 * hd];
        let (q, kk, v) = (
            &mut q_all[..bt * d],
            &mut k_all[..bt * d],
            &mut v_all[..bt * d],
        );
        let (g, gate, beta) = (
            &mut g_all[..bt * d],
            &mut gate_all[..bt * d],
            &mut beta_all[..bt * h],
        );

        linear(xb, &w.q_proj, q)?;
        linear(xb, &w.k_proj, kk)?;
        linear(xb, &w.v_proj, v)?;
        project_gate(xb, &w.decay_proj, cfg.decay_proj, low_all, g)?;
        decay_gate(g, cfg.decay_gate, w.a_log, w.dt_bias, h, k)?;
        linear(xb, &w.b_proj, beta)?;
        beta_sigmoid(beta);
        project_gate(xb, &w.output_gate, cfg.output_gate, low_all, gate)?;

        while seq < n_seq && bound(seq + 1) <= t0 {
            seq += 1;
        }
        let mut s = seq;
        while s < n_seq && bound(s) < t1 {
            let a = bound(s).max(t0) - t0;
            let b = bound(s + 1).min(t1) - t0;
            if a < b {
                let rows = a * d..b * d;
                let cs = s * cl..(s + 1) * cl;
                short_conv_prefill(
                    &mut q[rows.clone()],
                    d,
                    w.q_conv,
                    &mut caches.conv_q[cs.clone()],
                    conv_tmp,
                )?;
                short_conv_prefill(
                    &mut kk[rows.clone()],
                    d,
                    w.k_conv,
                    &mut caches.conv_k[cs.clone()],
                    conv_tmp,
                )?;
                short_conv_prefill(
                    &mut v[rows.clone()],
                    d,
                    w.v_conv,
                    &mut caches.conv_v[cs],
                    conv_tmp,
                )?;
                l2_norm(&mut q[rows.clone()], k, cfg.l2_eps)?;
                l2_norm(&mut kk[rows], k, cfg.l2_eps)?;
                let state = &mut caches.recurrent[s * sl..(s + 1) * sl];
                for t in a..b {
                    for (hh, st) in state.chunks_exact_mut(k * k).enumerate() {
                        let i = t * d + hh * k..t * d + (hh + 1) * k;
                        let vi = &mut v[i.clone()];
                        step_unchecked(
                            st,
                            &q[i.clone()],
                            &kk[i.clone()],
                            vi,
                            &g[i],
                            beta[t * h + hh],
                            scale,
                            o_tmp,
                        );
                        vi.copy_from_slice(o_tmp);
                    }
                }
            }
            s += 1;
        }
        gated_rms_norm(v, gate, w.o_norm, k, cfg.rms_eps)?;
        linear(v, &w.o_proj, &mut out[t0 * hd..t1 * hd])?;
        t0 = t1;
    }
    Ok(())
}
