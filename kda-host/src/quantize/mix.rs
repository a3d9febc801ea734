//! Which GGUF type each KDA tensor gets: llama-quantize's choice (src/llama-quant.cpp of
//! llama.cpp 0c1e570, without an importance matrix), for the tensors of a KDA layer.
//!
//! * Not quantised, as in llama-quantize: the convs (`ssm_conv1d*`), `ssm_a` and `ssm_dt.bias`
//!   (not `…weight`), `ssm_norm.weight` (a norm, and 1-D). They are written F32, as the
//!   converter writes them.
//! * Every KDA matrix gets the type's base format (Q8_0, Q4_K, Q6_K), except with `q4_k_m`
//!   `attn_v.weight` (the KDA `v_proj`), which llama-quantize's `Q4_K_M` raises to Q6_K in the
//!   layers `use_more_bits` picks: the first and last eighth of the `attn_v` tensors and every
//!   third in between. It counts `attn_v` tensors through the file; in a Kimi Linear file
//!   those are exactly the KDA layers' (MLA layers hold `attn_k_b` / `attn_v_b`), so the count
//!   here is the layer's rank among the checkpoint's KDA layers (all of them, whether or not
//!   `--layers` writes them), assuming the file lists layers in order (the converter lists
//!   them in safetensors key order, `layers.10` before `layers.2`, so llama-quantize on a
//!   converter-made file of 10 or more layers counts differently). `attn_q`, `attn_k`,
//!   `attn_output` and the `ssm_*` matrices keep Q4_K (the `attn_output` bump is for models
//!   with exactly 8 experts; Kimi Linear has 256).
//! * A row (`ne[0]`) that is not a whole number of blocks falls back as llama-quantize does:
//!   Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, and to F16 when that does not fit either (a
//!   K-quant needs rows of 256: `ssm_f_b` / `ssm_g_b` with head dim 128 fall back).

use kda_core::quant::BlockFormat;

use crate::checkpoint::gguf::kimi_names::KdaTensor;
use crate::checkpoint::gguf::GgmlType;

/// The `--type` of `kda quantize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantType {
    /// Every matrix Q8_0.
    Q8_0,
    /// Every matrix Q4_K (llama-quantize `--pure Q4_K_M`).
    Q4K,
    /// Every matrix Q6_K.
    Q6K,
    /// llama-quantize's Q4_K_M mix: Q4_K, with Q6_K for some `attn_v`.
    Q4KM,
}

impl QuantType {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            QuantType::Q8_0 => "q8_0",
            QuantType::Q4K => "q4_k",
            QuantType::Q6K => "q6_k",
            QuantType::Q4KM => "q4_k_m",
        }
    }

    /// `general.file_type` (llama.cpp's `llama_ftype`): MOSTLY_Q8_0 7, MOSTLY_Q4_K_M 15 (also
    /// for the pure Q4_K, as `llama-quantize --pure Q4_K_M` writes), MOSTLY_Q6_K 18.
    pub fn file_type(self) -> u32 {
        match self {
            QuantType::Q8_0 => 7,
            QuantType::Q4K | QuantType::Q4KM => 15,
            QuantType::Q6K => 18,
        }
    }

    fn base(self) -> BlockFormat {
        match self {
            QuantType::Q8_0 => BlockFormat::Q8_0,
            QuantType::Q4K | QuantType::Q4KM => BlockFormat::Q4_K,
            QuantType::Q6K => BlockFormat::Q6_K,
        }
    }
}

/// A tensor's type in the output: a block format, or plain F16 / F32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutType {
    /// Quantised.
    Blocks(BlockFormat),
    /// F16 (a matrix whose rows fit no block format).
    F16,
    /// F32 (the vectors and convs).
    F32,
}

impl OutType {
    /// The GGUF type.
    pub fn ggml_type(self) -> GgmlType {
        match self {
            OutType::Blocks(f) => GgmlType::from_id(f.ggml_type()).unwrap_or(GgmlType::F32),
            OutType::F16 => GgmlType::F16,
            OutType::F32 => GgmlType::F32,
        }
    }

    /// Its name (`Q4_K`, `F16`, `F32`).
    pub fn name(self) -> &'static str {
        self.ggml_type().name()
    }
}

/// llama-quantize's `use_more_bits(i_layer, n_layers)`.
pub fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// Where a tensor sits, for the choice: which tensor, its row length (`ne[0]`), and for
/// `attn_v` the layer's rank among the model's `n_kda` KDA layers.
#[derive(Debug, Clone, Copy)]
pub struct Site {
    /// The tensor.
    pub tensor: KdaTensor,
    /// Its row length, `ne[0]`.
    pub ne0: usize,
    /// The layer's rank among the KDA layers (0-based).
    pub kda_rank: usize,
    /// The model's number of KDA layers.
    pub n_kda: usize,
}

/// The type llama-quantize gives the tensor at `site` for `qt`.
pub fn choose(qt: QuantType, site: Site) -> OutType {
    if !site.tensor.is_matrix() {
        return OutType::F32;
    }
    let mut f = qt.base();
    if qt == QuantType::Q4KM
        && site.tensor == KdaTensor::VProj
        && use_more_bits(site.kda_rank, site.n_kda)
    {
        f = BlockFormat::Q6_K;
    }
    fallback(f, site.ne0)
}

/// llama-quantize's `tensor_type_fallback`.
fn fallback(f: BlockFormat, ne0: usize) -> OutType {
    if ne0.is_multiple_of(f.block_elems()) {
        return OutType::Blocks(f);
    }
    let g = match f {
        BlockFormat::Q2_K | BlockFormat::Q3_K => BlockFormat::Q4_0,
        BlockFormat::Q4_K => BlockFormat::Q5_0,
        BlockFormat::Q5_K => BlockFormat::Q5_1,
        BlockFormat::Q6_K => BlockFormat::Q8_0,
        other => other,
    };
    if ne0.is_multiple_of(g.block_elems()) {
        OutType::Blocks(g)
    } else {
        OutType::F16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(tensor: KdaTensor, ne0: usize, kda_rank: usize, n_kda: usize) -> Site {
        Site {
            tensor,
            ne0,
            kda_rank,
            n_kda,
        }
    }

    #[test]
    fn q4_k_m_raises_attn_v_where_llama_quantize_does() {
        // Kimi Linear 48B: 27 layers, 20 KDA. n/8 = 2, 7n/8 = 17: ranks 0, 1, then 4, 7, 10,
        // 13, 16 (every third from 2), then 17, 18, 19.
        let raised: Vec<usize> = (0..20)
            .filter(|&r| {
                choose(QuantType::Q4KM, site(KdaTensor::VProj, 2304, r, 20))
                    == OutType::Blocks(BlockFormat::Q6_K)
            })
            .collect();
        assert_eq!(raised, [0, 1, 4, 7, 10, 13, 16, 17, 18, 19]);
        for t in [
            KdaTensor::QProj,
            KdaTensor::KProj,
            KdaTensor::OProj,
            KdaTensor::FA,
        ] {
            assert_eq!(
                choose(QuantType::Q4KM, site(t, 2304, 0, 20)),
                OutType::Blocks(BlockFormat::Q4_K)
            );
        }
        let pure = choose(QuantType::Q4K, site(KdaTensor::VProj, 2304, 0, 20));
        assert_eq!(pure, OutType::Blocks(BlockFormat::Q4_K));
    }

    #[test]
    fn vectors_stay_f32_and_short_rows_fall_back() {
        for t in [
            KdaTensor::QConv,
            KdaTensor::ALog,
            KdaTensor::DtBias,
            KdaTensor::ONorm,
        ] {
            assert_eq!(choose(QuantType::Q8_0, site(t, 4, 0, 1)), OutType::F32);
        }
        let fb = |qt, ne0| choose(qt, site(KdaTensor::FB, ne0, 0, 1));
        assert_eq!(fb(QuantType::Q4K, 128), OutType::Blocks(BlockFormat::Q5_0));
        assert_eq!(fb(QuantType::Q6K, 128), OutType::Blocks(BlockFormat::Q8_0));
        assert_eq!(fb(QuantType::Q8_0, 128), OutType::Blocks(BlockFormat::Q8_0));
        assert_eq!(fb(QuantType::Q4K, 48), OutType::F16);
        assert_eq!(fb(QuantType::Q8_0, 40), OutType::F16);
        assert_eq!(fb(QuantType::Q4K, 512), OutType::Blocks(BlockFormat::Q4_K));
    }
}
