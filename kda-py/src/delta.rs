//! fla's `chunk_kda` / `fused_recurrent_kda` over packed sequences, one task per
//! (sequence, value head), on the per-head kernels of kda-core.
//!
//! Layouts are fla's with the batch folded into the token axis: `q`, `k` `[T, H, K]`,
//! `v` `[T, HV, V]`, `g` `[T, HV, K]`, `beta` `[T, HV]`, states `[N, HV, K, V]` (or
//! `[N, HV, V, K]` V-first). Value head `hv` reads query/key head `hv / (HV / H)`.

use rayon::prelude::*;

use crate::core_api::{
    self, CoreResult, GateForm, HeadTask, RowsHint, StridedHead, StridedInputs, StridedRows,
};

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

/// Tokens per block of the recurrent form: how many rows of one head are gathered at a time.
const RECURRENT_BLOCK: usize = 64;

/// Tokens per gathered block: for the chunked form one chunk, so that running the kernel block
/// by block keeps the sequence's chunk grid (the same results, bit for bit, as one call over
/// the whole sequence).
fn block_len(f: &Flags) -> usize {
    f.chunk.unwrap_or(RECURRENT_BLOCK)
}

/// Whether the inputs need preparing before the kernel (norm, gate or β sigmoid applied).
fn needs_prep(f: &Flags) -> bool {
    f.l2norm || f.gate.is_some() || f.beta_sigmoid.is_some()
}

/// Head `h` of `heads` (row length `dim`) of tokens `t0..` of `[T, heads, dim]`, in place
/// (`t0` below `T`).
fn head_rows(src: &[f32], t0: usize, heads: usize, h: usize, dim: usize) -> StridedRows<'_> {
    StridedRows {
        data: &src[(t0 * heads + h) * dim..],
        dim,
        stride: heads * dim,
    }
}

/// Copies head `h` of `heads` (row length `dim`) of tokens `t0..t1` of `[T, heads, dim]` into
/// `dst` `[t1 − t0, dim]`.
fn gather_into(dst: &mut [f32], src: &[f32], (t0, t1): (usize, usize), heads: usize, h: usize) {
    let dim = dst.len() / (t1 - t0).max(1);
    for (t, row) in (t0..t1).zip(dst.chunks_exact_mut(dim)) {
        let at = (t * heads + h) * dim;
        row.copy_from_slice(&src[at..at + dim]);
    }
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

/// What every task of one call shares.
struct Ctx<'c, 'a> {
    d: &'c Dims,
    x: &'c Inputs<'a>,
    f: &'c Flags,
    isa: core_api::Isa,
    /// Rows of the largest block any task gathers.
    block_rows: usize,
}

impl Ctx<'_, '_> {
    /// Sequence and value head of task `i`.
    fn task(&self, i: usize) -> (usize, usize) {
        (i / self.d.v_heads, i % self.d.v_heads)
    }
}

/// One block of one head's rows, gathered from the call's inputs and prepared for the kernel
/// (norm, gate and β sigmoid applied): `q`, `k`, `g` `[rows, K]`, `beta` `[rows]`, `v_o`
/// `[rows, V]` (values in, outputs out).
struct Block {
    q: Vec<f32>,
    k: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    v_o: Vec<f32>,
}

/// One worker's buffers, reused across its tasks and blocks (no allocation per task).
struct Work {
    block: Block,
    /// The kernel's scratch.
    scratch: Vec<f32>,
    /// `[K, V]` the state of a task whose final state is not computed in place.
    state: Vec<f32>,
}

impl Work {
    fn new(c: &Ctx<'_, '_>) -> Work {
        let (rows, d) = (c.block_rows, c.d);
        let scratch = match c.f.chunk {
            Some(ch) => core_api::chunked_scratch_len(ch, d.k, d.v),
            None => core_api::recurrent_scratch_len(d.k, d.v),
        };
        Work {
            block: Block {
                q: vec![0.0; rows * d.k],
                k: vec![0.0; rows * d.k],
                g: vec![0.0; rows * d.k],
                beta: vec![0.0; rows],
                v_o: vec![0.0; rows * d.v],
            },
            scratch: vec![0.0; scratch],
            state: Vec::new(),
        }
    }
}

impl Block {
    /// Gathers tokens `t0..t1` of value head `hv` (query/key head `h`) and applies the
    /// in-kernel norm, gate and β sigmoid; returns the number of rows.
    fn load(
        &mut self,
        c: &Ctx<'_, '_>,
        (t0, t1): (usize, usize),
        h: usize,
        hv: usize,
    ) -> CoreResult<usize> {
        let (d, x, f) = (c.d, c.x, c.f);
        let rows = t1 - t0;
        let (q, k) = (&mut self.q[..rows * d.k], &mut self.k[..rows * d.k]);
        gather_into(q, x.q, (t0, t1), d.heads, h);
        gather_into(k, x.k, (t0, t1), d.heads, h);
        if f.l2norm {
            core_api::l2_norm(q, d.k)?;
            core_api::l2_norm(k, d.k)?;
        }
        let g = &mut self.g[..rows * d.k];
        gather_into(g, x.g, (t0, t1), d.v_heads, hv);
        if let Some(form) = f.gate {
            let a = x.a_log.map(|a| &a[hv..hv + 1]);
            let b = x.dt_bias.map(|b| &b[hv * d.k..(hv + 1) * d.k]);
            core_api::decay_gate(c.isa, g, form, a, b, d.k)?;
        }
        let beta = &mut self.beta[..rows];
        gather_into(beta, x.beta, (t0, t1), d.v_heads, hv);
        if let Some(factor) = f.beta_sigmoid {
            core_api::beta_sigmoid(c.isa, beta);
            beta.iter_mut().for_each(|b| *b *= factor);
        }
        gather_into(&mut self.v_o[..rows * d.v], x.v, (t0, t1), d.v_heads, hv);
        Ok(rows)
    }
}

/// Where a task's output rows go: row `j` is the task's `j`-th token.
trait RowSink {
    fn row(&mut self, j: usize) -> &mut [f32];
    /// Where row 0 and the rows after it lie, when they are evenly spaced (for the kernel to
    /// prefetch them while it computes).
    fn hint(&self) -> Option<RowsHint> {
        None
    }
}

/// The rows of one task in the whole `o` `[T, HV, V]` (serial runs).
struct Strided<'o> {
    o: &'o mut [f32],
    /// Index of row 0.
    first: usize,
    /// Elements from one row to the next (`HV·V`).
    step: usize,
    v: usize,
}

impl RowSink for Strided<'_> {
    fn row(&mut self, j: usize) -> &mut [f32] {
        let at = self.first + j * self.step;
        &mut self.o[at..at + self.v]
    }
    fn hint(&self) -> Option<RowsHint> {
        let rows = self.o.get(self.first..)?;
        Some(RowsHint::of(rows, self.v, self.step))
    }
}

/// The rows of one task, split off `o` beforehand (threaded runs).
impl RowSink for Vec<&mut [f32]> {
    fn row(&mut self, j: usize) -> &mut [f32] {
        self[j]
    }
    fn hint(&self) -> Option<RowsHint> {
        // Split off one `[T, HV, V]` buffer: evenly spaced, the step from row 0 to row 1.
        let first = self.first()?;
        let step = match self.get(1) {
            Some(next) => (next.as_ptr() as usize).checked_sub(first.as_ptr() as usize)? / 4,
            None => first.len(),
        };
        Some(RowsHint::of(first, first.len(), step))
    }
}

/// Writes task `(n, hv)`'s initial state, K-first, into `state` `[K, V]`.
fn initial_state(c: &Ctx<'_, '_>, n: usize, hv: usize, state: &mut [f32]) {
    let (d, kv) = (c.d, c.d.k * c.d.v);
    match (c.x.initial_state, k_first_initial(c, n, hv)) {
        (_, Some(s)) => state.copy_from_slice(s),
        (Some(s), None) => transpose_into(&s[(n * d.v_heads + hv) * kv..][..kv], d.v, d.k, state),
        (None, _) => state.fill(0.0),
    }
}

/// Task `(n, hv)`'s initial state when the caller gave one K-first (so it can be read in
/// place).
fn k_first_initial<'a>(c: &Ctx<'_, 'a>, n: usize, hv: usize) -> Option<&'a [f32]> {
    let kv = c.d.k * c.d.v;
    let s = c.x.initial_state.filter(|_| !c.f.v_first)?;
    Some(&s[(n * c.d.v_heads + hv) * kv..][..kv])
}

/// The input rows of tokens `t0..t1` (`t0 < t1`) of value head `hv`, read in place.
fn head_view<'a>(c: &Ctx<'_, 'a>, (t0, t1): (usize, usize), hv: usize) -> StridedInputs<'a> {
    let (d, x) = (c.d, c.x);
    let h = hv / (d.v_heads / d.heads);
    StridedInputs {
        tokens: t1 - t0,
        q: head_rows(x.q, t0, d.heads, h, d.k),
        k: head_rows(x.k, t0, d.heads, h, d.k),
        g: head_rows(x.g, t0, d.v_heads, hv, d.k),
        beta: head_rows(x.beta, t0, d.v_heads, hv, 1),
        v: head_rows(x.v, t0, d.v_heads, hv, d.v),
    }
}

/// Runs task `(n, hv)` of the chunked form on unprepared inputs: one kernel call reading the
/// head's rows in place, on `state` `[K, V]` (initial state in, final state out), writing its
/// outputs to `sink`.
fn run_in_place(
    c: &Ctx<'_, '_>,
    (n, hv): (usize, usize),
    (state, scratch): (&mut [f32], &mut [f32]),
    chunk: usize,
    sink: &mut impl RowSink,
) -> CoreResult<()> {
    let (d, x) = (c.d, c.x);
    let (t0, t1) = (x.cu_seqlens[n], x.cu_seqlens[n + 1]);
    initial_state(c, n, hv, state);
    if t0 == t1 {
        return Ok(());
    }
    let view = StridedHead {
        inputs: head_view(c, (t0, t1), hv),
        state,
        scale: c.f.scale,
        next: None,
        out_rows: sink.hint(),
    };
    core_api::chunked_head_view(c.isa, view, chunk, scratch, |j0, o| {
        for (j, row) in o.chunks_exact(d.v).enumerate() {
            sink.row(j0 + j).copy_from_slice(row);
        }
    })
}

/// Runs task `(n, hv)` block by block on `state` `[K, V]` (K-first: initial state in, final
/// state out), writing its outputs to `sink`.
fn run_blocks(
    c: &Ctx<'_, '_>,
    (n, hv): (usize, usize),
    state: &mut [f32],
    block: &mut Block,
    scratch: &mut [f32],
    sink: &mut impl RowSink,
) -> CoreResult<()> {
    let (d, f) = (c.d, c.f);
    if let (Some(chunk), false) = (f.chunk, needs_prep(f)) {
        return run_in_place(c, (n, hv), (state, scratch), chunk, sink);
    }
    let (t0, t1) = (c.x.cu_seqlens[n], c.x.cu_seqlens[n + 1]);
    let h = hv / (d.v_heads / d.heads);
    // The recurrence's first token reads a K-first initial state in place (no copy of it
    // into `state` first: a decode step's state is read once instead of twice).
    let mut initial = match (f.chunk, k_first_initial(c, n, hv)) {
        (None, Some(s0)) if t0 < t1 => Some(s0),
        _ => {
            initial_state(c, n, hv, state);
            None
        }
    };
    let mut b0 = t0;
    while b0 < t1 {
        let b1 = (b0 + block_len(f)).min(t1);
        let rows = block.load(c, (b0, b1), h, hv)?;
        let v_o = &mut block.v_o[..rows * d.v];
        let t = HeadTask {
            q: &block.q[..rows * d.k],
            k: &block.k[..rows * d.k],
            v_o: &mut *v_o,
            g: &block.g[..rows * d.k],
            beta: &block.beta[..rows],
            state: &mut *state,
        };
        match f.chunk {
            Some(ch) => core_api::chunked_head(c.isa, t, f.scale, ch, scratch)?,
            None => core_api::recurrent_head(c.isa, t, f.scale, initial.take(), scratch)?,
        }
        for (j, row) in v_o.chunks_exact(d.v).enumerate() {
            sink.row(b0 - t0 + j).copy_from_slice(row);
        }
        b0 = b1;
    }
    Ok(())
}

/// Task `i`, its final state written to `dst` (its `[K, V]` or `[V, K]` slot of the caller's
/// final state), or dropped.
fn task(
    c: &Ctx<'_, '_>,
    i: usize,
    dst: Option<&mut [f32]>,
    w: &mut Work,
    sink: &mut impl RowSink,
) -> CoreResult<()> {
    let nh = c.task(i);
    let Work {
        block,
        scratch,
        state,
    } = w;
    match dst {
        // K-first output: run in place in the caller's buffer (no extra copy of the state).
        Some(dst) if !c.f.v_first => run_blocks(c, nh, dst, block, scratch, sink),
        dst => {
            state.resize(c.d.k * c.d.v, 0.0);
            run_blocks(c, nh, state, block, scratch, sink)?;
            if let Some(dst) = dst {
                transpose_into(state, c.d.k, c.d.v, dst);
            }
            Ok(())
        }
    }
}

/// The combined size of the states that the serial chunked form keeps in use at once (one per
/// head of a group): a few MB, so that 32 heads of 128 × 128 (a whole `[T, H, K]` row per
/// token, read in order) run together and their states stay in the last-level cache.
const GROUP_STATE_BYTES: usize = 4 << 20;

/// The chunked form on unprepared inputs on this thread: sequence by sequence, value heads in
/// groups, each group chunk by chunk with the heads of the group inner. The group's rows of a
/// token are adjacent in the `[T, HV, ·]` inputs (whole pages at K = 128, read in order), its
/// states stay cached, and the inputs are read in place; outputs go straight into `out`.
/// `group` value heads at a time.
fn run_serial_grouped(
    c: &Ctx<'_, '_>,
    chunk: usize,
    group: usize,
    out: Outputs<'_>,
) -> CoreResult<()> {
    let (d, x, kv) = (c.d, c.x, c.d.k * c.d.v);
    let Outputs { o, mut final_state } = out;
    let mut scratch = vec![0.0; core_api::chunked_scratch_len(chunk, d.k, d.v)];
    let mut own = Vec::new();
    for n in 0..x.cu_seqlens.len() - 1 {
        let (t0, t1) = (x.cu_seqlens[n], x.cu_seqlens[n + 1]);
        for g0 in (0..d.v_heads).step_by(group) {
            let g1 = (g0 + group).min(d.v_heads);
            // The group's states, K-first: in place in the caller's final state when it is
            // K-first, else in a buffer of ours (transposed into a V-first one at the end).
            let slots = (n * d.v_heads + g0) * kv..(n * d.v_heads + g1) * kv;
            own.resize((g1 - g0) * kv, 0.0);
            let (states, v_first_dst) = match final_state.as_deref_mut() {
                Some(s) if !c.f.v_first => (&mut s[slots], None),
                Some(s) => (&mut own[..], Some(&mut s[slots])),
                None => (&mut own[..], None),
            };
            for (hv, st) in (g0..g1).zip(states.chunks_exact_mut(kv)) {
                initial_state(c, n, hv, st);
            }
            let mut b0 = t0;
            while b0 < t1 {
                let b1 = (b0 + chunk).min(t1);
                for (hv, st) in (g0..g1).zip(states.chunks_exact_mut(kv)) {
                    // The next head's rows (the group's first head's of the next chunk after
                    // the last head) are fetched while this one runs.
                    let next = if hv + 1 < g1 {
                        Some(head_view(c, (b0, b1), hv + 1))
                    } else if b1 < t1 {
                        Some(head_view(c, (b1, (b1 + chunk).min(t1)), g0))
                    } else {
                        None
                    };
                    // The block's output rows, prefetched while it runs.
                    let mut sink = Strided {
                        o: &mut *o,
                        first: (b0 * d.v_heads + hv) * d.v,
                        step: d.v_heads * d.v,
                        v: d.v,
                    };
                    let view = StridedHead {
                        inputs: head_view(c, (b0, b1), hv),
                        state: st,
                        scale: c.f.scale,
                        next,
                        out_rows: sink.hint(),
                    };
                    core_api::chunked_head_view(c.isa, view, chunk, &mut scratch, |j0, rows| {
                        for (j, row) in rows.chunks_exact(d.v).enumerate() {
                            sink.row(j0 + j).copy_from_slice(row);
                        }
                    })?;
                }
                b0 = b1;
            }
            if let Some(dst) = v_first_dst {
                for (st, dst) in states.chunks_exact(kv).zip(dst.chunks_exact_mut(kv)) {
                    transpose_into(st, d.k, d.v, dst);
                }
            }
        }
    }
    Ok(())
}

/// Every task on this thread, writing straight into `out`.
fn run_serial(c: &Ctx<'_, '_>, tasks: usize, out: Outputs<'_>) -> CoreResult<()> {
    if let (Some(chunk), false) = (c.f.chunk, needs_prep(c.f)) {
        let group = GROUP_STATE_BYTES / (c.d.k * c.d.v * 4);
        return run_serial_grouped(c, chunk, group.clamp(1, c.d.v_heads), out);
    }
    let (d, kv) = (c.d, c.d.k * c.d.v);
    let Outputs { o, mut final_state } = out;
    let mut w = Work::new(c);
    for i in 0..tasks {
        let (n, hv) = c.task(i);
        let dst = final_state
            .as_deref_mut()
            .map(|s| &mut s[i * kv..(i + 1) * kv]);
        let mut sink = Strided {
            o: &mut *o,
            first: (c.x.cu_seqlens[n] * d.v_heads + hv) * d.v,
            step: d.v_heads * d.v,
            v: d.v,
        };
        task(c, i, dst, &mut w, &mut sink)?;
    }
    Ok(())
}

/// The tasks on the current rayon pool, each with its own output rows split off `o`.
fn run_parallel(c: &Ctx<'_, '_>, tasks: usize, out: Outputs<'_>) -> CoreResult<()> {
    let (d, cu, kv) = (c.d, c.x.cu_seqlens, c.d.k * c.d.v);
    let Outputs { o, final_state } = out;
    let mut rows: Vec<Vec<&mut [f32]>> = (0..tasks)
        .map(|i| Vec::with_capacity(cu[c.task(i).0 + 1] - cu[c.task(i).0]))
        .collect();
    // Row r of o is token r / HV, value head r % HV; token t belongs to the sequence n with
    // cu[n] <= t < cu[n + 1] (empty sequences are skipped over).
    let mut n = 0;
    for (r, row) in o.chunks_exact_mut(d.v).enumerate() {
        let (t, hv) = (r / d.v_heads, r % d.v_heads);
        while t >= cu[n + 1] {
            n += 1;
        }
        rows[n * d.v_heads + hv].push(row);
    }
    let dsts: Vec<Option<&mut [f32]>> = match final_state {
        Some(s) => s.chunks_exact_mut(kv).map(Some).collect(),
        None => (0..tasks).map(|_| None).collect(),
    };
    rows.into_par_iter()
        .zip(dsts)
        .enumerate()
        .try_for_each_init(
            || Work::new(c),
            |w, (i, (mut sink, dst))| task(c, i, dst, w, &mut sink),
        )
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
    let longest = x
        .cu_seqlens
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or(0);
    let c = Ctx {
        d,
        x,
        f,
        isa: core_api::isa(),
        block_rows: longest.min(block_len(f)),
    };
    if threads <= 1 || tasks <= 1 {
        run_serial(&c, tasks, out)
    } else {
        run_parallel(&c, tasks, out)
    }
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

    /// Gathered block by block (sequences longer than a block, several blocks per task) and
    /// threaded or not, the results are bit for bit those of one kernel call over each whole
    /// head of each sequence.
    #[test]
    fn blocks_and_threads_match_whole_sequence_calls() {
        let (h, hv, kd, vd) = (2usize, 4usize, 16usize, 8usize);
        let cu = [0usize, 150, 150, 157, 300];
        let tokens = 300;
        let q = rnd(tokens * h * kd, 11);
        let k = rnd(tokens * h * kd, 12);
        let v = rnd(tokens * hv * vd, 13);
        let g: Vec<f32> = rnd(tokens * hv * kd, 14)
            .iter()
            .map(|x| -0.1 * x.abs())
            .collect();
        let beta: Vec<f32> = rnd(tokens * hv, 15).iter().map(|x| x.abs()).collect();
        let h0 = rnd(4 * hv * kd * vd, 16);
        let h0_v: Vec<f32> = h0
            .chunks_exact(kd * vd)
            .flat_map(|blk| transpose(blk, kd, vd))
            .collect();
        let d = Dims {
            tokens,
            heads: h,
            v_heads: hv,
            k: kd,
            v: vd,
        };
        let x = Inputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
            a_log: None,
            dt_bias: None,
            initial_state: Some(&h0),
            cu_seqlens: &cu,
        };
        for chunk in [None, Some(core_api::DEFAULT_CHUNK), Some(16)] {
            let f = Flags {
                scale: 0.25,
                l2norm: false,
                gate: None,
                beta_sigmoid: None,
                chunk,
                v_first: false,
            };
            // The reference: each (sequence, head) gathered whole, one kernel call.
            let (mut o_ref, mut s_ref) = (vec![0.0; v.len()], h0.clone());
            for n in 0..4 {
                let (t0, t1) = (cu[n], cu[n + 1]);
                for j in 0..hv {
                    let col = |src: &[f32], heads: usize, head: usize, dim: usize| {
                        (t0..t1)
                            .flat_map(|t| src[(t * heads + head) * dim..][..dim].to_vec())
                            .collect::<Vec<f32>>()
                    };
                    let mut vo = col(&v, hv, j, vd);
                    let state = &mut s_ref[(n * hv + j) * kd * vd..][..kd * vd];
                    let t = HeadTask {
                        q: &col(&q, h, j / 2, kd),
                        k: &col(&k, h, j / 2, kd),
                        v_o: &mut vo,
                        g: &col(&g, hv, j, kd),
                        beta: &col(&beta, hv, j, 1),
                        state,
                    };
                    let isa = core_api::isa();
                    match chunk {
                        Some(c) => {
                            let mut scr = vec![0.0; core_api::chunked_scratch_len(c, kd, vd)];
                            core_api::chunked_head(isa, t, 0.25, c, &mut scr).unwrap()
                        }
                        None => {
                            let mut scr = vec![0.0; core_api::recurrent_scratch_len(kd, vd)];
                            core_api::recurrent_head(isa, t, 0.25, None, &mut scr).unwrap()
                        }
                    }
                    for (r, row) in vo.chunks_exact(vd).enumerate() {
                        let at = ((t0 + r) * hv + j) * vd;
                        o_ref[at..at + vd].copy_from_slice(row);
                    }
                }
            }
            for threads in [1, 2] {
                let (mut o, mut s) = (vec![0.0; v.len()], vec![0.0; h0.len()]);
                let out = Outputs {
                    o: &mut o,
                    final_state: Some(&mut s),
                };
                crate::threads::install(threads, || run(&d, &x, &f, out, threads)).unwrap();
                assert_eq!(o, o_ref, "{chunk:?} threads {threads}");
                assert_eq!(s, s_ref, "{chunk:?} threads {threads}");
            }
            let Some(chunk) = chunk else { continue };
            // The serial chunked form in head groups of every size (uneven ones included),
            // final state K-first, V-first or not asked for.
            let s_ref_v: Vec<f32> = s_ref
                .chunks_exact(kd * vd)
                .flat_map(|blk| transpose(blk, kd, vd))
                .collect();
            for group in 1..=hv {
                for (v_first, want_state) in [(false, true), (true, true), (false, false)] {
                    let fv = Flags { v_first, ..f };
                    let xv = Inputs {
                        initial_state: Some(if v_first { &h0_v } else { &h0 }),
                        ..x
                    };
                    let c = Ctx {
                        d: &d,
                        x: &xv,
                        f: &fv,
                        isa: core_api::isa(),
                        block_rows: chunk,
                    };
                    let (mut o, mut s) = (vec![0.0; v.len()], vec![0.0; h0.len()]);
                    let out = Outputs {
                        o: &mut o,
                        final_state: want_state.then_some(&mut s[..]),
                    };
                    run_serial_grouped(&c, chunk, group, out).unwrap();
                    let what = format!("C{chunk} group {group} v_first {v_first}");
                    assert_eq!(o, o_ref, "{what}");
                    if want_state {
                        assert_eq!(&s, if v_first { &s_ref_v } else { &s_ref }, "{what}");
                    }
                }
            }
        }
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
