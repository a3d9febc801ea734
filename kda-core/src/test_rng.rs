//! The unit tests' random numbers: one deterministic generator (a 64-bit LCG, top 24 bits),
//! so tests draw reproducible inputs without a dependency.

/// Uniform f32 in `[-1, 1)` from `seed`, advancing it.
pub(crate) fn uniform(seed: &mut u64) -> f32 {
    *seed = seed
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}
