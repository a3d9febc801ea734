//! Portable kernels: plain loops over fixed-width lanes that the compiler vectorises for any
//! target. They define the reference results the other paths are tested against.

use half::bf16;

const LANES: usize = 8;

#[inline(always)]
fn reduce(acc: [f32; LANES]) -> f32 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

#[inline(always)]
pub(crate) fn bf16_to_f32(v: bf16) -> f32 {
    f32::from_bits((v.to_bits() as u32) << 16)
}

pub(super) fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * *x;
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

#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_acc(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
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
    rows: usize,
    cols: usize,
    src: &[f32],
    lds: usize,
    dst: &mut [f32],
    ldd: usize,
) {
    for r in 0..rows {
        for c in 0..cols {
            dst[c * ldd + r] = src[r * lds + c];
        }
    }
}

fn partial_tile<W: Copy>(
    k0: usize,
    k1: usize,
    xs: &[&[f32]],
    ws: &[&[W]],
    acc: &mut [f32; 96],
    widen: impl Fn(W) -> f32,
) {
    for (t, x) in xs.iter().enumerate().take(3) {
        for (r, w) in ws.iter().enumerate().take(4) {
            let a = &mut acc[(t * 4 + r) * 8..(t * 4 + r + 1) * 8];
            for (xc, wc) in x[k0..k1]
                .chunks_exact(LANES)
                .zip(w[k0..k1].chunks_exact(LANES))
            {
                for l in 0..LANES {
                    a[l] += xc[l] * widen(wc[l]);
                }
            }
        }
    }
}

pub(super) fn finish_tile<W: Copy>(
    k1: usize,
    n: usize,
    xs: &[&[f32]],
    ws: &[&[W]],
    acc: &[f32; 96],
    out: &mut [[f32; 4]; 3],
    widen: impl Fn(W) -> f32,
) {
    for (t, x) in xs.iter().enumerate().take(3) {
        for (r, w) in ws.iter().enumerate().take(4) {
            let mut a = [0.0f32; LANES];
            a.copy_from_slice(&acc[(t * 4 + r) * 8..(t * 4 + r + 1) * 8]);
            let mut s = reduce(a);
            for j in k1..n {
                s += x[j] * widen(w[j]);
            }
            out[t][r] = s;
        }
    }
}

pub(super) fn dot_partial_tokens<W: Copy>(
    k0: usize,
    k1: usize,
    xs: &[&[f32]],
    ws: &[&[W]],
    accs: &mut [f32],
    widen: impl Fn(W) -> f32 + Copy,
) {
    for (g, xg) in xs.chunks(3).enumerate() {
        if let Some(acc) = accs
            .get_mut(96 * g..96 * g + 96)
            .and_then(|a| <&mut [f32; 96]>::try_from(a).ok())
        {
            partial_tile(k0, k1, xg, ws, acc, widen);
        }
    }
}
