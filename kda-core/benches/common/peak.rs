//! The single-core f32 FMA peak, measured with the widest vectors of the detected ISA
//! (independent multiply-add chains in registers), shared by the benches that quote a
//! fraction of it.

/// Single-core f32 FMA peak on [`kda_core::Isa::detect`]'s path. Returns (FMAs done, a value
/// to keep the work alive).
#[inline(never)]
pub fn fma_peak(iters: usize) -> (usize, f32) {
    kda_core::internals::fma_peak(kda_core::Isa::detect(), iters)
}
