//! The path the benches run (`KDA_BENCH_ISA`) and its single-core f32 FMA peak, measured with
//! its widest vectors (independent multiply-add chains in registers), shared by the benches
//! that quote a fraction of it.

use kda_core::Isa;

/// The path to bench: `KDA_BENCH_ISA` when set (a name `Isa::name` prints, for a path this CPU
/// runs, e.g. `avx2` on an AVX-512 machine), else the fastest one.
pub fn bench_isa() -> Isa {
    let Ok(name) = std::env::var("KDA_BENCH_ISA") else {
        return Isa::detect();
    };
    match Isa::all_supported().find(|i| i.name() == name) {
        Some(isa) => isa,
        None => panic!("KDA_BENCH_ISA={name}: not a path this CPU runs"),
    }
}

/// Single-core f32 FMA peak on `isa`'s path. Returns (FMAs done, a value to keep the work
/// alive).
#[inline(never)]
pub fn fma_peak(isa: Isa, iters: usize) -> (usize, f32) {
    kda_core::internals::fma_peak(isa, iters)
}
