//! The integer decode step: the layer of [`crate::decode_step`] in fixed point.

use super::approx::{
    exp_neg_q24, mul_q30, rsqrt_u64, sat32, shr_round, sigmoid_q16, silu_q16, softplus_q16,
};
use super::{FixedCachesMut, FixedWeights, QGate, QMat, CONV_FRAC, STATE_FRAC, UNIT_FRAC};
use crate::config::{DecayGate, KdaConfig};
use crate::error::{add, check_len, mul, rows_of, KdaError};

/// i32 elements of workspace [`decode_step_fixed`] needs (any batch: it runs one sequence at a
/// time): q, k, v, decay, output gate (`H·K` each), beta (`H`), the low-rank bottlenecks, and
/// one head's output (`K`).
pub fn fixed_workspace_len(cfg: &KdaConfig) -> Result<usize, KdaError> {
    cfg.validate()?;
    let d = cfg.proj_dim();
    let per = add("fixed workspace", mul("fixed workspace", 5, d)?, cfg.heads)?;
    let low = cfg.decay_proj.rank() + cfg.output_gate.rank();
    add(
        "fixed workspace",
        add("fixed workspace", per, low)?,
        cfg.head_dim,
    )
}

/// One decode step in integer arithmetic only: one token for each of `N` sequences.
///
/// `x`, `out`: `[N, hidden]` in Q15.16; `caches`: `N` sequences, updated in place; `workspace`:
/// at least [`fixed_workspace_len`]. `w` must have been prepared for this `cfg`.
pub fn decode_step_fixed(
    cfg: &KdaConfig,
    w: &FixedWeights<'_>,
    x: &[i32],
    caches: FixedCachesMut<'_>,
    out: &mut [i32],
    workspace: &mut [i32],
) -> Result<(), KdaError> {
    if *cfg != w.cfg {
        return Err(KdaError::Config {
            field: "cfg",
            reason: "the fixed weights were prepared for another configuration",
        });
    }
    let hd = cfg.hidden;
    let n = rows_of("x", x.len(), hd)?;
    check_len("out", out.len(), x.len())?;
    caches.validate(cfg, n)?;
    let need = fixed_workspace_len(cfg)?;
    if workspace.len() < need {
        return Err(KdaError::TooSmall {
            arg: "workspace",
            needed: need,
            actual: workspace.len(),
        });
    }
    let (sl, cl) = (cfg.state_len()?, cfg.conv_state_len()?);
    for s in 0..n {
        let st = &mut caches.recurrent[s * sl..(s + 1) * sl];
        let cq = &mut caches.conv_q[s * cl..(s + 1) * cl];
        let ck = &mut caches.conv_k[s * cl..(s + 1) * cl];
        let cv = &mut caches.conv_v[s * cl..(s + 1) * cl];
        token(
            cfg,
            w,
            &x[s * hd..(s + 1) * hd],
            st,
            [cq, ck, cv],
            &mut out[s * hd..(s + 1) * hd],
            workspace,
        );
    }
    Ok(())
}

/// `out[o] = requant_o(Σ_i W[o, i] · x[i])`: i8 × Q15.16 products summed exactly in i64
/// (`SMLAL`), then the row scale as a 15-bit multiplier and a rounding shift.
#[inline(never)]
fn proj(m: &QMat<'_>, x: &[i32], out: &mut [i32]) {
    let cols = m.cols;
    for ((y, row), rq) in out
        .iter_mut()
        .zip(m.data.chunks_exact(cols.max(1)))
        .zip(m.rq.chunks_exact(2))
        .take(m.rows)
    {
        let mut acc = 0i64;
        for (&wv, &xv) in row.iter().zip(x) {
            acc += wv as i64 * xv as i64;
        }
        // Above 2^47 the output saturates for every multiplier the prepare step produces with
        // shift ≤ 30; the clamp keeps `acc · mult` inside i64.
        let acc = acc.clamp(-(1i64 << 47), 1i64 << 47);
        *y = sat32(shr_round(acc * rq[0] as i64, rq[1] as u32));
    }
    if cols == 0 {
        out.fill(0);
    }
}

/// A gate projection into `out`, through the bottleneck `low` when low-rank.
fn gate_proj(g: &QGate<'_>, x: &[i32], low: &mut [i32], out: &mut [i32]) {
    match g {
        QGate::Full(m) => proj(m, x, out),
        QGate::LowRank { down, up } => {
            proj(down, x, low);
            proj(up, low, out);
        }
    }
}

/// Causal conv step + SiLU for `K` channels: `x` raw in (Q15.16), activated out; `wts` `[K, W]`
/// Q7.24; `st` `[K, W−1]` history (shifted, newest last).
fn conv_silu(x: &mut [i32], wts: &[i32], st: &mut [i32], w: usize) {
    let hist = w - 1;
    for (c, xv) in x.iter_mut().enumerate() {
        let wc = &wts[c * w..(c + 1) * w];
        let s = &mut st[c * hist..(c + 1) * hist];
        let raw = *xv;
        let mut acc = wc[hist] as i64 * raw as i64;
        for (&wi, &si) in wc.iter().zip(s.iter()) {
            acc += wi as i64 * si as i64;
        }
        if hist > 0 {
            s.copy_within(1.., 0);
            s[hist - 1] = raw;
        }
        *xv = silu_q16(sat32(shr_round(acc, CONV_FRAC)));
    }
}

/// `round(v · y / 2^k)` (the multiply by a [`rsqrt_u64`] result).
#[inline(always)]
fn scale_by(v: i32, y: i32, k: u32) -> i32 {
    let p = v as i64 * y as i64;
    sat32(if k == 0 { p } else { shr_round(p, k) })
}

/// Sum of squares in Q.32 (u64, saturating) plus `eps`.
#[inline(always)]
fn sum_sq(x: &[i32], eps: u64) -> u64 {
    x.iter()
        .fold(eps, |a, &v| a.saturating_add((v as i64 * v as i64) as u64))
}

/// `x ← x / sqrt(Σx² + eps)`: Q15.16 in, Q1.30 out.
fn l2_norm(x: &mut [i32], eps: u64) {
    let (y, k) = rsqrt_u64(sum_sq(x, eps));
    for v in x {
        *v = scale_by(*v, y, k);
    }
}

/// Decay factors α = e^g (Q1.30) of one head, in place over its raw decay logits (Q15.16).
fn decay(cfg: &KdaConfig, w: &FixedWeights<'_>, head: usize, f: &mut [i32]) {
    let k = cfg.head_dim;
    let a = w.a[head] as i64;
    for (i, v) in f.iter_mut().enumerate() {
        let x = sat32(*v as i64 + w.dt_bias[head * k + i] as i64);
        let t = match cfg.decay_gate {
            // −g = a · softplus(x), Q7.24.
            DecayGate::Softplus => sat32(shr_round(a * softplus_q16(x) as i64, 16)),
            // −g = |lb| · sigmoid(a · x), Q7.24.
            DecayGate::LowerBound(_) => {
                mul_q30(w.lb, sigmoid_q16(sat32(shr_round(a * x as i64, 16))))
            }
        };
        *v = exp_neg_q24(t);
    }
}

/// The delta rule for one head, column by column of `S` `[K, V]` (each column only needs its
/// own prediction): decay and predict, then write and read. `q` (scaled) and `k` are Q1.30,
/// `alpha` Q1.30, `v` Q15.16, `beta` Q1.30; `o` receives Q15.16.
#[inline(never)]
fn delta_rule(
    st: &mut [i32],
    q: &[i32],
    k: &[i32],
    v: &[i32],
    alpha: &[i32],
    beta: i32,
    o: &mut [i32],
) {
    let vd = v.len();
    const _: () = assert!(STATE_FRAC == super::ACT_FRAC);
    for (e, (&ve, oe)) in v.iter().zip(o.iter_mut()).enumerate() {
        let mut p = 0i64;
        for (d, (&ad, &kd)) in alpha.iter().zip(k).enumerate() {
            let s = &mut st[d * vd + e];
            *s = mul_q30(*s, ad);
            p += kd as i64 * *s as i64;
        }
        let delta = mul_q30(sat32(ve as i64 - shr_round(p, UNIT_FRAC)), beta);
        let mut acc = 0i64;
        for (d, (&kd, &qd)) in k.iter().zip(q).enumerate() {
            let s = &mut st[d * vd + e];
            *s = s.wrapping_add(mul_q30(kd, delta));
            acc += qd as i64 * *s as i64;
        }
        *oe = sat32(shr_round(acc, UNIT_FRAC));
    }
}

/// `gate ← o · rsqrt(mean(o²) + eps) · o_norm · sigmoid(gate)` for one head (all Q15.16).
fn gated_norm(w: &FixedWeights<'_>, o: &[i32], gate: &mut [i32]) {
    let (y, k) = rsqrt_u64(sum_sq(o, w.eps_rms));
    for ((g, &ov), &nw) in gate.iter_mut().zip(o).zip(w.o_norm) {
        // o/sqrt(Σo² + K·eps) in Q1.30, times o_norm·√K (Q15.16) → Q15.16.
        let on = scale_by(ov, y, k);
        let t = sat32(shr_round(on as i64 * nw as i64, UNIT_FRAC));
        *g = mul_q30(t, sigmoid_q16(*g));
    }
}

/// The whole layer for one token of one sequence.
#[inline(never)]
fn token(
    cfg: &KdaConfig,
    w: &FixedWeights<'_>,
    x: &[i32],
    st: &mut [i32],
    conv: [&mut [i32]; 3],
    out: &mut [i32],
    ws: &mut [i32],
) {
    let (d, h, k, cw) = (cfg.proj_dim(), cfg.heads, cfg.head_dim, cfg.conv_width);
    let (rf, rg) = (cfg.decay_proj.rank(), cfg.output_gate.rank());
    let (q, ws) = ws.split_at_mut(d);
    let (kk, ws) = ws.split_at_mut(d);
    let (v, ws) = ws.split_at_mut(d);
    let (f, ws) = ws.split_at_mut(d);
    let (gate, ws) = ws.split_at_mut(d);
    let (beta, ws) = ws.split_at_mut(h);
    let (low_f, ws) = ws.split_at_mut(rf);
    let (low_g, ws) = ws.split_at_mut(rg);
    let o = &mut ws[..k];

    proj(&w.q_proj, x, q);
    proj(&w.k_proj, x, kk);
    proj(&w.v_proj, x, v);
    gate_proj(&w.decay, x, low_f, f);
    proj(&w.b_proj, x, beta);
    gate_proj(&w.out_gate, x, low_g, gate);

    let hist = cw - 1;
    let [cq, ck, cv] = conv;
    for head in 0..h {
        let ch = head * k..(head + 1) * k;
        let cs = head * k * hist..(head + 1) * k * hist;
        let wr = head * k * cw..(head + 1) * k * cw;
        conv_silu(
            &mut q[ch.clone()],
            &w.conv[0][wr.clone()],
            &mut cq[cs.clone()],
            cw,
        );
        conv_silu(
            &mut kk[ch.clone()],
            &w.conv[1][wr.clone()],
            &mut ck[cs.clone()],
            cw,
        );
        conv_silu(&mut v[ch.clone()], &w.conv[2][wr], &mut cv[cs], cw);
        l2_norm(&mut q[ch.clone()], w.eps_l2);
        for qv in &mut q[ch.clone()] {
            *qv = mul_q30(*qv, w.scale);
        }
        l2_norm(&mut kk[ch.clone()], w.eps_l2);
        decay(cfg, w, head, &mut f[ch.clone()]);
        let b = sigmoid_q16(beta[head]);
        delta_rule(
            &mut st[head * k * k..(head + 1) * k * k],
            &q[ch.clone()],
            &kk[ch.clone()],
            &v[ch.clone()],
            &f[ch.clone()],
            b,
            o,
        );
        gated_norm(w, o, &mut gate[ch]);
    }
    proj(&w.o_proj, gate, out);
}
