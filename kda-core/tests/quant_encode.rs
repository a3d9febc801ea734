//! The GGUF block encoders against ggml's reference quantisers: tests/fixtures/quant/
//! ggml_blocks.safetensors holds f32 rows (typical weights and edge cases), the bytes ggml's
//! `quantize_row_*_ref` makes of them (and gguf-py's, where it quantises: the same bytes), and
//! the RMS error of those bytes dequantised by gguf-py. Made by tests/scripts/
//! gen_quant_fixtures.py. Run with `--nocapture` for the error table.

mod common;

use common::Fixture;
use kda_core::quant::BlockFormat;

const FIXTURE: &str = "quant/ggml_blocks.safetensors";

fn key(f: BlockFormat) -> String {
    f.name().to_ascii_lowercase()
}

/// The row names, from the metadata's JSON list of strings.
fn row_names(fx: &Fixture) -> Vec<String> {
    let list = fx.meta["rows"].trim_matches(['[', ']']);
    list.split("\", \"")
        .map(|s| s.trim_matches('"').to_string())
        .collect()
}

fn rms_error(got: &[f32], want: &[f32]) -> f64 {
    let s: f64 = got
        .iter()
        .zip(want)
        .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
        .sum();
    (s / want.len() as f64).sqrt()
}

#[test]
fn encoders_equal_ggml_bit_for_bit() {
    let fx = Fixture::open(FIXTURE);
    let names = row_names(&fx);
    let (shape, x) = &fx.f["input"];
    let (rows, cols) = (shape[0], shape[1]);
    assert_eq!(names.len(), rows);
    for f in BlockFormat::ALL {
        let (qshape, want) = &fx.u8[&key(f)];
        let row_bytes = f.bytes_for(cols).unwrap();
        assert_eq!(qshape, &[rows, row_bytes], "{}", f.name());
        let mut got = vec![0u8; row_bytes];
        for r in 0..rows {
            f.quantize_row(&x[r * cols..(r + 1) * cols], &mut got)
                .unwrap();
            let w = &want[r * row_bytes..(r + 1) * row_bytes];
            if let Some(i) = (0..row_bytes).find(|&i| got[i] != w[i]) {
                panic!(
                    "{} row {r} ({}): byte {i} (block {}, offset {}) is {:#04x}, ggml wrote {:#04x}",
                    f.name(),
                    names[r],
                    i / f.block_bytes(),
                    i % f.block_bytes(),
                    got[i],
                    w[i]
                );
            }
        }
    }
}

/// decode(encode(x)) has the error gguf-py's dequantisation of ggml's bytes has (the same
/// bytes, so this checks the decoders too); prints the error relative to each row's RMS.
#[test]
fn round_trip_error_matches_the_reference() {
    let fx = Fixture::open(FIXTURE);
    let names = row_names(&fx);
    let (shape, x) = &fx.f["input"];
    let (rows, cols) = (shape[0], shape[1]);
    println!(
        "{:<28} {}",
        "row (rel-RMS error)",
        BlockFormat::ALL
            .map(|f| format!("{:>8}", f.name()))
            .join("")
    );
    let mut table = vec![String::new(); rows];
    for f in BlockFormat::ALL {
        let want_err = &fx.f64[&format!("{}.err", key(f))];
        let mut q = vec![0u8; f.bytes_for(cols).unwrap()];
        let mut y = vec![0.0f32; cols];
        for r in 0..rows {
            let xr = &x[r * cols..(r + 1) * cols];
            f.quantize_row(xr, &mut q).unwrap();
            f.dequantize_row(&q, &mut y).unwrap();
            let err = rms_error(&y, xr);
            let want = want_err[r];
            let tol = 1e-9 * want.max(f64::MIN_POSITIVE);
            assert!(
                (err - want).abs() <= tol || err == want,
                "{} row {r} ({}): error {err:e}, reference {want:e}",
                f.name(),
                names[r]
            );
            let rms = rms_error(xr, &vec![0.0; cols]);
            table[r] += &format!("{:>8.1e}", if rms > 0.0 { err / rms } else { err });
        }
    }
    for (n, t) in names.iter().zip(table) {
        println!("{n:<28} {t}");
    }
}
