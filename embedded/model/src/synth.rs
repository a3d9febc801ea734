//! The example's seeded weights and inputs: integer PRNG (splitmix64) and exact f32 arithmetic
//! only, plus `libm` for the two gate parameters, so the same seed gives bitwise the same
//! numbers on any host. Shared, by path, with the generator (`gen/`), which writes them into
//! `weights.rs` as flash data; the host check regenerates them and compares bitwise.

/// The seed of every weight.
pub const SEED: u64 = 0x4B44_415F_454D_4231;
/// The seed of the input tokens.
pub const INPUT_SEED: u64 = 0x4B44_415F_494E_5031;

/// Model width.
pub const HIDDEN: usize = 64;
/// KDA heads.
pub const HEADS: usize = 2;
/// Head dim (K = V).
pub const HEAD_DIM: usize = 16;
/// Short-conv width.
pub const CONV: usize = 4;
/// `heads · head_dim`.
pub const D: usize = HEADS * HEAD_DIM;
/// Rank of the low-rank decay projection.
pub const RANK: usize = HEAD_DIM;

/// One tensor: name in `weights.rs`, rows, columns (1 for vectors) and how it is drawn.
#[derive(Debug, Clone, Copy)]
pub struct Tensor {
    /// Rust name of the static (upper case).
    pub name: &'static str,
    /// Rows (output features).
    pub rows: usize,
    /// Columns (input features).
    pub cols: usize,
    /// How the values are drawn.
    pub kind: Kind,
    /// Whether the int8 weight set quantises it (every matrix and the conv weights).
    pub quantised: bool,
}

/// Distribution of a tensor's values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// `normal · scale`.
    Normal(f32),
    /// `A_log = ln(U(1, 16))` (fla's init).
    ALog,
    /// `dt_bias = softplus⁻¹(dt)`, `dt` log-uniform in [1e-3, 1e-1] (fla's init).
    DtBias,
    /// `1 + 0.1 · normal`.
    Norm,
}

const fn t(name: &'static str, rows: usize, cols: usize, kind: Kind, quantised: bool) -> Tensor {
    Tensor {
        name,
        rows,
        cols,
        kind,
        quantised,
    }
}

/// `1/sqrt(n)` for the sizes used (exact constants, no float library at compile time).
const INV_SQRT_64: f32 = 0.125;
const INV_SQRT_32: f32 = 0.176_776_7;
const INV_SQRT_16: f32 = 0.25;

/// Every tensor of the layer, in drawing order (Kimi K3 layout: low-rank decay projection,
/// full-rank output gate).
pub const TENSORS: [Tensor; 14] = [
    t("Q_PROJ", D, HIDDEN, Kind::Normal(INV_SQRT_64), true),
    t("K_PROJ", D, HIDDEN, Kind::Normal(INV_SQRT_64), true),
    t("V_PROJ", D, HIDDEN, Kind::Normal(INV_SQRT_64), true),
    t("F_A_PROJ", RANK, HIDDEN, Kind::Normal(INV_SQRT_64), true),
    t("F_B_PROJ", D, RANK, Kind::Normal(INV_SQRT_16), true),
    t("B_PROJ", HEADS, HIDDEN, Kind::Normal(INV_SQRT_64), true),
    t("G_PROJ", D, HIDDEN, Kind::Normal(INV_SQRT_64), true),
    t("O_PROJ", HIDDEN, D, Kind::Normal(INV_SQRT_32), true),
    t("Q_CONV", D, CONV, Kind::Normal(0.5), true),
    t("K_CONV", D, CONV, Kind::Normal(0.5), true),
    t("V_CONV", D, CONV, Kind::Normal(0.5), true),
    t("A_LOG", HEADS, 1, Kind::ALog, false),
    t("DT_BIAS", D, 1, Kind::DtBias, false),
    t("O_NORM", HEAD_DIM, 1, Kind::Norm, false),
];

/// splitmix64.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator at `seed`.
    pub const fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// Uniform in [−1, 1) on a 2^−23 grid (exact in f32).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / 8_388_608.0 - 1.0
    }

    /// Approximately standard normal: the sum of four uniforms scaled to unit variance
    /// (Irwin–Hall), exact f32 arithmetic only.
    pub fn normal(&mut self) -> f32 {
        let s = self.uniform() + self.uniform() + self.uniform() + self.uniform();
        s * 0.866_025_4
    }
}

/// The splitmix64 output function.
pub const fn mix(z: u64) -> u64 {
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Draws tensor `ti` of [`TENSORS`] (all tensors come from one stream: call in order, with
/// the same `rng`).
pub fn draw(rng: &mut Rng, ti: usize, out: &mut [f32]) {
    let tensor = TENSORS[ti];
    for v in out.iter_mut().take(tensor.rows * tensor.cols) {
        *v = match tensor.kind {
            Kind::Normal(s) => rng.normal() * s,
            Kind::ALog => libm::logf(1.0 + 7.5 * (rng.uniform() + 1.0)),
            Kind::DtBias => {
                let u = (rng.uniform() + 1.0) * 0.5;
                let dt = libm::expf(libm::logf(1e-3) + u * (libm::logf(1e-1) - libm::logf(1e-3)));
                libm::logf(libm::expm1f(dt))
            }
            Kind::Norm => 1.0 + 0.1 * rng.normal(),
        };
    }
}

/// Input element `i` of token `t`, Q15.16, uniform in [−2, 2): the float paths read it as
/// `x / 2^16` (exact), so every path sees the same numbers.
pub fn input_q16(t: usize, i: usize) -> i32 {
    let h = mix(INPUT_SEED ^ ((t * HIDDEN + i) as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
    ((h >> 46) as i32) - (1 << 17)
}
