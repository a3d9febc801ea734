//! One-line descriptions of a weight matrix's storage format and its stored size, for `kda
//! inspect` and `kda bench`.

use kda_core::quant::Scales;
use kda_core::{Data, GateWeights, KdaWeights, MatRef};

/// The storage format of `d`: `bf16`, `f32`, `f16`, `int8 per-row f32-scales`, a GGUF block
/// type (`Q8_0`, `Q4_K`, …), or compressed-tensors groups (`int4 g32 sym bf16-scales`,
/// `int8 g128 asym f32-scales`; `gN` is the group size, the whole row for the channel
/// strategy).
pub fn format_label(d: &Data<'_>) -> String {
    match d {
        Data::F32(_) => "f32".into(),
        Data::Bf16(_) => "bf16".into(),
        Data::F16(_) => "f16".into(),
        Data::I8 { .. } => "int8 per-row f32-scales".into(),
        Data::Blocks(b) => b.format().name().into(),
        Data::Groups(g) => {
            let m = g.matrix();
            let f = m.format();
            let scales = match m.scales() {
                Scales::F32(_) => "f32",
                Scales::Bf16(_) => "bf16",
                Scales::F16(_) => "f16",
            };
            let sym = if m.has_zeros() { "asym" } else { "sym" };
            format!("int{} g{} {sym} {scales}-scales", f.bits, f.group)
        }
    }
}

/// Stored bits per weight of `d`, scales and zero points included.
pub fn bits_per_weight(d: &Data<'_>) -> f64 {
    match d {
        Data::F32(_) => 32.0,
        Data::Bf16(_) | Data::F16(_) => 16.0,
        Data::Blocks(b) => f64::from(b.format().bits_per_weight()),
        Data::Groups(g) => {
            let m = g.matrix();
            (8 * m.stored_bytes()) as f64 / (m.rows() * m.cols()).max(1) as f64
        }
        Data::I8 { .. } => (8 * stored_bytes(d)) as f64 / d.len().max(1) as f64,
    }
}

/// Stored bytes of `d`, scales and zero points included (a group view: its whole matrix).
pub fn stored_bytes(d: &Data<'_>) -> usize {
    match d {
        Data::F32(v) => 4 * v.len(),
        Data::Bf16(v) => 2 * v.len(),
        Data::F16(v) => 2 * v.len(),
        Data::I8 { data, scales } => data.len() + 4 * scales.len(),
        Data::Blocks(b) => b.bytes().len(),
        Data::Groups(g) => g.matrix().stored_bytes(),
    }
}

/// The matrices of a layer's weights by name, in checkpoint order: q, k, v, the decay gate's
/// (`f_proj`, or `f_a_proj` and `f_b_proj`), the output gate's (`g_…`), `b_proj`, `o_proj`.
pub fn named_matrices<'a>(w: &KdaWeights<'a>) -> Vec<(&'static str, MatRef<'a>)> {
    let mut mats = vec![
        ("q_proj", w.q_proj),
        ("k_proj", w.k_proj),
        ("v_proj", w.v_proj),
    ];
    for (g, names) in [
        (&w.decay_proj, ["f_proj", "f_a_proj", "f_b_proj"]),
        (&w.output_gate, ["g_proj", "g_a_proj", "g_b_proj"]),
    ] {
        match g {
            GateWeights::FullRank(m) => mats.push((names[0], *m)),
            GateWeights::LowRank { down, up } => {
                mats.push((names[1], *down));
                mats.push((names[2], *up));
            }
        }
    }
    mats.push(("b_proj", w.b_proj));
    mats.push(("o_proj", w.o_proj));
    mats
}

#[cfg(test)]
mod tests {
    use super::*;
    use kda_core::quant::{GroupFormat, GroupTensors, Groups};

    #[test]
    fn labels_and_bits() {
        let packed = [0u8; 4 * 2 * 2];
        let scales = [half::bf16::ONE; 2 * 2];
        let t = GroupTensors {
            packed: &packed,
            scales: Scales::Bf16(&scales),
            zeros: None,
        };
        let f = GroupFormat { bits: 4, group: 8 };
        let g = Groups::new("t", f, t, 2, 16).unwrap();
        let d = Data::Groups(g.all_rows());
        assert_eq!(format_label(&d), "int4 g8 sym bf16-scales");
        // 4 bits a weight + one bf16 scale per 8 weights.
        assert_eq!(bits_per_weight(&d), 6.0);
        assert_eq!(format_label(&Data::Bf16(&[])), "bf16");
    }
}
