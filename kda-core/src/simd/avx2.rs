//! x86-64 AVX2 + FMA kernels. Every function here is `unsafe`: the caller (the dispatch in
//! `simd/mod.rs`) guarantees that the CPU supports AVX2 and FMA and that the slices have the
//! lengths the safe wrapper checked; inside, every pointer offset stays within those lengths.

use core::arch::x86_64::*;

use half::bf16;

/// Loads 8 bf16 values at `p` widened to f32.
#[inline(always)]
pub(super) unsafe fn load_bf16(p: *const bf16) -> __m256 {
    let h = _mm_loadu_si128(p as *const __m128i);
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
}

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    let n = y.len();
    let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
    let av = _mm256_set1_ps(a);
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_fmadd_ps(av, _mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(yp.add(i)));
        _mm256_storeu_ps(yp.add(i), v);
        i += 8;
    }
    for j in i..n {
        *yp.add(j) += a * *xp.add(j);
    }
}

/// [`decay_predict`] for every key row of a state `[K, V]` (`V = p.len()`): one dispatch per
/// token instead of one per row.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn decay_predict_rows(s: &mut [f32], k: &[f32], decay: &[f32], p: &mut [f32]) {
    for ((row, &kd), &a) in s.chunks_exact_mut(p.len()).zip(k).zip(decay) {
        decay_predict(row, a, kd, p);
    }
}

/// [`write_read`] for every key row of a state `[K, V]` (`V = o.len()`), with `q[d]·scale`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn write_read_rows(
    s: &mut [f32],
    k: &[f32],
    delta: &[f32],
    (q, scale): (&[f32], f32),
    o: &mut [f32],
) {
    for ((row, &kd), &qd) in s.chunks_exact_mut(o.len()).zip(k).zip(q) {
        write_read(row, kd, delta, qd * scale, o);
    }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn decay_predict(s: &mut [f32], decay: f32, k: f32, p: &mut [f32]) {
    let n = s.len();
    let (sp, pp) = (s.as_mut_ptr(), p.as_mut_ptr());
    let (dv, kv) = (_mm256_set1_ps(decay), _mm256_set1_ps(k));
    let mut i = 0;
    while i + 8 <= n {
        let sv = _mm256_mul_ps(_mm256_loadu_ps(sp.add(i)), dv);
        _mm256_storeu_ps(sp.add(i), sv);
        _mm256_storeu_ps(
            pp.add(i),
            _mm256_fmadd_ps(kv, sv, _mm256_loadu_ps(pp.add(i))),
        );
        i += 8;
    }
    for j in i..n {
        *sp.add(j) *= decay;
        *pp.add(j) += k * *sp.add(j);
    }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn write_read(s: &mut [f32], k: f32, delta: &[f32], q: f32, o: &mut [f32]) {
    let n = s.len();
    let (sp, dp, op) = (s.as_mut_ptr(), delta.as_ptr(), o.as_mut_ptr());
    let (kv, qv) = (_mm256_set1_ps(k), _mm256_set1_ps(q));
    let mut i = 0;
    while i + 8 <= n {
        let sv = _mm256_fmadd_ps(kv, _mm256_loadu_ps(dp.add(i)), _mm256_loadu_ps(sp.add(i)));
        _mm256_storeu_ps(sp.add(i), sv);
        _mm256_storeu_ps(
            op.add(i),
            _mm256_fmadd_ps(qv, sv, _mm256_loadu_ps(op.add(i))),
        );
        i += 8;
    }
    for j in i..n {
        *sp.add(j) += k * *dp.add(j);
        *op.add(j) += q * *sp.add(j);
    }
}

/// e^x for 8 lanes: x = n·ln2 + r, |r| ≤ ln2/2, Cephes degree-6 polynomial, 2^n by exponent
/// bits. Below −87.5 the result is flushed to 0; NaN stays NaN.
#[inline(always)]
unsafe fn exp8(x: __m256) -> __m256 {
    let hi = _mm256_set1_ps(88.0);
    let lo = _mm256_set1_ps(-88.0);
    // max/min return their second operand when either is NaN: keep x second so NaN survives.
    let xc = _mm256_min_ps(hi, _mm256_max_ps(lo, x));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        xc,
        _mm256_set1_ps(core::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), xc);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.398_199_9e-3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.333_452e-3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.166_579_6e-2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.666_666_5e-1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
    let r2 = _mm256_mul_ps(r, r);
    p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0)));
    // 2^n: n ∈ [−127, 127]; the biased exponent 0 (n = −127) gives 0.0, a flush.
    let ni = _mm256_cvtps_epi32(n);
    let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(ni, _mm256_set1_epi32(127)));
    let res = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    // Flush below −87.5 (ordered compare: NaN lanes are not flushed).
    let tiny = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.5));
    _mm256_andnot_ps(tiny, res)
}

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn exp_in_place(x: &mut [f32]) {
    let n = x.len();
    let p = x.as_mut_ptr();
    let mut i = 0;
    while i + 8 <= n {
        _mm256_storeu_ps(p.add(i), exp8(_mm256_loadu_ps(p.add(i))));
        i += 8;
    }
    if i < n {
        let mut buf = [0.0f32; 8];
        for j in i..n {
            buf[j - i] = *p.add(j);
        }
        _mm256_storeu_ps(buf.as_mut_ptr(), exp8(_mm256_loadu_ps(buf.as_ptr())));
        for j in i..n {
            *p.add(j) = buf[j - i];
        }
    }
}

/// One `MR`-row × `NV`·8-column register block of `C += A·B` at rows `i`, columns `j`.
#[inline(always)]
// BLAS-style: the shape and three matrices with their leading dimensions (and the block).
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_block<const MR: usize, const NV: usize>(
    i: usize,
    j: usize,
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); NV]; MR];
    for p in 0..k {
        let bp = b.add(p * ldb + j);
        let mut bv = [_mm256_setzero_ps(); NV];
        for (v, bv) in bv.iter_mut().enumerate() {
            *bv = _mm256_loadu_ps(bp.add(8 * v));
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let av = _mm256_broadcast_ss(&*a.add((i + r) * lda + p));
            for v in 0..NV {
                acc[v] = _mm256_fmadd_ps(av, bv[v], acc[v]);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        let cp = c.add((i + r) * ldc + j);
        for (v, acc) in acc.iter().enumerate() {
            let q = cp.add(8 * v);
            _mm256_storeu_ps(q, _mm256_add_ps(_mm256_loadu_ps(q), *acc));
        }
    }
}

/// All rows of one column panel of width `NV`·8, in blocks of 6 rows then the remainder.
#[inline(always)]
// BLAS-style: the shape and three matrices with their leading dimensions (and the block).
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_panel<const NV: usize>(
    m: usize,
    j: usize,
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
) {
    let mut i = 0;
    while i + 6 <= m {
        gemm_block::<6, NV>(i, j, k, a, lda, b, ldb, c, ldc);
        i += 6;
    }
    match m - i {
        5 => gemm_block::<5, NV>(i, j, k, a, lda, b, ldb, c, ldc),
        4 => gemm_block::<4, NV>(i, j, k, a, lda, b, ldb, c, ldc),
        3 => gemm_block::<3, NV>(i, j, k, a, lda, b, ldb, c, ldc),
        2 => gemm_block::<2, NV>(i, j, k, a, lda, b, ldb, c, ldc),
        1 => gemm_block::<1, NV>(i, j, k, a, lda, b, ldb, c, ldc),
        _ => {}
    }
}

/// `C += A·B`: column panels of 16 (then 8) outer so each panel of `B` stays in L1 while
/// every row block of `A` streams past it; a scalar tail for the last `n % 8` columns.
#[target_feature(enable = "avx2,fma")]
// BLAS-style: the shape and three matrices with their leading dimensions (and the block).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_acc(
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
    let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
    let mut j = 0;
    while j + 16 <= n {
        gemm_panel::<2>(m, j, k, ap, lda, bp, ldb, cp, ldc);
        j += 16;
    }
    if j + 8 <= n {
        gemm_panel::<1>(m, j, k, ap, lda, bp, ldb, cp, ldc);
        j += 8;
    }
    for jj in j..n {
        for i in 0..m {
            let mut s = 0.0f32;
            for p in 0..k {
                s += *ap.add(i * lda + p) * *bp.add(p * ldb + jj);
            }
            *cp.add(i * ldc + jj) += s;
        }
    }
}

/// Transposes an 8×8 block held as 8 row vectors into 8 column vectors (unpack, shuffle,
/// lane permute: 24 shuffles).
#[inline(always)]
pub(super) unsafe fn transpose8(a: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(a[0], a[1]);
    let t1 = _mm256_unpackhi_ps(a[0], a[1]);
    let t2 = _mm256_unpacklo_ps(a[2], a[3]);
    let t3 = _mm256_unpackhi_ps(a[2], a[3]);
    let t4 = _mm256_unpacklo_ps(a[4], a[5]);
    let t5 = _mm256_unpackhi_ps(a[4], a[5]);
    let t6 = _mm256_unpacklo_ps(a[6], a[7]);
    let t7 = _mm256_unpackhi_ps(a[6], a[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

/// 8×8 tiles transposed in registers (unpack / shuffle / lane permute), scalar edges.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn transpose(
    rows: usize,
    cols: usize,
    src: &[f32],
    lds: usize,
    dst: &mut [f32],
    ldd: usize,
) {
    let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr());
    let (r8, c8) = (rows / 8 * 8, cols / 8 * 8);
    let mut r = 0;
    while r < r8 {
        let mut c = 0;
        while c < c8 {
            let cols = transpose8(core::array::from_fn(|i| {
                _mm256_loadu_ps(sp.add((r + i) * lds + c))
            }));
            for (i, v) in cols.iter().enumerate() {
                _mm256_storeu_ps(dp.add((c + i) * ldd + r), *v);
            }
            c += 8;
        }
        for cc in c8..cols {
            for i in 0..8 {
                *dp.add(cc * ldd + r + i) = *sp.add((r + i) * lds + cc);
            }
        }
        r += 8;
    }
    for rr in r8..rows {
        for cc in 0..cols {
            *dp.add(cc * ldd + rr) = *sp.add(rr * lds + cc);
        }
    }
}
