//! A layer's options: how the delta rule runs ([`Mode`], the chunk size), the projections'
//! arithmetic ([`Precision`]), the instruction set, and where a call's caches start from
//! ([`InitialCaches`]).

use crate::error::KdaError;
use crate::ops::chunked::MAX_CHUNK;
use crate::simd::Isa;

/// Where a forward call's caches start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum InitialCaches {
    /// Every sequence starts fresh: the caches are zeroed first (their contents are ignored).
    Zero,
    /// The caches hold each sequence's state so far (a continuation, or a prefix cache).
    /// To start some sequences fresh and continue others, zero the former with
    /// [`CachesMut::reset_sequence`](crate::CachesMut::reset_sequence) and pass `Given`.
    Given,
}

/// How the delta rule runs over a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Mode {
    /// Chunked for sequences of at least [`AUTO_CHUNK_MIN_TOKENS`] tokens, else recurrent.
    #[default]
    Auto,
    /// Token by token (what decode always uses).
    Recurrent,
    /// The chunked (WY/UT) form.
    Chunked,
}

impl Mode {
    /// The mode's name as the `kda` tool spells it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Auto => "auto",
            Mode::Recurrent => "recurrent",
            Mode::Chunked => "chunked",
        }
    }

    /// What a sequence of `len` tokens runs as: [`Mode::Recurrent`] or [`Mode::Chunked`].
    pub fn resolve(self, len: usize) -> Mode {
        match self {
            Mode::Auto if len >= AUTO_CHUNK_MIN_TOKENS => Mode::Chunked,
            Mode::Auto => Mode::Recurrent,
            m => m,
        }
    }
}

/// Default chunk size, chosen by measurement (`cargo bench -p kda-core --bench delta_rule`;
/// the figures are in the README): the state products are efficient GEMMs at 16, 32 or 64, so
/// the per-token intra-chunk work, which grows with the chunk size, decides.
pub const DEFAULT_CHUNK: usize = 16;

/// In [`Mode::Auto`], sequences at least this long run chunked: the measured crossover below
/// which the recurrence is faster (README).
pub const AUTO_CHUNK_MIN_TOKENS: usize = 8;

/// The arithmetic of the projections (everything else always runs in f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Precision {
    /// f32 activations times the weights widened to f32, one f32 chain per output (the
    /// reference's arithmetic).
    #[default]
    Exact,
    /// Each projection's input rows rounded to bf16 (nearest even), products of bf16 pairs
    /// accumulated in f32: the precision torch and vLLM run bf16 checkpoints at, with
    /// `vdpbf16ps` on CPUs with AVX512_BF16 ([`Isa::Avx512Bf16`]) and the same sums, bitwise,
    /// emulated on every other path. Needs every projection as bf16 weights in the panel
    /// layout ([`crate::MatRef::new_panels`]).
    Bf16,
}

impl Precision {
    /// The precision's name as the `kda` tool spells it.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Exact => "exact",
            Precision::Bf16 => "bf16",
        }
    }
}

/// Options of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ForwardOptions {
    /// Recurrent, chunked, or chosen by length.
    pub mode: Mode,
    /// Chunk size for the chunked form (1..=256; 16, 32, 64 are typical).
    pub chunk_size: usize,
    /// Kernel path; `None` picks the fastest this CPU supports.
    pub isa: Option<Isa>,
    /// The projections' arithmetic ([`Precision::Exact`] by default).
    pub precision: Precision,
}

impl Default for ForwardOptions {
    fn default() -> Self {
        ForwardOptions {
            mode: Mode::Auto,
            chunk_size: DEFAULT_CHUNK,
            isa: None,
            precision: Precision::Exact,
        }
    }
}

impl ForwardOptions {
    /// Token-by-token only.
    pub fn recurrent() -> Self {
        ForwardOptions {
            mode: Mode::Recurrent,
            ..Self::default()
        }
    }

    /// These options with `mode`.
    pub fn with_mode(self, mode: Mode) -> Self {
        ForwardOptions { mode, ..self }
    }

    /// These options with `precision`.
    pub fn with_precision(self, precision: Precision) -> Self {
        ForwardOptions { precision, ..self }
    }

    /// Checks the chunk size and the ISA; returns the ISA to run.
    pub(super) fn validate(&self) -> Result<Isa, KdaError> {
        if self.chunk_size == 0 || self.chunk_size > MAX_CHUNK {
            return Err(KdaError::Config {
                field: "chunk_size",
                reason: "must be between 1 and 256",
            });
        }
        match self.isa {
            None => Ok(Isa::detect()),
            Some(i) if i.is_supported() => Ok(i),
            Some(_) => Err(KdaError::Config {
                field: "isa",
                reason: "not supported by this CPU",
            }),
        }
    }

    /// The chunk size a sequence of `len` tokens runs with, or `None` when it runs recurrent.
    pub(super) fn chunk_for(&self, len: usize) -> Option<usize> {
        (self.mode.resolve(len) == Mode::Chunked).then_some(self.chunk_size)
    }
}
