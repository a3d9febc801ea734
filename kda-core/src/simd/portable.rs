//! Portable kernels: plain loops over fixed-width lanes that the compiler vectorises for any
//! target. They define the reference results the other paths are tested against.

use half::bf16;

use super::types::{CStart, ReadLoads, TameIn, TameOut, DECODE_LD, DIRECT, PANEL, READ_PIECE};

pub(crate) use crate::math::bf16_to_f32;

pub(super) fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * *x;
    }
}

pub(super) fn decay_predict_rows(
    (src, s): (Option<&[f32]>, &mut [f32]),
    k: &[f32],
    decay: &[f32],
    p: &mut [f32],
) {
    if p.is_empty() {
        return;
    }
    if let Some(src) = src {
        s.copy_from_slice(src);
    }
    for ((row, &kd), &a) in s.chunks_exact_mut(p.len()).zip(k).zip(decay) {
        decay_predict(row, a, kd, p);
    }
}

pub(super) fn write_read_rows(
    s: &mut [f32],
    k: &[f32],
    delta: &[f32],
    (q, scale): (&[f32], f32),
    o: &mut [f32],
) {
    if o.is_empty() {
        return;
    }
    for ((row, &kd), &qd) in s.chunks_exact_mut(o.len()).zip(k).zip(q) {
        write_read(row, kd, delta, qd * scale, o);
    }
}

pub(super) fn decay_predict(s: &mut [f32], decay: f32, k: f32, p: &mut [f32]) {
    for (s, p) in s.iter_mut().zip(p.iter_mut()) {
        *s *= decay;
        *p += k * *s;
    }
}

pub(super) fn write_read(s: &mut [f32], k: f32, delta: &[f32], q: f32, o: &mut [f32]) {
    for ((s, d), o) in s.iter_mut().zip(delta).zip(o.iter_mut()) {
        *s += k * *d;
        *o += q * *s;
    }
}

pub(super) fn exp_in_place(x: &mut [f32]) {
    for v in x {
        *v = libm::expf(*v);
    }
}

pub(super) fn sigmoid_scaled(x: &mut [f32], c: f32) {
    for v in x {
        *v = c * crate::math::sigmoid(*v);
    }
}

pub(super) fn softplus_scaled(x: &mut [f32], c: f32) {
    for v in x {
        *v = c * crate::math::softplus(*v);
    }
}

/// Sets `C` to its start value (see [`CStart`]) in a pass of its own.
pub(super) fn start_c(start: CStart<'_>, m: usize, n: usize, c: &mut [f32], ldc: usize) {
    for i in 0..m {
        let row = &mut c[i * ldc..i * ldc + n];
        match start {
            CStart::Keep => {}
            CStart::Zero => row.fill(0.0),
            CStart::ScaledRows(f) => row.iter_mut().for_each(|x| *x *= f[i]),
        }
    }
}

/// `C += A·B` for the shape `(m, n, k)`, each matrix with its leading dimension.
pub(super) fn gemm_acc(
    (m, n, k): (usize, usize, usize),
    (a, lda): (&[f32], usize),
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
) {
    for i in 0..m {
        let crow = &mut c[i * ldc..i * ldc + n];
        for p in 0..k {
            let av = a[i * lda + p];
            let brow = &b[p * ldb..p * ldb + n];
            for (c, b) in crow.iter_mut().zip(brow) {
                *c += av * *b;
            }
        }
    }
}

pub(super) fn transpose(
    (rows, cols): (usize, usize),
    (src, lds): (&[f32], usize),
    (dst, ldd): (&mut [f32], usize),
    mut scaled: Option<(&mut [f32], &[f32])>,
) {
    for r in 0..rows {
        for c in 0..cols {
            let x = src[r * lds + c];
            dst[c * ldd + r] = x;
            if let Some((d, f)) = scaled.as_mut() {
                d[c * ldd + r] = f[c] * x;
            }
        }
    }
}

/// `panel[(k − k0)·16 + r] = widen(W[r][k])`, the last row repeated to fill 16.
pub(super) fn pack_panel<W: Copy>(
    ws: &[&[W]],
    k0: usize,
    k1: usize,
    panel: &mut [f32],
    widen: impl Fn(W) -> f32,
) {
    for (k, col) in (k0..k1).zip(panel.chunks_exact_mut(PANEL)) {
        for (r, v) in col.iter_mut().enumerate() {
            *v = widen(ws[r.min(ws.len() - 1)][k]);
        }
    }
}

/// `acc[t·16 + r] += x[t][k] · panel[(k − k0)·16 + r]` for k in order (multiply, then add).
pub(super) fn panel_fma(xs: &[&[f32]], k0: usize, k1: usize, panel: &[f32], acc: &mut [f32]) {
    panel_fma_strided(xs, k0, k1, panel, acc, PANEL);
}

/// [`panel_fma`] with token `t`'s 16 accumulators at `acc[t·stride..]`.
fn panel_fma_strided(
    xs: &[&[f32]],
    k0: usize,
    k1: usize,
    panel: &[f32],
    acc: &mut [f32],
    stride: usize,
) {
    for (x, a) in xs.iter().zip(acc.chunks_mut(stride)) {
        let a = &mut a[..PANEL];
        for (xv, col) in x[k0..k1].iter().zip(panel.chunks_exact(PANEL)) {
            for (a, p) in a.iter_mut().zip(col) {
                *a += *xv * *p;
            }
        }
    }
}

/// The same sums as [`panel_fma`] straight from the rows, four independent chains at a time.
pub(super) fn rows_fma<W: Copy>(
    xs: &[&[f32]],
    ws: &[&[W]],
    k0: usize,
    k1: usize,
    acc: &mut [f32],
    widen: impl Fn(W) -> f32 + Copy,
) {
    for (x, a) in xs.iter().zip(acc.chunks_exact_mut(DIRECT)) {
        let x = &x[k0..k1];
        for (wg, ag) in ws.chunks(4).zip(a.chunks_mut(4)) {
            if let ([w0, w1, w2, w3], [s0, s1, s2, s3]) = (wg, &mut *ag) {
                let (mut a0, mut a1, mut a2, mut a3) = (*s0, *s1, *s2, *s3);
                let rows = w0[k0..k1]
                    .iter()
                    .zip(&w1[k0..k1])
                    .zip(&w2[k0..k1])
                    .zip(&w3[k0..k1]);
                for (xv, (((v0, v1), v2), v3)) in x.iter().zip(rows) {
                    a0 += *xv * widen(*v0);
                    a1 += *xv * widen(*v1);
                    a2 += *xv * widen(*v2);
                    a3 += *xv * widen(*v3);
                }
                (*s0, *s1, *s2, *s3) = (a0, a1, a2, a3);
            } else {
                for (w, s) in wg.iter().zip(ag.iter_mut()) {
                    for (xv, v) in x.iter().zip(&w[k0..k1]) {
                        *s += *xv * widen(*v);
                    }
                }
            }
        }
    }
}

/// [`panel_fma_strided`] from a bf16 panel (starting at step `k0`): each 16-step slice is
/// widened, then accumulated in the same order.
pub(super) fn panel_fma_bf16(
    xs: &[&[f32]],
    k0: usize,
    k1: usize,
    panel: &[bf16],
    acc: &mut [f32],
    stride: usize,
) {
    let mut buf = [0.0f32; 16 * PANEL];
    let mut k = k0;
    while k < k1 {
        let kb = (k1 - k).min(16);
        let src = &panel[(k - k0) * PANEL..(k - k0 + kb) * PANEL];
        for (d, s) in buf.iter_mut().zip(src) {
            *d = bf16_to_f32(*s);
        }
        panel_fma_strided(xs, k, k + kb, &buf, acc, stride);
        k += kb;
    }
}

/// The sums of [`panel_fma`] from bf16 panel-layout weights (`acc[t·DECODE_LD + 16p + r]`).
pub(super) fn panels_fma(xs: &[&[f32]], panels: &[&[bf16]], k0: usize, k1: usize, acc: &mut [f32]) {
    for (p, panel) in panels.iter().enumerate() {
        let src = &panel[k0 * PANEL..];
        panel_fma_bf16(xs, k0, k1, src, &mut acc[p * PANEL..], DECODE_LD);
    }
}

/// [`super::probes::kernels::read_sum`]'s pattern in scalar code.
pub(super) fn read_sum(data: &[f32], streams: usize, loads: ReadLoads) -> f32 {
    match loads {
        ReadLoads::Widest => read_streams(data, streams, |v| *v),
        ReadLoads::Bf16 => {
            let halves: &[u16] = bytemuck::cast_slice(data);
            read_streams(halves, streams, |&h| half::bf16::from_bits(h).to_f32())
        }
    }
}

/// [`read_sum`] over elements of any type, each read as `f32` by `value`.
fn read_streams<T>(data: &[T], streams: usize, value: impl Fn(&T) -> f32) -> f32 {
    let piece = READ_PIECE * 4 / core::mem::size_of::<T>();
    let streams = streams.max(1);
    let region = data.len() / streams / piece * piece;
    let mut acc = 0.0f32;
    for off in (0..region).step_by(piece) {
        for j in 0..streams {
            acc += data[j * region + off..][..piece]
                .iter()
                .map(&value)
                .sum::<f32>();
        }
    }
    acc + data[streams * region..].iter().map(&value).sum::<f32>()
}

/// [`super::probes::kernels::fma_peak`] in scalar code: 32 independent chains.
pub(super) fn fma_peak(iters: usize) -> (usize, f32) {
    let mut acc = [1.0f32; 32];
    let (m, a) = (
        core::hint::black_box(0.999_999f32),
        core::hint::black_box(1e-7f32),
    );
    for _ in 0..iters {
        for v in acc.iter_mut() {
            *v = *v * m + a;
        }
    }
    (iters * 32, acc.iter().sum())
}

/// The bf16 mode's reference: per token `t`, panel `p` and row `r`, the chain over pairs
/// `j0..j1` of `acc[t·ld + 16p + r] ← (acc + x_odd·w_odd) + x_even·w_even` (multiply then
/// add: a product of two bf16 is exact in f32, so this is the fused form's result).
pub(super) fn pairs_panels_fma(
    xs: &[&[u32]],
    panels: &[&[bf16]],
    (j0, j1, n): (usize, usize, usize),
    acc: &mut [f32],
    ld: usize,
) {
    for (t, x) in xs.iter().enumerate() {
        for (p, panel) in panels.iter().enumerate() {
            for r in 0..PANEL {
                let a = &mut acc[t * ld + p * PANEL + r];
                let mut v = *a;
                for (j, &pair) in x.iter().enumerate().take(j1).skip(j0) {
                    let even = f32::from_bits(pair << 16);
                    let odd = f32::from_bits(pair & 0xffff_0000);
                    let w_even = bf16_to_f32(panel[2 * j * PANEL + r]);
                    let w_odd = if 2 * j + 1 < n {
                        bf16_to_f32(panel[(2 * j + 1) * PANEL + r])
                    } else {
                        0.0
                    };
                    v += odd * w_odd;
                    v += even * w_even;
                }
                *a = v;
            }
        }
    }
}

/// `out[j]` = `x[2j]`, `x[2j + 1]` (0 past the end) rounded to bf16 and packed.
pub(super) fn round_pairs_row(x: &[f32], out: &mut [u32]) {
    for (j, o) in out.iter_mut().enumerate() {
        let hi = x.get(2 * j + 1).copied().unwrap_or(0.0);
        *o = super::vector::round_pair(x[2 * j], hi);
    }
}

/// The reference of [`super::tame_rows`]: `libm`'s `exp`.
pub(super) fn tame_rows(i: &TameIn<'_>, o: &mut TameOut<'_>) -> bool {
    tame_rows_with(i, o, libm::expf)
}

/// [`tame_rows`] with the given `exp`: column by column, the rows inner (the tests pass a
/// vector path's `exp`, which makes it that path's bits).
pub(super) fn tame_rows_with(
    i: &TameIn<'_>,
    o: &mut TameOut<'_>,
    exp: impl Fn(f32) -> f32,
) -> bool {
    let (l, kd) = (i.rows, i.dim);
    let (q, k, g) = (i.q, i.k, i.g);
    let mut tame = true;
    for d in 0..kd {
        let g0 = g.0[d];
        let first = exp(g0);
        o.first[d] = first;
        let scaled_first = i.scale * first;
        let (mut hi, mut lo, mut f) = (g0, 0.0f32, 1.0f32);
        for r in 0..l {
            if r > 0 {
                let x = g.0[r * g.1 + d];
                let sum = hi + x;
                let bp = sum - hi;
                let err = (hi - (sum - bp)) + (x - bp);
                hi = sum;
                lo += err;
            }
            let diff = (hi - g0) + lo;
            // A NaN fails too.
            tame &= diff.abs() <= i.limit;
            f = exp(diff);
            let (qv, kv) = (q.0[r * q.1 + d], k.0[r * k.1 + d]);
            let (qf, kf) = (qv * f, kv * f);
            let at = r * kd + d;
            o.qf[at] = qf;
            o.kf[at] = kf;
            o.kb[at] = kv * (1.0 / f);
            o.qd[at] = scaled_first * qf;
            o.kd[at] = first * kf;
        }
        o.last[d] = f;
        o.hi[d] = hi;
        o.lo[d] = lo;
    }
    tame
}

/// The portable [`dot_q8_0`](super::dot_q8_0): each weight `d·q` in f32, then eight partial
/// sums in the order of `ops::linear::dot_blocks` (the same value, bitwise).
pub(super) fn dot_q8_0(x: &[f32], w: &[u8]) -> f32 {
    use super::types::{Q8_0_BYTES, Q8_0_ELEMS};
    let mut acc = [0.0f32; 8];
    for (block, xb) in w.chunks_exact(Q8_0_BYTES).zip(x.chunks_exact(Q8_0_ELEMS)) {
        let d = half::f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32();
        for (i, (xv, &q)) in xb.iter().zip(&block[2..]).enumerate() {
            acc[i % 8] += xv * (d * (q as i8 as f32));
        }
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}
