//! The single-core f32 FMA peak, measured: 12 independent 8-lane FMA chains (enough to fill
//! two FMA pipes of latency 4), shared by the benches that quote a fraction of it.

use std::hint::black_box;

/// Single-core f32 FMA peak: 12 independent 8-wide accumulators (AVX2+FMA), or the portable
/// equivalent elsewhere. Returns (FMAs done, a value to keep the work alive).
#[inline(never)]
pub fn fma_peak(iters: usize) -> (usize, f32) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: AVX2 and FMA are present (checked above).
        return unsafe { fma_peak_avx2(iters) };
    }
    let mut acc = [[1.0f32; 8]; 4];
    let (m, a) = (black_box(0.999_999f32), black_box(1e-7f32));
    for _ in 0..iters {
        for r in acc.iter_mut() {
            for v in r.iter_mut() {
                *v = *v * m + a;
            }
        }
    }
    (iters * 32, acc.iter().flatten().sum())
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_peak_avx2(iters: usize) -> (usize, f32) {
    use std::arch::x86_64::*;
    let m = _mm256_set1_ps(black_box(0.999_999));
    let a = _mm256_set1_ps(black_box(1e-7));
    let mut acc = [_mm256_set1_ps(1.0); 12];
    for _ in 0..iters {
        for v in acc.iter_mut() {
            *v = _mm256_fmadd_ps(*v, m, a);
        }
    }
    let mut out = [0.0f32; 8];
    let mut s = _mm256_setzero_ps();
    for v in acc {
        s = _mm256_add_ps(s, v);
    }
    _mm256_storeu_ps(out.as_mut_ptr(), s);
    (iters * 12 * 8, out.iter().sum())
}
