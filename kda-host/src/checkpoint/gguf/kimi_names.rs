//! The KDA tensors of llama.cpp's `kimi-linear` GGUF files: names, shapes, and the transforms
//! its converter applies, in one table for both directions (HF checkpoint → GGUF, GGUF → HF).
//!
//! From llama.cpp 0c1e570 (the llama-cpp-python 0.3.36 sdist): `conversion/kimi_linear.py`
//! (the converter's transforms), `gguf-py/gguf/constants.py` and `tensor_mapping.py` (the
//! names), `src/models/kimi-linear.cpp` (the shapes the loader asks for), and the fixture
//! `tests/fixtures/gguf/kimi-linear-tiny-q8_0.gguf`, which the converter made.
//!
//! | HF (`model.layers.{i}.self_attn.`) | GGUF (`blk.{i}.`) | GGUF `ne` (`ne[0]` contiguous) | transform |
//! |---|---|---|---|
//! | `q_proj.weight`, `k_proj.weight`, `v_proj.weight` | `attn_q.weight`, `attn_k.weight`, `attn_v.weight` | `[D, P]` | — |
//! | `q_conv1d.weight`, … `[P, 1, W]` | `ssm_conv1d_q.weight`, … | `[W, 1, P, 1]` | reshape |
//! | `A_log` `[1, 1, H, 1]` | `ssm_a` | `[1, H, 1, 1]` | `−exp(A_log)` |
//! | `dt_bias` `[P]` | `ssm_dt.bias` | `[P]` | — |
//! | `f_a_proj.weight`, `f_b_proj.weight` | `ssm_f_a.weight`, `ssm_f_b.weight` | `[D, K]`, `[K, P]` | — |
//! | `b_proj.weight` | `ssm_beta.weight` | `[D, H]` | — |
//! | `g_a_proj.weight`, `g_b_proj.weight` | `ssm_g_a.weight`, `ssm_g_b.weight` | `[D, r]`, `[r, P]` | — |
//! | `o_norm.weight` | `ssm_norm.weight` | `[K]` | — |
//! | `o_proj.weight` | `attn_output.weight` | `[P, D]` | — |
//!
//! (`D` hidden, `H` heads, `K` head dim, `P = H·K`, `W` conv width, `r` a low rank.) The
//! converter writes the convs, `ssm_a`, `ssm_dt.bias` and `ssm_norm.weight` as F32, the
//! matrices in the output type. Which layers are KDA: `kimi-linear.attention.head_count_kv`,
//! an array with 0 for a KDA layer (MLA layers carry 1, the converter's MQA form).

/// `general.architecture` of Kimi Linear files.
pub const ARCH: &str = "kimi-linear";

/// One KDA tensor of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KdaTensor {
    /// `q_proj.weight`.
    QProj,
    /// `k_proj.weight`.
    KProj,
    /// `v_proj.weight`.
    VProj,
    /// `q_conv1d.weight`.
    QConv,
    /// `k_conv1d.weight`.
    KConv,
    /// `v_conv1d.weight`.
    VConv,
    /// `A_log` (stored as `ssm_a = −exp(A_log)`).
    ALog,
    /// `dt_bias`.
    DtBias,
    /// `f_a_proj.weight`.
    FA,
    /// `f_b_proj.weight`.
    FB,
    /// `b_proj.weight`.
    Beta,
    /// `g_a_proj.weight`.
    GA,
    /// `g_b_proj.weight`.
    GB,
    /// `o_norm.weight`.
    ONorm,
    /// `o_proj.weight`.
    OProj,
}

/// What the converter does to a tensor's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transform {
    /// Stored as is (a reshape at most).
    None,
    /// `ssm_a = −exp(A_log)`; [`ssm_a_from_a_log`] and [`a_log_from_ssm_a`].
    NegExp,
}

impl KdaTensor {
    /// Every KDA tensor of a Kimi Linear layer (low-rank output gate), in the order written.
    pub const ALL: [KdaTensor; 15] = [
        KdaTensor::QProj,
        KdaTensor::KProj,
        KdaTensor::VProj,
        KdaTensor::QConv,
        KdaTensor::KConv,
        KdaTensor::VConv,
        KdaTensor::ALog,
        KdaTensor::DtBias,
        KdaTensor::FA,
        KdaTensor::FB,
        KdaTensor::Beta,
        KdaTensor::GA,
        KdaTensor::GB,
        KdaTensor::ONorm,
        KdaTensor::OProj,
    ];

    /// The name after `model.layers.{i}.self_attn.` in the HF checkpoint.
    pub fn hf_suffix(self) -> &'static str {
        self.names().0
    }

    /// The name after `blk.{i}.` in the GGUF file.
    pub fn gguf_suffix(self) -> &'static str {
        self.names().1
    }

    fn names(self) -> (&'static str, &'static str) {
        match self {
            KdaTensor::QProj => ("q_proj.weight", "attn_q.weight"),
            KdaTensor::KProj => ("k_proj.weight", "attn_k.weight"),
            KdaTensor::VProj => ("v_proj.weight", "attn_v.weight"),
            KdaTensor::QConv => ("q_conv1d.weight", "ssm_conv1d_q.weight"),
            KdaTensor::KConv => ("k_conv1d.weight", "ssm_conv1d_k.weight"),
            KdaTensor::VConv => ("v_conv1d.weight", "ssm_conv1d_v.weight"),
            KdaTensor::ALog => ("A_log", "ssm_a"),
            KdaTensor::DtBias => ("dt_bias", "ssm_dt.bias"),
            KdaTensor::FA => ("f_a_proj.weight", "ssm_f_a.weight"),
            KdaTensor::FB => ("f_b_proj.weight", "ssm_f_b.weight"),
            KdaTensor::Beta => ("b_proj.weight", "ssm_beta.weight"),
            KdaTensor::GA => ("g_a_proj.weight", "ssm_g_a.weight"),
            KdaTensor::GB => ("g_b_proj.weight", "ssm_g_b.weight"),
            KdaTensor::ONorm => ("o_norm.weight", "ssm_norm.weight"),
            KdaTensor::OProj => ("o_proj.weight", "attn_output.weight"),
        }
    }

    /// The GGUF name in model layer `layer` (0-based): `blk.{layer}.attn_q.weight`.
    pub fn gguf_name(self, layer: usize) -> String {
        format!("blk.{layer}.{}", self.gguf_suffix())
    }

    /// The tensor and layer a GGUF name stands for, if it is a KDA tensor.
    pub fn from_gguf_name(name: &str) -> Option<(usize, KdaTensor)> {
        let rest = name.strip_prefix("blk.")?;
        let (layer, suffix) = rest.split_once('.')?;
        if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let t = Self::ALL.into_iter().find(|t| t.gguf_suffix() == suffix)?;
        Some((layer.parse().ok()?, t))
    }

    /// The converter's transform of the values.
    pub fn transform(self) -> Transform {
        match self {
            KdaTensor::ALog => Transform::NegExp,
            _ => Transform::None,
        }
    }

    /// True for the matrices (`[rows, cols]` weights a GGUF file may hold quantised); the
    /// convs, `ssm_a`, `ssm_dt.bias` and `ssm_norm.weight` stay F32.
    pub fn is_matrix(self) -> bool {
        !matches!(
            self,
            KdaTensor::QConv
                | KdaTensor::KConv
                | KdaTensor::VConv
                | KdaTensor::ALog
                | KdaTensor::DtBias
                | KdaTensor::ONorm
        )
    }

    /// The GGUF dimensions (`ne`, contiguous first) of a tensor whose HF form holds `rows` ×
    /// `cols` values (a vector: `rows` 1) in a layer with `heads` heads: matrices `[cols,
    /// rows]`, convs `[W, 1, P, 1]`, `ssm_a` `[1, H, 1, 1]`, vectors `[n]`.
    pub fn gguf_ne(self, rows: usize, cols: usize, heads: usize) -> Vec<u64> {
        let n = (rows * cols) as u64;
        match self {
            KdaTensor::QConv | KdaTensor::KConv | KdaTensor::VConv => {
                vec![cols as u64, 1, rows as u64, 1]
            }
            KdaTensor::ALog => vec![1, heads as u64, 1, 1],
            KdaTensor::DtBias | KdaTensor::ONorm => vec![n],
            _ => vec![cols as u64, rows as u64],
        }
    }
}

/// `ssm_a` from `A_log`: `−exp(A_log)`, in f64 and rounded once to f32. (The converter computes
/// it in f32 with torch's `exp`, which may differ by an ulp.)
pub fn ssm_a_from_a_log(a_log: f32) -> f32 {
    -(a_log as f64).exp() as f32
}

/// `A_log` from `ssm_a`: `ln(−ssm_a)`, in f64 and rounded once to f32 (NaN for `ssm_a ≥ 0`).
pub fn a_log_from_ssm_a(ssm_a: f32) -> f32 {
    (-(ssm_a as f64)).ln() as f32
}

/// A key of the architecture: `kimi-linear.{suffix}`.
pub fn arch_key(suffix: &str) -> String {
    format!("{ARCH}.{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_match_the_fixture() {
        for t in KdaTensor::ALL {
            assert_eq!(KdaTensor::from_gguf_name(&t.gguf_name(12)), Some((12, t)));
        }
        assert_eq!(KdaTensor::from_gguf_name("blk.x.attn_q.weight"), None);
        assert_eq!(
            KdaTensor::from_gguf_name("blk.0.attn_kv_a_mqa.weight"),
            None
        );
        assert_eq!(KdaTensor::from_gguf_name("output.weight"), None);
        // Every KDA tensor of the converter-made fixture is in the table, with its shape.
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/gguf/kimi-linear-tiny-q8_0.gguf"
        );
        let f = super::super::GgufFile::open(std::path::Path::new(path)).unwrap();
        let mut seen = 0;
        for info in f.tensors() {
            if let Some((0, t)) = KdaTensor::from_gguf_name(&info.name) {
                let (h, k, p, d, w) = (2, 32, 64, 256, 4);
                let (rows, cols) = match t {
                    KdaTensor::QProj | KdaTensor::KProj | KdaTensor::VProj => (p, d),
                    KdaTensor::QConv | KdaTensor::KConv | KdaTensor::VConv => (p, w),
                    KdaTensor::ALog => (1, h),
                    KdaTensor::DtBias => (1, p),
                    KdaTensor::FA | KdaTensor::GA => (k, d),
                    KdaTensor::FB | KdaTensor::GB => (p, k),
                    KdaTensor::Beta => (h, d),
                    KdaTensor::ONorm => (1, k),
                    KdaTensor::OProj => (d, p),
                };
                assert_eq!(
                    info.ne(),
                    t.gguf_ne(rows, cols, h).as_slice(),
                    "{}",
                    info.name
                );
                seen += 1;
            }
        }
        assert_eq!(seen, KdaTensor::ALL.len());
    }

    #[test]
    fn a_log_transform_inverts() {
        for a in [-3.0f32, 0.0, 0.5, 2.7] {
            let back = a_log_from_ssm_a(ssm_a_from_a_log(a));
            assert!((back - a).abs() <= 1e-6 * a.abs().max(1.0), "{a} {back}");
        }
    }
}
