//! Owned caches for `N` sequences, in the core's layouts (see [`kda_core::cache`]).

use kda_core::{CachesMut, KdaConfig, KdaError};

use crate::error::{try_zeroed, HostError};

/// The recurrent and conv states of `N` sequences, owned.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceCaches {
    /// Number of sequences.
    pub sequences: usize,
    /// `[N, H, K, V]` f32, K-first.
    pub recurrent: Vec<f32>,
    /// `[N, H·K, W−1]` f32, oldest first.
    pub conv_q: Vec<f32>,
    /// `[N, H·K, W−1]`.
    pub conv_k: Vec<f32>,
    /// `[N, H·K, W−1]`.
    pub conv_v: Vec<f32>,
}

impl SequenceCaches {
    /// Zeroed caches for `sequences` sequences.
    pub fn new(cfg: &KdaConfig, sequences: usize) -> Result<Self, KdaError> {
        cfg.validate()?;
        let s = cfg.state_len()? * sequences;
        let c = cfg.conv_state_len()? * sequences;
        Ok(SequenceCaches {
            sequences,
            recurrent: vec![0.0; s],
            conv_q: vec![0.0; c],
            conv_k: vec![0.0; c],
            conv_v: vec![0.0; c],
        })
    }

    /// Zeroed caches for `sequences` sequences, or an error (instead of an abort) when they
    /// cannot be allocated. Use this when the sizes come from a file.
    pub fn try_new(cfg: &KdaConfig, sequences: usize) -> Result<Self, HostError> {
        cfg.validate()?;
        let s = sequences
            .checked_mul(cfg.state_len()?)
            .ok_or(KdaError::Overflow {
                what: "recurrent state",
            })?;
        let c = sequences
            .checked_mul(cfg.conv_state_len()?)
            .ok_or(KdaError::Overflow { what: "conv state" })?;
        Ok(SequenceCaches {
            sequences,
            recurrent: try_zeroed(s, "the recurrent state")?,
            conv_q: try_zeroed(c, "the q conv state")?,
            conv_k: try_zeroed(c, "the k conv state")?,
            conv_v: try_zeroed(c, "the v conv state")?,
        })
    }

    /// Mutable views for the core.
    pub fn as_mut(&mut self) -> CachesMut<'_> {
        CachesMut {
            recurrent: &mut self.recurrent,
            conv_q: &mut self.conv_q,
            conv_k: &mut self.conv_k,
            conv_v: &mut self.conv_v,
        }
    }

    /// Bytes held (all f32).
    pub fn bytes(&self) -> usize {
        4 * (self.recurrent.len() + self.conv_q.len() + self.conv_k.len() + self.conv_v.len())
    }

    /// Zeroes every sequence's caches.
    pub fn reset(&mut self) {
        self.as_mut().reset();
    }

    /// Sequence `n`'s caches alone, as a one-sequence cache.
    pub fn sequence(&self, n: usize) -> Result<Self, HostError> {
        if n >= self.sequences {
            return Err(HostError::Invalid(format!(
                "sequence {n} is past the cache's {} sequences",
                self.sequences
            )));
        }
        let part = |v: &Vec<f32>| {
            let len = v.len() / self.sequences;
            v[n * len..(n + 1) * len].to_vec()
        };
        Ok(SequenceCaches {
            sequences: 1,
            recurrent: part(&self.recurrent),
            conv_q: part(&self.conv_q),
            conv_k: part(&self.conv_k),
            conv_v: part(&self.conv_v),
        })
    }
}
