//! What the simd tests share: random data, comparisons by path, and the paths to test on this
//! machine (printed, with a "skipped" line for each ISA the CPU lacks).

use std::vec::Vec;

use super::{Isa, Path};

pub(crate) fn rnd(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed as u64;
    (0..n).map(|_| crate::test_rng::uniform(&mut s)).collect()
}

pub(crate) fn close(a: f32, b: f32, tol: f32) -> bool {
    (a - b).abs() <= tol * (1.0 + b.abs())
}

/// Whether `a` and `b` hold the same bits.
pub(crate) fn bits_eq(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Whether `path` promises the reference loops' bits (no fused multiply-add).
pub(crate) fn exact(path: Path) -> bool {
    matches!(path, Path::Lanes(_))
}

/// `a` equals `b` bitwise on an exact path, else within `tol` relative.
pub(crate) fn same(path: Path, a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            if exact(path) {
                x.to_bits() == y.to_bits()
            } else {
                close(*x, *y, tol)
            }
        })
}

/// Every vector path to test on this machine: the plain-lanes instantiations at 4, 8 and 16
/// lanes, then each ISA this CPU has (a "skipped: no …" line for each it lacks).
pub(crate) fn test_paths() -> std::vec::Vec<Path> {
    let mut v = std::vec![Path::Lanes(4), Path::Lanes(8), Path::Lanes(16)];
    for (isa, ok) in Isa::all().filter(|(i, _)| *i != Isa::Portable) {
        if ok {
            v.push(isa.into());
        } else {
            std::println!("skipped: no {} ({isa:?} path untested here)", isa.feature());
        }
    }
    std::println!("paths tested: {v:?}");
    v
}
