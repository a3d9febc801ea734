//! fla's `chunk_kda` / `fused_recurrent_kda` over packed sequences, one task per
//! (sequence, value head), on the per-head kernels of kda-core.
//!
//! Layouts are fla's with the batch folded into the token axis: `q`, `k` `[T, H, K]`,
//! `v` `[T, HV, V]`, `g` `[T, HV, K]`, `beta` `[T, HV]`, states `[N, HV, K, V]` (or
//! `[N, HV, V, K]` V-first). Value head `hv` reads query/key head `hv / (HV / H)`.

use rayon::prelude::*;

use crate::core_api::{self, CoreResult, GateForm, HeadTask};

/// Tensor sizes of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    /// Tokens of all sequences together.
    pub tokens: usize,
    /// Query/key heads `H`.
    pub heads: usize,
    /// Value heads `HV` (a multiple of `H`).
    pub v_heads: usize,
    /// Key head dimension `K`.
    pub k: usize,
    /// Value head dimension `V`.
    pub v: usize,
}

/// The flags of fla's functions that change the numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Flags {
    /// Query scale.
    pub scale: f32,
    /// `use_qk_l2norm_in_kernel`.
    pub l2norm: bool,
    /// `use_gate_in_kernel`: the gate applied to `g`, or `None` (g is the log decay).
    pub gate: Option<GateForm>,
    /// `use_beta_sigmoid_in_kernel`: `β = factor·sigmoid(β)` (factor 2 with
    /// `allow_neg_eigval`), or `None`.
    pub beta_sigmoid: Option<f32>,
    /// Chunk size of the chunked form, or `None` for the token-by-token recurrence.
    pub chunk: Option<usize>,
    /// States are `[V, K]` per head instead of `[K, V]`.
    pub v_first: bool,
}

/// The inputs of one call (all f32, row-major, contiguous).
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// `[T, H, K]`.
    pub q: &'a [f32],
    /// `[T, H, K]`.
    pub k: &'a [f32],
    /// `[T, HV, V]`.
    pub v: &'a [f32],
    /// `[T, HV, K]`.
    pub g: &'a [f32],
    /// `[T, HV]`.
    pub beta: &'a [f32],
    /// `[HV]` (gate in kernel only).
    pub a_log: Option<&'a [f32]>,
    /// `[HV·K]` (gate in kernel only).
    pub dt_bias: Option<&'a [f32]>,
    /// `[N, HV, K, V]` (or V-first), or zeros.
    pub initial_state: Option<&'a [f32]>,
    /// `[N + 1]` token offsets, starting at 0, ending at `T`, non-decreasing.
    pub cu_seqlens: &'a [usize],
}

/// The outputs of one call.
pub struct Outputs<'a> {
    /// `[T, HV, V]`.
    pub o: &'a mut [f32],
    /// `[N, HV, K, V]` (or V-first), when asked for.
    pub final_state: Option<&'a mut [f32]>,
}

fn check(name: &str, len: usize, want: usize) -> CoreResult<()> {
    if len == want {
        Ok(())
    } else {
        Err(format!("{name} has {len} elements, expected {want}"))
    }
}

fn mul(a: usize, b: usize) -> CoreResult<usize> {
    a.checked_mul(b)
        .ok_or_else(|| "tensor sizes overflow".to_string())
}

/// Checks every length against `d` and the offsets; returns the number of sequences.
fn validate(d: &Dims, x: &Inputs<'_>, out: &Outputs<'_>, f: &Flags) -> CoreResult<usize> {
    if d.heads == 0 || !d.v_heads.is_multiple_of(d.heads) {
        return Err(format!(
            "value heads ({}) must be a positive multiple of the query/key heads ({})",
            d.v_heads, d.heads
        ));
    }
    if d.k == 0 || d.v == 0 {
        return Err("head dimensions must be positive".into());
    }
    if let Some(c) = f.chunk {
        if c == 0 || c > core_api::MAX_CHUNK {
            return Err(format!(
                "chunk size {c} outside 1..={}",
                core_api::MAX_CHUNK
            ));
        }
    }
    let th = mul(d.tokens, d.heads)?;
    let thv = mul(d.tokens, d.v_heads)?;
    check("q", x.q.len(), mul(th, d.k)?)?;
    check("k", x.k.len(), mul(th, d.k)?)?;
    check("v", x.v.len(), mul(thv, d.v)?)?;
    check("g", x.g.len(), mul(thv, d.k)?)?;
    check("beta", x.beta.len(), thv)?;
    check("o", out.o.len(), mul(thv, d.v)?)?;
    if let Some(a) = x.a_log {
        check("A_log", a.len(), d.v_heads)?;
    }
    if let Some(b) = x.dt_bias {
        check("dt_bias", b.len(), mul(d.v_heads, d.k)?)?;
    }
    let cu = x.cu_seqlens;
    if cu.len() < 2 || cu[0] != 0 || cu[cu.len() - 1] != d.tokens {
        return Err(format!(
            "cu_seqlens must start at 0 and end at the token count {}",
            d.tokens
        ));
    }
    if cu.windows(2).any(|w| w[1] < w[0]) {
        return Err("cu_seqlens must be non-decreasing".into());
    }
    let n = cu.len() - 1;
    let state_len = mul(mul(n, d.v_heads)?, mul(d.k, d.v)?)?;
    if let Some(s) = x.initial_state {
        check("initial_state", s.len(), state_len)?;
    }
    if let Some(s) = out.final_state.as_deref() {
        check("final_state", s.len(), state_len)?;
    }
    if f.gate == Some(GateForm::Softplus) && x.a_log.is_none() {
        return Err("A_log is required by the softplus gate".into());
    }
    Ok(n)
}

/// Copies head `h` of `heads` (row length `dim`) of tokens `t0..t1` of `[T, heads, dim]`.
fn gather(src: &[f32], t0: usize, t1: usize, heads: usize, h: usize, dim: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity((t1 - t0) * dim);
    for t in t0..t1 {
        let at = (t * heads + h) * dim;
        out.extend_from_slice(&src[at..at + dim]);
    }
    out
}

/// `[a, b]` → `[b, a]` into `out`.
fn transpose_into(src: &[f32], a: usize, b: usize, out: &mut [f32]) {
    for i in 0..a {
        for j in 0..b {
            out[j * a + i] = src[i * b + j];
        }
    }
}

#[cfg(test)]
fn transpose(src: &[f32], a: usize, b: usize) -> Vec<f32> {
    let mut out = vec![0.0; a * b];
    transpose_into(src, a, b, &mut out);
    out
}

/// Writes task `(n, hv)`'s initial state, K-first, into `state` `[K, V]`.
fn initial_state(d: &Dims, x: &Inputs<'_>, f: &Flags, n: usize, hv: usize, state: &mut [f32]) {
    let kv = d.k * d.v;
    match x.initial_state {
        Some(s) => {
            let s = &s[(n * d.v_heads + hv) * kv..][..kv];
            if f.v_first {
                transpose_into(s, d.v, d.k, state);
            } else {
                state.copy_from_slice(s);
            }
        }
        None => state.fill(0.0),
    }
}

/// Runs one (sequence, value head) task on `state` `[K, V]` (K-first, initial state in, final
/// state out); returns the outputs `[T_n, V]`.
fn task(
    d: &Dims,
    x: &Inputs<'_>,
    f: &Flags,
    n: usize,
    hv: usize,
    state: &mut [f32],
) -> CoreResult<Vec<f32>> {
    let (t0, t1) = (x.cu_seqlens[n], x.cu_seqlens[n + 1]);
    let h = hv / (d.v_heads / d.heads);
    let mut q = gather(x.q, t0, t1, d.heads, h, d.k);
    let mut k = gather(x.k, t0, t1, d.heads, h, d.k);
    if f.l2norm {
        core_api::l2_norm(&mut q, d.k)?;
        core_api::l2_norm(&mut k, d.k)?;
    }
    let mut g = gather(x.g, t0, t1, d.v_heads, hv, d.k);
    if let Some(form) = f.gate {
        let a = x.a_log.map(|a| &a[hv..hv + 1]);
        let b = x.dt_bias.map(|b| &b[hv * d.k..(hv + 1) * d.k]);
        core_api::decay_gate(&mut g, form, a, b, d.k)?;
    }
    let mut beta = gather(x.beta, t0, t1, d.v_heads, hv, 1);
    if let Some(factor) = f.beta_sigmoid {
        core_api::beta_sigmoid(&mut beta);
        beta.iter_mut().for_each(|b| *b *= factor);
    }
    let mut o = gather(x.v, t0, t1, d.v_heads, hv, d.v);
    initial_state(d, x, f, n, hv, state);
    let t = HeadTask {
        q: &q,
        k: &k,
        v_o: &mut o,
        g: &g,
        beta: &beta,
        state,
    };
    let isa = core_api::isa();
    match f.chunk {
        Some(c) => core_api::chunked_head(isa, t, f.scale, c)?,
        None => core_api::recurrent_head(isa, t, f.scale)?,
    }
    Ok(o)
}

/// Task `i` with its final state written to `dst` (its `[K, V]` or `[V, K]` slot of the
/// caller's final state), or dropped.
fn task_into(
    d: &Dims,
    x: &Inputs<'_>,
    f: &Flags,
    i: usize,
    dst: Option<&mut [f32]>,
) -> CoreResult<Vec<f32>> {
    let (n, hv) = (i / d.v_heads, i % d.v_heads);
    match dst {
        // K-first output: run in place in the caller's buffer (no extra copy of the state).
        Some(dst) if !f.v_first => task(d, x, f, n, hv, dst),
        dst => {
            let mut state = vec![0.0; d.k * d.v];
            let o = task(d, x, f, n, hv, &mut state)?;
            if let Some(dst) = dst {
                transpose_into(&state, d.k, d.v, dst);
            }
            Ok(o)
        }
    }
}

/// Runs the whole call on the current rayon pool (serially with `threads == 1`).
pub fn run(
    d: &Dims,
    x: &Inputs<'_>,
    f: &Flags,
    out: Outputs<'_>,
    threads: usize,
) -> CoreResult<()> {
    let n = validate(d, x, &out, f)?;
    let tasks = n * d.v_heads;
    let kv = d.k * d.v;
    let serial = threads <= 1 || tasks <= 1;
    let outs: Vec<Vec<f32>> = match out.final_state {
        Some(fs) if serial => fs
            .chunks_exact_mut(kv)
            .enumerate()
            .map(|(i, c)| task_into(d, x, f, i, Some(c)))
            .collect::<CoreResult<_>>()?,
        Some(fs) => fs
            .par_chunks_exact_mut(kv)
            .enumerate()
            .map(|(i, c)| task_into(d, x, f, i, Some(c)))
            .collect::<CoreResult<_>>()?,
        None if serial => (0..tasks)
            .map(|i| task_into(d, x, f, i, None))
            .collect::<CoreResult<_>>()?,
        None => (0..tasks)
            .into_par_iter()
            .map(|i| task_into(d, x, f, i, None))
            .collect::<CoreResult<_>>()?,
    };
    for (i, o) in outs.iter().enumerate() {
        let (seq, hv) = (i / d.v_heads, i % d.v_heads);
        let t0 = x.cu_seqlens[seq];
        for (j, row) in o.chunks_exact(d.v).enumerate() {
            let at = ((t0 + j) * d.v_heads + hv) * d.v;
            out.o[at..at + d.v].copy_from_slice(row);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rnd(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect()
    }

    /// Chunked and recurrent forms, serial and threaded, V-first and K-first all agree, and
    /// the V-first state is the transpose of the K-first one.
    #[test]
    fn forms_threads_and_layouts_agree() {
        let d = Dims {
            tokens: 70,
            heads: 2,
            v_heads: 4,
            k: 8,
            v: 4,
        };
        let q = rnd(70 * 2 * 8, 1);
        let k = rnd(70 * 2 * 8, 2);
        let v = rnd(70 * 4 * 4, 3);
        let g = rnd(70 * 4 * 8, 4);
        let beta = rnd(70 * 4, 5);
        let a_log = rnd(4, 6);
        let h0 = rnd(3 * 4 * 8 * 4, 7);
        let cu = [0usize, 5, 5, 70];
        let x = Inputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
            a_log: Some(&a_log),
            dt_bias: None,
            initial_state: Some(&h0),
            cu_seqlens: &cu,
        };
        let flags = |chunk| Flags {
            scale: 0.3,
            l2norm: true,
            gate: Some(GateForm::Softplus),
            beta_sigmoid: Some(1.0),
            chunk,
            v_first: false,
        };
        let go = |f: &Flags, threads| {
            let mut o = vec![0.0; 70 * 4 * 4];
            let mut s = vec![0.0; h0.len()];
            let out = Outputs {
                o: &mut o,
                final_state: Some(&mut s),
            };
            run(&d, &x, f, out, threads).unwrap();
            (o, s)
        };
        let (o_rec, s_rec) = go(&flags(None), 1);
        let (o_chk, s_chk) = go(&flags(Some(16)), 2);
        let err = |a: &[f32], b: &[f32]| {
            let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
            let den: f32 = b.iter().map(|y| y * y).sum();
            (num / den).sqrt()
        };
        assert!(err(&o_chk, &o_rec) < 1e-5, "{}", err(&o_chk, &o_rec));
        assert!(err(&s_chk, &s_rec) < 1e-5);
        // V-first: same numbers, transposed state in and out.
        let mut hv = Vec::new();
        for blk in h0.chunks_exact(32) {
            hv.extend(transpose(blk, 8, 4));
        }
        let xv = Inputs {
            initial_state: Some(&hv),
            ..x
        };
        let mut o = vec![0.0; 70 * 4 * 4];
        let mut s = vec![0.0; h0.len()];
        let fv = Flags {
            v_first: true,
            ..flags(None)
        };
        run(
            &d,
            &xv,
            &fv,
            Outputs {
                o: &mut o,
                final_state: Some(&mut s),
            },
            1,
        )
        .unwrap();
        assert_eq!(o, o_rec);
        let mut back = Vec::new();
        for blk in s.chunks_exact(32) {
            back.extend(transpose(blk, 4, 8));
        }
        assert_eq!(back, s_rec);
    }

    #[test]
    fn bad_lengths_are_errors() {
        let d = Dims {
            tokens: 2,
            heads: 1,
            v_heads: 1,
            k: 4,
            v: 4,
        };
        let z = vec![0.0f32; 8];
        let x = Inputs {
            q: &z,
            k: &z[..7],
            v: &z,
            g: &z,
            beta: &z[..2],
            a_log: None,
            dt_bias: None,
            initial_state: None,
            cu_seqlens: &[0, 2],
        };
        let f = Flags {
            scale: 1.0,
            l2norm: false,
            gate: None,
            beta_sigmoid: None,
            chunk: None,
            v_first: false,
        };
        let mut o = vec![0.0; 8];
        let out = Outputs {
            o: &mut o,
            final_state: None,
        };
        let e = run(&d, &x, &f, out, 1).unwrap_err();
        assert!(e.contains("k has 7 elements, expected 8"), "{e}");
        let x = Inputs {
            k: &z,
            cu_seqlens: &[0, 3],
            ..x
        };
        let mut o = vec![0.0; 8];
        let out = Outputs {
            o: &mut o,
            final_state: None,
        };
        let e = run(&d, &x, &f, out, 1).unwrap_err();
        assert!(e.contains("cu_seqlens"), "{e}");
    }
}
