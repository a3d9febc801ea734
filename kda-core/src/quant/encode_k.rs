//! The K-quant encoders (Q2_K … Q6_K) and ggml's scale searches they use, ported from
//! ggml-quants.c operation for operation (see [`super::encode`] for what that guarantees).
//! Names follow ggml's (`L` is `l`, `Laux` is `aux`), so the two read side by side.

use libm::{fabsf, sqrtf};

use super::blocks::scale_min_k4;
use super::ggml_float::{nearest_int, put_half};

/// ggml's `GROUP_MAX_EPS`: a group whose largest magnitude is below it is all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// `MAX(lo, MIN(hi, v))`.
#[inline(always)]
fn clamp(v: i32, lo: i32, hi: i32) -> i32 {
    v.min(hi).max(lo)
}

/// The search parameters of [`make_qkx2_quants`].
struct Qkx2 {
    nmax: i32,
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
}

/// Weighted error `Σ w·e(scale·l + min − x)`, `e` squared or absolute.
fn qkx2_error(p: &Qkx2, x: &[f32], w: &[f32], l: &[u8], scale: f32, min: f32) -> f32 {
    let mut err = 0.0f32;
    for i in 0..x.len() {
        let diff = scale * l[i] as f32 + min - x[i];
        let diff = if p.use_mad { fabsf(diff) } else { diff * diff };
        err += w[i] * diff;
    }
    err
}

/// ggml's `make_qkx2_quants`: quants `l` in `0..=nmax` and `(scale, −min)` for `x ≈ scale·l +
/// min`, the weighted least-squares fit over `nstep + 1` trial scales. `aux` is scratch.
fn make_qkx2_quants(p: &Qkx2, x: &[f32], w: &[f32], l: &mut [u8], aux: &mut [u8]) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = w[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let nmax = p.nmax as f32;
    let iscale = nmax / (max - min);
    let mut scale = 1.0 / iscale;
    for i in 0..n {
        l[i] = clamp(nearest_int(iscale * (x[i] - min)), 0, p.nmax) as u8;
    }
    let mut best_error = qkx2_error(p, x, w, l, scale, min);
    for is in 0..=p.nstep {
        let iscale = (p.rmin + p.rdelta * is as f32 + nmax) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = clamp(nearest_int(iscale * (x[i] - min)), 0, p.nmax);
            aux[i] = q as u8;
            let q = q as f32;
            sum_l += w[i] * q;
            sum_l2 += w[i] * q * q;
            sum_xl += w[i] * q * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let cur_error = qkx2_error(p, x, w, &aux[..n], this_scale, this_min);
            if cur_error < best_error {
                l[..n].copy_from_slice(&aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// The first value of largest magnitude and that magnitude.
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        let ax = fabsf(v);
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    (max, amax)
}

/// `Σ w·x·l` and `Σ w·l²` with `w = x²` (ggml's `rmse_type` 1) for the quants of `x` at
/// `iscale`, clamped to `−nmax..nmax`.
fn qx_sums(x: &[f32], nmax: i32, iscale: f32) -> (f32, f32) {
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for &v in x {
        let q = clamp(nearest_int(iscale * v), -nmax, nmax - 1) as f32;
        let w = v * v;
        sumlx += w * v * q;
        suml2 += w * q * q;
    }
    (sumlx, suml2)
}

/// Quants `l = nmax + clamp(nearest_int(iscale·x))`.
fn qx_quants(x: &[f32], nmax: i32, iscale: f32, l: &mut [u8]) {
    for (o, &v) in l.iter_mut().zip(x) {
        *o = (nmax + clamp(nearest_int(iscale * v), -nmax, nmax - 1)) as u8;
    }
}

/// ggml's `make_qx_quants` with `rmse_type` 1 and no importance weights (what Q6_K uses):
/// quants `l` in `0..2·nmax` for `x ≈ scale·(l − nmax)`, over 19 trial scales.
fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [u8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    qx_quants(x, nmax, iscale, l);
    let (sumlx, suml2) = qx_sums(x, nmax, iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = qx_sums(x, nmax, iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            qx_quants(x, nmax, iscale, l);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants` with `do_rmse`: signed quants in `−nmax..nmax` (stored `+ nmax`),
/// refined by up to five passes of coordinate descent.
fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (o, &v) in l.iter_mut().zip(x) {
        let q = clamp(nearest_int(iscale * v), -nmax, nmax - 1);
        *o = q as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (li, &v) in l.iter_mut().zip(x) {
            let w = v * v;
            let old = *li as f32;
            let mut slx = sumlx - w * v * old;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * old * old;
                let new_l = clamp(nearest_int(v * sl2 / slx), -nmax, nmax - 1);
                if new_l != *li as i32 {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *li = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for o in l.iter_mut() {
        *o += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Packs 2-bit quants `l[256]` as Q2_K / Q3_K store them: byte `32h + i` holds quants
/// `128h + i + 32s` in bits `2s..2s + 2`.
fn pack_2bit(l: &[u8; 256], qs: &mut [u8]) {
    for h in 0..2 {
        for i in 0..32 {
            let j = 128 * h + i;
            qs[32 * h + i] = l[j] | l[j + 32] << 2 | l[j + 64] << 4 | l[j + 96] << 6;
        }
    }
}

pub(crate) fn q2_k(x: &[f32], b: &mut [u8]) {
    const Q4SCALE: f32 = 15.0;
    let p = Qkx2 {
        nmax: 3,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };
    let (mut l, mut aux, mut w) = ([0u8; 256], [0u8; 16], [0.0f32; 16]);
    let (mut scales, mut mins) = ([0.0f32; 16], [0.0f32; 16]);
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        for (wi, &v) in w.iter_mut().zip(xs) {
            *wi = fabsf(v);
        }
        (scales[j], mins[j]) = make_qkx2_quants(&p, xs, &w, &mut l[16 * j..16 * j + 16], &mut aux);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let (sc, rest) = b.split_at_mut(16);
    let (qs, dd) = rest.split_at_mut(64);
    let d = if max_scale > 0.0 {
        let iscale = Q4SCALE / max_scale;
        for j in 0..16 {
            sc[j] = nearest_int(iscale * scales[j]) as u8;
        }
        put_half(dd, 0, max_scale / Q4SCALE)
    } else {
        sc.fill(0);
        put_half(dd, 0, 0.0)
    };
    let dmin = if max_min > 0.0 {
        let iscale = Q4SCALE / max_min;
        for j in 0..16 {
            sc[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
        }
        put_half(dd, 2, max_min / Q4SCALE)
    } else {
        put_half(dd, 2, 0.0)
    };
    for j in 0..16 {
        let dj = d * (sc[j] & 0xF) as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin * (sc[j] >> 4) as f32;
        for ii in 0..16 {
            l[16 * j + ii] = clamp(nearest_int((x[16 * j + ii] + dm) / dj), 0, 3) as u8;
        }
    }
    pack_2bit(&l, qs);
}

/// The signed 6-bit scales of a Q3_K block into its 12 scale bytes (`l` already `+ 32`).
fn pack_q3_scales(ls: &[u8; 16], s: &mut [u8]) {
    s.fill(0);
    for (j, &l) in ls.iter().enumerate() {
        if j < 8 {
            s[j] = l & 0xF;
        } else {
            s[j - 8] |= (l & 0xF) << 4;
        }
        s[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
    }
}

pub(crate) fn q3_k(x: &[f32], b: &mut [u8]) {
    let mut l = [0i8; 256];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
        if fabsf(scales[j]) > amax {
            amax = fabsf(scales[j]);
            max_scale = scales[j];
        }
    }
    let (hmask, rest) = b.split_at_mut(32);
    let (qs, rest) = rest.split_at_mut(64);
    let (sc, dd) = rest.split_at_mut(12);
    let d = if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        let mut ls = [0u8; 16];
        for j in 0..16 {
            let q = nearest_int(iscale * scales[j]) as i8 as i32;
            ls[j] = (clamp(q, -32, 31) + 32) as u8;
        }
        pack_q3_scales(&ls, sc);
        put_half(dd, 0, 1.0 / iscale)
    } else {
        sc.fill(0);
        put_half(dd, 0, 0.0)
    };
    for j in 0..16 {
        let lo = if j < 8 { sc[j] & 0xF } else { sc[j - 8] >> 4 };
        let s = (lo | ((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) as i32 - 32;
        let dj = d * s as f32;
        if dj == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let q = clamp(nearest_int(x[16 * j + ii] / dj), -4, 3);
            l[16 * j + ii] = (q + 4) as i8;
        }
    }
    hmask.fill(0);
    let mut low = [0u8; 256];
    for (j, (&q, o)) in l.iter().zip(low.iter_mut()).enumerate() {
        let mut q = q as u8;
        if q > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            q -= 4;
        }
        *o = q;
    }
    pack_2bit(&low, qs);
}

/// The per-sub-block scales and mins of Q4_K / Q5_K: `make_qkx2_quants` on each 32 with
/// weights `rms(x) + |x|`; returns `(scales, mins)`.
fn k4_sub_blocks(p: &Qkx2, x: &[f32], l: &mut [u8; 256]) -> ([f32; 8], [f32; 8]) {
    let (mut scales, mut mins) = ([0.0f32; 8], [0.0f32; 8]);
    let (mut w, mut aux) = ([0.0f32; 32], [0u8; 32]);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = sqrtf(sum_x2 / 32.0);
        for (wi, &v) in w.iter_mut().zip(xs) {
            *wi = av_x + fabsf(v);
        }
        (scales[j], mins[j]) = make_qkx2_quants(p, xs, &w, &mut l[32 * j..32 * j + 32], &mut aux);
    }
    (scales, mins)
}

/// Quantises the 6-bit scales and mins of Q4_K / Q5_K into `b[0..16]` (`d`, `dmin`, the 12
/// scale bytes), then re-quantises `x` against them into `l` (`0..=nmax`).
fn k4_scales(
    x: &[f32],
    scales: &[f32; 8],
    mins: &[f32; 8],
    nmax: i32,
    b: &mut [u8],
    l: &mut [u8; 256],
) {
    let max_scale = scales
        .iter()
        .fold(0.0f32, |m, &s| if s > m { s } else { m });
    let max_min = mins.iter().fold(0.0f32, |m, &s| if s > m { s } else { m });
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let s = &mut b[4..16];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            s[j] = ls;
            s[j + 4] = lm;
        } else {
            s[j + 4] = (ls & 0xF) | (lm & 0xF) << 4;
            s[j - 4] |= (ls >> 4) << 6;
            s[j] |= (lm >> 4) << 6;
        }
    }
    let d = put_half(b, 0, max_scale / 63.0);
    let dmin = put_half(b, 2, max_min / 63.0);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &b[4..16]);
        let dj = d * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = clamp(nearest_int((x[32 * j + ii] + dm) / dj), 0, nmax) as u8;
        }
    }
}

pub(crate) fn q4_k(x: &[f32], b: &mut [u8]) {
    let p = Qkx2 {
        nmax: 15,
        rmin: -1.0,
        rdelta: 0.1,
        nstep: 20,
        use_mad: false,
    };
    let mut l = [0u8; 256];
    let (scales, mins) = k4_sub_blocks(&p, x, &mut l);
    k4_scales(x, &scales, &mins, 15, b, &mut l);
    let qs = &mut b[16..144];
    for c in 0..4 {
        for i in 0..32 {
            qs[32 * c + i] = l[64 * c + i] | l[64 * c + i + 32] << 4;
        }
    }
}

pub(crate) fn q5_k(x: &[f32], b: &mut [u8]) {
    let p = Qkx2 {
        nmax: 31,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: false,
    };
    let mut l = [0u8; 256];
    let (scales, mins) = k4_sub_blocks(&p, x, &mut l);
    k4_scales(x, &scales, &mins, 31, b, &mut l);
    let (qh, ql) = b[16..176].split_at_mut(32);
    qh.fill(0);
    for c in 0..4 {
        for i in 0..32 {
            let (mut l1, mut l2) = (l[64 * c + i], l[64 * c + i + 32]);
            if l1 > 15 {
                l1 -= 16;
                qh[i] |= 1 << (2 * c);
            }
            if l2 > 15 {
                l2 -= 16;
                qh[i] |= 2 << (2 * c);
            }
            ql[32 * c + i] = l1 | l2 << 4;
        }
    }
}

pub(crate) fn q6_k(x: &[f32], b: &mut [u8]) {
    let mut l = [0u8; 256];
    let mut scales = [0.0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for ib in 0..16 {
        scales[ib] = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
        if fabsf(scales[ib]) > max_abs_scale {
            max_abs_scale = fabsf(scales[ib]);
            max_scale = scales[ib];
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        b.fill(0);
        return;
    }
    let iscale = -128.0 / max_scale;
    let d = put_half(b, 208, 1.0 / iscale);
    let mut sc = [0i8; 16];
    for (s, &v) in sc.iter_mut().zip(&scales) {
        *s = nearest_int(iscale * v).min(127) as i8;
    }
    for (o, &s) in b[192..208].iter_mut().zip(&sc) {
        *o = s as u8;
    }
    for j in 0..16 {
        let dj = d * sc[j] as f32;
        if dj == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let q = clamp(nearest_int(x[16 * j + ii] / dj), -32, 31);
            l[16 * j + ii] = (q + 32) as u8;
        }
    }
    let (ql, rest) = b.split_at_mut(128);
    let qh = &mut rest[..64];
    for n in 0..2 {
        for i in 0..32 {
            let q = |k: usize| l[128 * n + 32 * k + i];
            ql[64 * n + i] = (q(0) & 0xF) | (q(2) & 0xF) << 4;
            ql[64 * n + i + 32] = (q(1) & 0xF) | (q(3) & 0xF) << 4;
            qh[32 * n + i] = q(0) >> 4 | (q(1) >> 4) << 2 | (q(2) >> 4) << 4 | (q(3) >> 4) << 6;
        }
    }
}
