//! [`KdaLayer`] itself: the configuration, weights and options it was validated with, and
//! the instruction set it runs. What a call does with it is in `mod.rs`.

use crate::config::KdaConfig;
use crate::error::KdaError;
use crate::simd::Isa;
use crate::weights::KdaWeights;

use super::options::{ForwardOptions, Mode, Precision};

/// The bf16 mode's requirement: every projection's matrix bf16 in the panel layout.
fn check_bf16_panels(w: &KdaWeights<'_>) -> Result<(), KdaError> {
    fn gate<'w>(g: crate::weights::GateWeights<'w>) -> [Option<crate::MatRef<'w>>; 2] {
        match g {
            crate::weights::GateWeights::FullRank(m) => [Some(m), None],
            crate::weights::GateWeights::LowRank { down, up } => [Some(down), Some(up)],
        }
    }
    let fixed = [w.q_proj, w.k_proj, w.v_proj, w.b_proj, w.o_proj].map(Some);
    let all = fixed
        .into_iter()
        .chain(gate(w.decay_proj))
        .chain(gate(w.output_gate));
    let ok = |m: &crate::MatRef<'_>| m.is_panels() && matches!(m.data(), crate::Data::Bf16(_));
    if all.flatten().all(|m| ok(&m)) {
        Ok(())
    } else {
        Err(KdaError::Config {
            field: "precision",
            reason: "bf16 precision needs every projection as bf16 weights in the panel layout \
                     (MatRef::new_panels; kda-host: Model::repack_panels)",
        })
    }
}

/// A KDA layer with its weights, validated once: config, weight shapes and forms, options and
/// the instruction set to run.
#[derive(Debug, Clone, Copy)]
pub struct KdaLayer<'w> {
    pub(super) cfg: KdaConfig,
    pub(super) weights: KdaWeights<'w>,
    pub(super) opts: ForwardOptions,
    pub(super) isa: Isa,
    pub(super) state_len: usize,
    pub(super) conv_state_len: usize,
}

impl<'w> KdaLayer<'w> {
    /// Checks `cfg`, `weights` against it, and `opts` (chunk size; the ISA, which `None` picks
    /// as the fastest this CPU supports).
    pub fn new(
        cfg: &KdaConfig,
        weights: KdaWeights<'w>,
        opts: ForwardOptions,
    ) -> Result<Self, KdaError> {
        weights.validate(cfg)?;
        let isa = opts.validate()?;
        if opts.precision == Precision::Bf16 {
            check_bf16_panels(&weights)?;
        }
        Ok(KdaLayer {
            cfg: *cfg,
            weights,
            opts,
            isa,
            state_len: cfg.state_len()?,
            conv_state_len: cfg.conv_state_len()?,
        })
    }

    /// The layer's configuration.
    pub fn config(&self) -> &KdaConfig {
        &self.cfg
    }

    /// The layer's weights.
    pub fn weights(&self) -> &KdaWeights<'w> {
        &self.weights
    }

    /// The layer's options (the ISA as asked for; [`Self::isa`] is the one that runs).
    pub fn options(&self) -> &ForwardOptions {
        &self.opts
    }

    /// The instruction set the kernels run.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The same layer with another mode (the rest stays validated).
    pub fn with_mode(self, mode: Mode) -> Self {
        KdaLayer {
            opts: self.opts.with_mode(mode),
            ..self
        }
    }
}
