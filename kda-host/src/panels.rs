//! Repacking a layer's bf16 matrices into the core's panel layout
//! ([`kda_core::MatRef::new_panels`]): 16-row groups stored column by column, the layout the
//! CPU projection kernels stream best (decode reads 16 outputs' weights for one input in one
//! load; prefill needs no per-call packing). Results are bitwise the same as row-major.

use kda_core::{bf16, pack_panels, panels_len, Data, GateWeights, KdaError, KdaWeights, MatRef};

use crate::error::HostError;

/// Panel-layout copies of a layer's row-major bf16 matrices (f32, int8 and already-packed
/// matrices are left as they are). Costs one more copy of those matrices in memory; memory-
/// mapped originals can then be dropped by the OS.
#[derive(Debug, Clone, Default)]
pub struct Panels {
    mats: Vec<Option<Vec<bf16>>>,
}

/// Every matrix of `w`, in a fixed order.
fn mats_mut<'w, 'a>(w: &'w mut KdaWeights<'a>) -> Vec<&'w mut MatRef<'a>> {
    let mut v = vec![
        &mut w.q_proj,
        &mut w.k_proj,
        &mut w.v_proj,
        &mut w.b_proj,
        &mut w.o_proj,
    ];
    for g in [&mut w.decay_proj, &mut w.output_gate] {
        match g {
            GateWeights::FullRank(m) => v.push(m),
            GateWeights::LowRank { down, up } => {
                v.push(down);
                v.push(up);
            }
        }
    }
    v
}

impl Panels {
    /// Repacks every row-major bf16 matrix of `w`.
    pub fn new(w: &KdaWeights<'_>) -> Result<Self, HostError> {
        let mut w = *w;
        let mut mats = Vec::new();
        for m in mats_mut(&mut w) {
            let packed = match m.data() {
                Data::Bf16(_) if !m.is_panels() => {
                    let n = panels_len(m.rows(), m.cols()).ok_or(KdaError::Overflow {
                        what: "panel-layout weights",
                    })?;
                    let mut v = crate::error::try_zeroed::<bf16>(n, "panel-layout weights")?;
                    pack_panels(m, &mut v)?;
                    Some(v)
                }
                _ => None,
            };
            mats.push(packed);
        }
        Ok(Panels { mats })
    }

    /// `w` with its matrices swapped for the panel-layout copies (`w` must be the weights this
    /// was made from).
    pub fn weights<'a>(&'a self, w: &KdaWeights<'a>) -> Result<KdaWeights<'a>, HostError> {
        let mut out = *w;
        let slots = mats_mut(&mut out);
        if slots.len() != self.mats.len() {
            return Err(HostError::Core(KdaError::Weights {
                arg: "panels",
                reason: "made from weights of another shape",
            }));
        }
        for (m, p) in slots.into_iter().zip(&self.mats) {
            if let Some(p) = p {
                *m = MatRef::new_panels("panel-layout matrix", Data::Bf16(p), m.rows(), m.cols())?;
            }
        }
        Ok(out)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.mats.iter().flatten().map(|v| 2 * v.len()).sum()
    }
}
