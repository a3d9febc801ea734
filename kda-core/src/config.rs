//! Layer configuration: dimensions, gate forms, epsilons, and the sizes every buffer must have.

use crate::error::{add, mul, KdaError};

/// How the per-channel log-decay `g ≤ 0` is computed from the raw decay projection `f`
/// (spec §3.4). `x = f + dt_bias`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum DecayGate {
    /// Kimi Linear: `g = −exp(A_log[h]) · softplus(x)` (softplus threshold 20, as torch).
    /// Unbounded below. Requires `A_log`.
    Softplus,
    /// Kimi K3: `g = lb · sigmoid(exp(A_log[h]) · x)`, in `(lb, 0)`; without `A_log`,
    /// `g = lb · sigmoid(x)`. The bound must be finite and negative (K3 uses −5).
    LowerBound(f32),
}

/// Shape of a gate projection from `hidden` to `heads · head_dim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum GateProj {
    /// One matrix `[heads·head_dim, hidden]` (Kimi K3's output gate `g_proj`).
    FullRank,
    /// Two matrices: down `[rank, hidden]` then up `[heads·head_dim, rank]`
    /// (Kimi Linear's `g_a_proj`/`g_b_proj` and every decay gate `f_a_proj`/`f_b_proj`).
    LowRank {
        /// Bottleneck width (`head_dim` in every Kimi model).
        rank: usize,
    },
}

impl GateProj {
    /// Width of the bottleneck (0 for a full-rank projection).
    pub fn rank(self) -> usize {
        match self {
            GateProj::FullRank => 0,
            GateProj::LowRank { rank } => rank,
        }
    }
}

/// Everything that fixes the shapes and the math of one KDA layer.
///
/// Key and value head dims are equal (`K = V = head_dim`), and every value head has its own
/// q/k head (no GVA), as in all Kimi models.
#[derive(Debug, Clone, Copy, PartialEq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct KdaConfig {
    /// Model width (rows of the input and the output).
    pub hidden: usize,
    /// Number of KDA heads `H`.
    pub heads: usize,
    /// Head dim `K` (= `V`).
    pub head_dim: usize,
    /// Short-conv width `W ≥ 1` (4 in every Kimi model).
    pub conv_width: usize,
    /// Decay-gate activation.
    pub decay_gate: DecayGate,
    /// Shape of the decay projection (`f_a_proj`/`f_b_proj`, or one `f_proj`).
    pub decay_proj: GateProj,
    /// Shape of the output-gate projection (`g_a_proj`/`g_b_proj`, or one `g_proj`).
    pub output_gate: GateProj,
    /// Epsilon of the gated RMSNorm, added to the mean of squares (Kimi: 1e-5).
    pub rms_eps: f32,
    /// Epsilon of the q/k L2 norm, added to the sum of squares inside the sqrt (1e-6).
    pub l2_eps: f32,
    /// Query scale; `None` means `head_dim^-0.5`.
    pub scale: Option<f32>,
}

impl KdaConfig {
    /// A Kimi Linear layer (softplus decay gate, low-rank output gate, W = 4, eps 1e-5).
    pub fn kimi_linear(hidden: usize, heads: usize, head_dim: usize) -> Self {
        KdaConfig {
            hidden,
            heads,
            head_dim,
            conv_width: 4,
            decay_gate: DecayGate::Softplus,
            decay_proj: GateProj::LowRank { rank: head_dim },
            output_gate: GateProj::LowRank { rank: head_dim },
            rms_eps: 1e-5,
            l2_eps: 1e-6,
            scale: None,
        }
    }

    /// A Kimi K3 layer (lower-bound −5 decay gate, full-rank output gate, W = 4, eps 1e-5).
    pub fn kimi_k3(hidden: usize, heads: usize, head_dim: usize) -> Self {
        KdaConfig {
            decay_gate: DecayGate::LowerBound(-5.0),
            output_gate: GateProj::FullRank,
            ..Self::kimi_linear(hidden, heads, head_dim)
        }
    }

    /// Checks every field; returns the first problem found.
    pub fn validate(&self) -> Result<(), KdaError> {
        let cfg = |field, reason| Err(KdaError::Config { field, reason });
        if self.hidden == 0 {
            return cfg("hidden", "must be at least 1");
        }
        if self.heads == 0 {
            return cfg("heads", "must be at least 1");
        }
        if self.head_dim == 0 {
            return cfg("head_dim", "must be at least 1");
        }
        if self.conv_width == 0 {
            return cfg("conv_width", "must be at least 1");
        }
        if let DecayGate::LowerBound(lb) = self.decay_gate {
            if !(lb.is_finite() && lb < 0.0) {
                return cfg("decay_gate", "lower bound must be finite and negative");
            }
        }
        if self.decay_proj == (GateProj::LowRank { rank: 0 }) {
            return cfg("decay_proj", "low-rank projection needs rank at least 1");
        }
        if self.output_gate == (GateProj::LowRank { rank: 0 }) {
            return cfg("output_gate", "low-rank projection needs rank at least 1");
        }
        if !(self.rms_eps.is_finite() && self.rms_eps >= 0.0) {
            return cfg("rms_eps", "must be finite and non-negative");
        }
        if !(self.l2_eps.is_finite() && self.l2_eps >= 0.0) {
            return cfg("l2_eps", "must be finite and non-negative");
        }
        if let Some(s) = self.scale {
            if !s.is_finite() {
                return cfg("scale", "must be finite");
            }
        }
        // Every size the layer will compute must fit in usize.
        self.state_len()?;
        self.conv_state_len()?;
        self.token_workspace_len()?;
        mul("o_proj.weight", self.hidden, self.proj_dim_checked()?)?;
        Ok(())
    }

    /// `heads · head_dim`: width of the q, k, v, gate and pre-output rows.
    pub fn proj_dim(&self) -> usize {
        self.heads.saturating_mul(self.head_dim)
    }

    /// f32 elements of one token's intermediates in a layer's workspace: q, k, v, decay, output
    /// gate (`H·K` each), beta (`H`) and the low-rank bottlenecks.
    pub(crate) fn token_workspace_len(&self) -> Result<usize, KdaError> {
        let d = self.proj_dim_checked()?;
        let w = add("workspace", mul("workspace", 5, d)?, self.heads)?;
        let ranks = add("workspace", self.decay_proj.rank(), self.output_gate.rank())?;
        add("workspace", w, ranks)
    }

    pub(crate) fn proj_dim_checked(&self) -> Result<usize, KdaError> {
        mul("heads * head_dim", self.heads, self.head_dim)
    }

    /// The query scale actually used.
    pub fn scale(&self) -> f32 {
        match self.scale {
            Some(s) => s,
            None => 1.0 / libm::sqrtf(self.head_dim as f32),
        }
    }

    /// f32 elements of one sequence's recurrent state, `[H, K, V]`.
    pub fn state_len(&self) -> Result<usize, KdaError> {
        let kv = mul("recurrent state", self.head_dim, self.head_dim)?;
        mul("recurrent state", self.heads, kv)
    }

    /// f32 elements of one sequence's conv state for one of q, k, v: `[H·K, W−1]`.
    pub fn conv_state_len(&self) -> Result<usize, KdaError> {
        mul(
            "conv state",
            self.proj_dim_checked()?,
            self.conv_width.saturating_sub(1),
        )
    }

    /// f32 elements of the whole cache of one sequence (recurrent + three conv states).
    pub fn cache_len(&self) -> Result<usize, KdaError> {
        let conv = mul("cache", self.conv_state_len()?, 3)?;
        add("cache", self.state_len()?, conv)
    }
}
