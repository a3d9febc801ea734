//! The benchmarks' probes: the FMA and bf16 dot-product peaks and the read bandwidth
//! ([`ReadLoads`]): the safe wrappers, their kernels and their tests.

use super::types::ReadLoads;
use super::{dispatch, portable, Path};

/// The sum of `data` read as `streams` interleaved far-apart regions (256-byte pieces), with
/// `loads` and, when `prefetch`, software prefetch: the read-bandwidth probe of the
/// benchmarks (its summation order is the path's; not for numerics). With
/// [`ReadLoads::Bf16`] every f32 is read as its two bf16 halves.
pub fn read_sum(
    isa: impl Into<Path>,
    data: &[f32],
    streams: usize,
    prefetch: bool,
    loads: ReadLoads,
) -> f32 {
    let _ = prefetch; // read only by the vector arms
    dispatch!(
        isa,
        read_sum(data, streams, prefetch, loads),
        portable::read_sum(data, streams, loads)
    )
}

/// The single-core f32 FMA peak probe on the path: independent multiply-add chains in
/// registers, `iters` rounds. Returns (FMAs done, a value to keep the work alive).
pub fn fma_peak(isa: impl Into<Path>, iters: usize) -> (usize, f32) {
    dispatch!(isa, fma_peak(iters), portable::fma_peak(iters))
}

/// The single-core peak of the bf16 mode's dot products on the path (`Simd::dot_pairs`:
/// `vdpbf16ps` on avx512_bf16, two f32 multiply-adds per pair elsewhere), `iters` rounds of
/// independent chains. Returns (multiply-adds done, a value to keep the work alive). The
/// reference path has no bf16 dot product: it runs [`fma_peak`] (its bf16 mode is f32
/// multiply-adds).
pub fn dot_pairs_peak(isa: impl Into<Path>, iters: usize) -> (usize, f32) {
    dispatch!(isa, dot_pairs_peak(iters), portable::fma_peak(iters))
}

/// The kernels of this file, generic over the ISA token and `#[inline(always)]` (see the
/// contract in the `simd` module docs).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64", test)),
    allow(dead_code, unused_macros, unused_imports)
)]
pub(crate) mod kernels {
    use half::bf16;

    use crate::simd::types::{ReadLoads, READ_PIECE};
    use crate::simd::vector::{Simd, MAX_LANES};

    /// The sum of `data`, read as `streams` far-apart regions interleaved piece by piece (the
    /// access pattern of a projection streaming several weight rows), with `loads`, four
    /// independent accumulators and, when `prefetch`, a software prefetch 1 KiB ahead in each
    /// stream: a read-bandwidth probe, not a numerically careful sum. With
    /// [`ReadLoads::Bf16`] the bytes are read as bf16 values (each f32 as its two halves).
    #[inline(always)]
    pub(crate) unsafe fn read_sum<S: Simd>(
        s: S,
        data: &[f32],
        streams: usize,
        prefetch: bool,
        loads: ReadLoads,
    ) -> f32 {
        let streams = streams.max(1);
        match loads {
            ReadLoads::Widest => {
                let load = |p: *const f32| s.load(p);
                let (sum, done) =
                    read_streams(s, data.as_ptr(), data.len(), streams, prefetch, load);
                sum + data[done..].iter().sum::<f32>()
            }
            ReadLoads::Bf16 => {
                let halves: &[u16] = bytemuck::cast_slice(data);
                let load = |p: *const bf16| s.load_bf16(p);
                let p = halves.as_ptr() as *const bf16; // bf16 is a u16 (repr(transparent))
                let (sum, done) = read_streams(s, p, halves.len(), streams, prefetch, load);
                sum + halves[done..]
                    .iter()
                    .map(|&h| bf16::from_bits(h).to_f32())
                    .sum::<f32>()
            }
        }
    }

    /// [`read_sum`]'s loop over `len` elements at `p`, `LANES` of them per `load`: returns the
    /// sum and how many elements it read (whole pieces of every stream; the caller adds the rest).
    #[inline(always)]
    unsafe fn read_streams<S: Simd, T>(
        s: S,
        p: *const T,
        len: usize,
        streams: usize,
        prefetch: bool,
        load: impl Fn(*const T) -> S::F,
    ) -> (f32, usize) {
        let l = S::LANES;
        // A piece is 256 bytes whatever the element size.
        let piece = READ_PIECE * 4 / core::mem::size_of::<T>();
        let region = len / streams / piece * piece;
        let mut acc = [s.splat(0.0); 4];
        for off in (0..region).step_by(piece) {
            for j in 0..streams {
                let q = p.add(j * region + off);
                if prefetch {
                    // Never faults, so an address past the end is harmless (wrapping: no UB).
                    s.prefetch(q.wrapping_add(4 * piece) as *const f32);
                }
                for v in (0..piece).step_by(4 * l) {
                    for (u, a) in acc.iter_mut().enumerate() {
                        *a = s.add(*a, load(q.add(v + u * l)));
                    }
                }
            }
        }
        let a = s.add(s.add(acc[0], acc[1]), s.add(acc[2], acc[3]));
        (s.reduce_sum(a), streams * region)
    }

    /// The FMA peak probe: `3/4` of the registers as independent `x ← x·m + a` chains (enough to
    /// cover the FMA latency on every pipe), `iters` rounds. Returns (FMAs done, a value to keep
    /// the work alive).
    #[inline(always)]
    pub(crate) fn fma_peak<S: Simd>(s: S, iters: usize) -> (usize, f32) {
        let m = s.splat(core::hint::black_box(0.999_999));
        let a = s.splat(core::hint::black_box(1e-7));
        let (chains, total) = peak_chains(s, iters, s.splat(1.0), |x| s.mul_add(x, m, a));
        (iters * chains * S::LANES, total)
    }

    /// The bf16 dot-product peak probe: [`peak_chains`] of
    /// `acc ← acc + a.odd·b.odd + a.even·b.even` ([`Simd::dot_pairs`], `vdpbf16ps` where the ISA
    /// has it). Returns (multiply-adds done, two per lane and step; a value to keep the work
    /// alive).
    #[inline(always)]
    pub(crate) unsafe fn dot_pairs_peak<S: Simd>(s: S, iters: usize) -> (usize, f32) {
        let row = [bf16::from_f32(core::hint::black_box(1e-3)); MAX_LANES];
        let a = s.load_pairs(row.as_ptr(), row.as_ptr());
        let (chains, total) = peak_chains(s, iters, s.splat(0.0), |acc| s.dot_pairs(acc, a, a));
        (iters * chains * 2 * S::LANES, total)
    }

    /// A peak probe's loop: `3/4` of the registers as independent chains `x ← step(x)` from
    /// `start` (enough to cover the latency on every pipe), `iters` rounds. Returns the number of
    /// chains and the sum of every lane of every chain (to keep the work alive).
    #[inline(always)]
    fn peak_chains<S: Simd>(
        s: S,
        iters: usize,
        start: S::F,
        step: impl Fn(S::F) -> S::F,
    ) -> (usize, f32) {
        let chains = S::REGISTERS * 3 / 4;
        let mut acc = [start; 24];
        for _ in 0..iters {
            for v in acc.iter_mut().take(chains) {
                *v = step(*v);
            }
        }
        let mut total = s.splat(0.0);
        for v in acc.iter().take(chains) {
            total = s.add(total, *v);
        }
        (chains, s.reduce_sum(total))
    }

    /// The entry points of this file's kernels for the token `$token`, each with
    /// `#[target_feature(enable = $features)]` when given (see `simd::instantiate!`).
    macro_rules! entry_points {
        ($token:expr $(, $features:literal)?) => {
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn fma_peak(iters: usize) -> (usize, f32) {
                $crate::simd::probes::kernels::fma_peak($token, iters)
            }
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn dot_pairs_peak(iters: usize) -> (usize, f32) {
                $crate::simd::probes::kernels::dot_pairs_peak($token, iters)
            }
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn read_sum(
                data: &[f32],
                streams: usize,
                prefetch: bool,
                loads: $crate::simd::ReadLoads,
            ) -> f32 {
                $crate::simd::probes::kernels::read_sum($token, data, streams, prefetch, loads)
            }
        };
    }
    pub(crate) use entry_points;
}

super::instantiate!();

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::test_support::test_paths;
    use std::vec::Vec;

    #[test]
    fn dot_pairs_peak_does_the_work_it_counts() {
        // Every multiply-add adds c² (c = bf16(1e-3)) to a chain, so the chains' total is the
        // count times c², up to f32 rounding over ~1000 steps per chain.
        let c = f64::from(half::bf16::from_f32(1e-3).to_f32());
        for isa in test_paths().into_iter().chain([Path::Reference]) {
            let (macs, total) = dot_pairs_peak(isa, 1000);
            assert!(macs >= 1000 && macs % 1000 == 0, "{isa:?}: {macs}");
            let want = macs as f64 * c * c;
            let err = (f64::from(total) - want).abs() / want;
            if isa == Path::Reference {
                // The reference path runs the f32 FMA probe (x ← 0.999999·x + 1e-7 from 1).
                assert!(total.is_finite() && total > 0.0, "{isa:?}: {total}");
            } else {
                assert!(
                    err < 1e-3,
                    "{isa:?}: {total} vs {want} ({macs} multiply-adds)"
                );
            }
        }
    }

    #[test]
    fn read_probe_sums_everything_once() {
        for isa in test_paths().into_iter().chain([Path::Reference]) {
            for n in [0usize, 5, 64, 1000, 4096 + 77] {
                // Small integers: every order sums them exactly, and read as bf16 halves each
                // is (0, itself), so both loads give the same sum.
                let data: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
                let want: f32 = data.iter().sum();
                for streams in [1, 4, 8] {
                    for prefetch in [false, true] {
                        for loads in [ReadLoads::Widest, ReadLoads::Bf16] {
                            let got = read_sum(isa, &data, streams, prefetch, loads);
                            assert_eq!(got, want, "{isa:?} n={n} streams={streams} {loads:?}");
                        }
                    }
                }
            }
        }
    }
}
