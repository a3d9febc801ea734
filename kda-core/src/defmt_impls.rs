//! `defmt::Format` for the public types a firmware logs (feature `defmt`, off by default).
//!
//! Written by hand here rather than derived on the types, so the feature touches no other file.

use defmt::{write, Format, Formatter};

use crate::config::{DecayGate, GateProj, KdaConfig};
use crate::error::KdaError;
use crate::layer::{ForwardOptions, InitialCaches, Mode};
use crate::quant::QuantLen;
use crate::simd::Isa;

impl Format for KdaError {
    fn format(&self, f: Formatter<'_>) {
        match *self {
            KdaError::Length {
                arg,
                expected,
                actual,
            } => write!(
                f,
                "`{=str}` has {} elements, expected {}",
                arg, actual, expected
            ),
            KdaError::TooSmall {
                arg,
                needed,
                actual,
            } => write!(
                f,
                "`{=str}` has {} elements, needs at least {}",
                arg, actual, needed
            ),
            KdaError::Shape {
                arg,
                expected,
                actual,
            } => write!(f, "`{=str}` is {}, expected {}", arg, actual, expected),
            KdaError::Config { field, reason } => {
                write!(f, "config `{=str}`: {=str}", field, reason)
            }
            KdaError::Offsets { reason } => write!(f, "cu_seqlens {=str}", reason),
            KdaError::Weights { arg, reason } => write!(f, "weight `{=str}`: {=str}", arg, reason),
            KdaError::Internal { what } => write!(f, "internal error: {=str}", what),
            KdaError::Overflow { what } => write!(f, "size of {=str} overflows usize", what),
        }
    }
}

impl Format for DecayGate {
    fn format(&self, f: Formatter<'_>) {
        match *self {
            DecayGate::Softplus => write!(f, "Softplus"),
            DecayGate::LowerBound(lb) => write!(f, "LowerBound({})", lb),
        }
    }
}

impl Format for GateProj {
    fn format(&self, f: Formatter<'_>) {
        match *self {
            GateProj::FullRank => write!(f, "FullRank"),
            GateProj::LowRank { rank } => write!(f, "LowRank {{ rank: {} }}", rank),
        }
    }
}

impl Format for KdaConfig {
    fn format(&self, f: Formatter<'_>) {
        write!(
            f,
            "KdaConfig {{ hidden: {}, heads: {}, head_dim: {}, conv_width: {}, decay_gate: {}, decay_proj: {}, output_gate: {}, rms_eps: {}, l2_eps: {}, scale: {} }}",
            self.hidden,
            self.heads,
            self.head_dim,
            self.conv_width,
            self.decay_gate,
            self.decay_proj,
            self.output_gate,
            self.rms_eps,
            self.l2_eps,
            self.scale,
        )
    }
}

impl Format for Mode {
    fn format(&self, f: Formatter<'_>) {
        match self {
            Mode::Auto => write!(f, "Auto"),
            Mode::Recurrent => write!(f, "Recurrent"),
            Mode::Chunked => write!(f, "Chunked"),
        }
    }
}

impl Format for Isa {
    fn format(&self, f: Formatter<'_>) {
        match self {
            Isa::Portable => write!(f, "Portable"),
            Isa::Avx2Fma => write!(f, "Avx2Fma"),
        }
    }
}

impl Format for InitialCaches {
    fn format(&self, f: Formatter<'_>) {
        match self {
            InitialCaches::Zero => write!(f, "Zero"),
            InitialCaches::Given => write!(f, "Given"),
        }
    }
}

impl Format for ForwardOptions {
    fn format(&self, f: Formatter<'_>) {
        write!(
            f,
            "ForwardOptions {{ mode: {}, chunk_size: {}, isa: {} }}",
            self.mode, self.chunk_size, self.isa
        )
    }
}

impl Format for QuantLen {
    fn format(&self, f: Formatter<'_>) {
        write!(
            f,
            "QuantLen {{ weights: {}, scales: {} }}",
            self.weights, self.scales
        )
    }
}
