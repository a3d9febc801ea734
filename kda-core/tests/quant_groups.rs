//! The group quantiser against compressed-tensors: tests/fixtures/quant/ct_groups.safetensors
//! holds f32 rows and, for eight int4 / int8 schemes (groups of 32 … 256, symmetric or with
//! zero points, f32 / bf16 / f16 scales), the tensors compressed-tensors 0.20.0 stores for
//! them (`calculate_qparams` + `PackedQuantizationCompressor.compress`; made by
//! tests/scripts/gen_ct_quant_fixtures.py). `quantize_groups` must give the same bytes, and
//! `Groups` must read them back.

mod common;

use common::Fixture;
use half::{bf16, f16};
use kda_core::quant::{
    quantize_groups, GroupFormat, GroupTensors, Groups, GroupsOut, Scales, ScalesMut,
};

const FIXTURE: &str = "quant/ct_groups.safetensors";

/// `(name, bits, group, symmetric, scale dtype)` from the metadata's JSON object.
fn schemes(fx: &Fixture) -> Vec<(String, u8, usize, bool, String)> {
    let s = fx.meta["schemes"].trim_matches(['{', '}']);
    s.split("], ")
        .map(|e| {
            let (name, rest) = e.split_once(": [").unwrap();
            let f: Vec<&str> = rest.trim_end_matches(']').split(", ").collect();
            (
                name.trim_matches('"').to_string(),
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2] == "true",
                f[3].trim_matches('"').to_string(),
            )
        })
        .collect()
}

#[test]
fn group_quantiser_equals_compressed_tensors_bit_for_bit() {
    let fx = Fixture::open(FIXTURE);
    let (shape, x) = &fx.f["input"];
    let (rows, cols) = (shape[0], shape[1]);
    let all = schemes(&fx);
    assert_eq!(all.len(), 8);
    for (name, bits, group, symmetric, dtype) in all {
        let format = GroupFormat { bits, group };
        let want = |k: &str| fx.u8.get(&format!("{name}.{k}")).map(|(_, b)| b.clone());
        let (want_packed, want_scale) = (want("packed").unwrap(), want("scale").unwrap());
        let want_zero = want("zero_point");
        assert_eq!(want_zero.is_none(), symmetric, "{name}");
        let n = rows * cols / group;
        let mut packed = vec![0u8; want_packed.len()];
        let mut zeros = want_zero.as_ref().map(|z| vec![0u8; z.len()]);
        let (mut sf, mut sb, mut sh) = (vec![0f32; n], vec![bf16::ZERO; n], vec![f16::ZERO; n]);
        let scales = match dtype.as_str() {
            "float32" => ScalesMut::F32(&mut sf),
            "bfloat16" => ScalesMut::Bf16(&mut sb),
            _ => ScalesMut::F16(&mut sh),
        };
        let out = GroupsOut {
            packed: &mut packed,
            scales,
            zeros: zeros.as_deref_mut(),
        };
        quantize_groups(x, (rows, cols), format, out).unwrap();
        let scale_bytes: Vec<u8> = match dtype.as_str() {
            "float32" => sf.iter().flat_map(|v| v.to_le_bytes()).collect(),
            "bfloat16" => sb.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
            _ => sh.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
        };
        assert!(scale_bytes == want_scale, "{name}: scales differ");
        if let (Some(z), Some(w)) = (&zeros, &want_zero) {
            let at = (0..z.len()).find(|&i| z[i] != w[i]);
            assert!(at.is_none(), "{name}: zero points differ at byte {at:?}");
        }
        if let Some(i) = (0..packed.len()).find(|&i| packed[i] != want_packed[i]) {
            let row = i / (packed.len() / rows);
            panic!(
                "{name}: packed byte {i} (row {row}) is {:#04x}, compressed-tensors {:#04x}",
                packed[i], want_packed[i]
            );
        }
        // And the reader takes the tensors back.
        let scales = match dtype.as_str() {
            "float32" => Scales::F32(&sf),
            "bfloat16" => Scales::Bf16(&sb),
            _ => Scales::F16(&sh),
        };
        let t = GroupTensors {
            packed: &packed,
            scales,
            zeros: zeros.as_deref(),
        };
        let g = Groups::new("ct", format, t, rows, cols).unwrap();
        let mut y = vec![0f32; cols];
        let (mut e, mut s) = (0f64, 0f64);
        // The error on the typical rows (normal and uniform weights: the first five).
        for r in 0..5 {
            g.dequantize_row(r, &mut y).unwrap();
            for (a, b) in y.iter().zip(&x[r * cols..]) {
                e += (*a as f64 - *b as f64).powi(2);
                s += (*b as f64).powi(2);
            }
        }
        println!(
            "{name}: round-trip rel-RMS {:.2e} (typical rows)",
            (e / s).sqrt()
        );
    }
}

fn out<'a>(p: &'a mut [u8], s: &'a mut [f32]) -> GroupsOut<'a> {
    GroupsOut {
        packed: p,
        scales: ScalesMut::F32(s),
        zeros: None,
    }
}

#[test]
fn refuses_bad_sizes_and_non_finite() {
    let f = GroupFormat { bits: 4, group: 32 };
    let x = vec![0.5f32; 64];
    let (mut p, mut s) = (vec![0u8; 32], vec![0f32; 2]);
    assert!(quantize_groups(&x, (1, 64), f, out(&mut p, &mut s)).is_ok());
    assert!(quantize_groups(&x, (1, 64), f, out(&mut p[..31], &mut s)).is_err());
    assert!(quantize_groups(&x, (1, 64), f, out(&mut p, &mut s[..1])).is_err());
    let g48 = GroupFormat { bits: 4, group: 48 };
    assert!(quantize_groups(&x, (1, 64), g48, out(&mut p, &mut s)).is_err());
    let b5 = GroupFormat { bits: 5, group: 32 };
    assert!(quantize_groups(&x, (1, 64), b5, out(&mut p, &mut s)).is_err());
    let mut bad = x.clone();
    bad[9] = f32::INFINITY;
    assert!(quantize_groups(&bad, (1, 64), f, out(&mut p, &mut s)).is_err());
}
