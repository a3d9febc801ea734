//! Workload for counting executed instructions under QEMU (`tests/scripts/count_insns.sh`,
//! issue 16): runs `N` units of one kernel on one thread, with the kernel path chosen by name.
//!
//! ```text
//! insn_probe ISA decode N          N decode steps of one Kimi Linear KDA layer (hidden 2304,
//!                                  32 heads × 128, bf16 weights at the scales of `kda bench`,
//!                                  in the panel layout `kda` uses by default), one sequence,
//!                                  recurrent state carried from step to step
//! insn_probe ISA decode-rows N     the same with the weights row-major (`--layout rows`)
//! insn_probe ISA prefill N [C]     the chunked recurrence core of one head (K = V = 128) over
//!                                  N ≤ 8 chunks of C tokens (default: the layer's default
//!                                  chunk); the inputs are always drawn for 8 chunks
//! ```
//! `ISA` is `portable`, `best` (the fastest this CPU supports), or any supported path's name
//! as `kda_core::Isa` spells it, case-insensitive (`avx2fma`, …).
//!
//! The counting script runs it for two values of `N` and divides the difference of the counts
//! by the difference of the `N`s, so weight and input generation, process start-up and the
//! first-call costs cancel (nothing but the kernel may grow with `N`). Besides a checksum (so nothing is optimised away) it prints the FLOPs and the
//! bytes of one unit, for the arithmetic intensity in the README.

use std::process::ExitCode;

use half::bf16;
use kda_core::ops::chunked::{chunked_head, chunked_scratch_len, Chunks, MAX_CHUNK};
use kda_core::ops::HeadRows;
use kda_core::GateProj;
use kda_core::{CachesMut, ForwardOptions, Isa, KdaConfig, KdaLayer, Serial, DEFAULT_CHUNK};
use kda_host::bench::{decode_bytes_per_step, flops_per_token, Preset};
use kda_host::panels::Panels;
use kda_host::rng::Rng;
use kda_host::{OwnedData, OwnedGate, OwnedLayer, OwnedMat};

/// Head dimension of the prefill core (Kimi Linear and Kimi K3: K = V = 128).
const HEAD: usize = 128;
/// Largest `N` accepted (a guard against a typo that would run for hours under QEMU).
const MOST_UNITS: usize = 1000;
/// Chunks of prefill input drawn whatever `N` is (so input generation cancels in the
/// difference of two counts), and so the largest `N` for `prefill`.
const PREFILL_INPUT_CHUNKS: usize = 8;

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("insn_probe: {e}");
            eprintln!(
                "usage: insn_probe ISA decode N | insn_probe ISA decode-rows N | insn_probe ISA prefill N [CHUNK]"
            );
            ExitCode::from(2)
        }
    }
}

fn run(args: Vec<String>) -> Result<(), String> {
    let [isa, what, n, rest @ ..] = args.as_slice() else {
        return Err("expected at least 3 arguments".into());
    };
    let isa = parse_isa(isa)?;
    let n = parse_count(n, "N", MOST_UNITS)?;
    println!(
        "isa {isa:?} (supported here: {:?})",
        Isa::all_supported().collect::<Vec<_>>()
    );
    match (what.as_str(), rest) {
        ("decode", []) => decode(isa, n, Layout::Panels),
        ("decode-rows", []) => decode(isa, n, Layout::Rows),
        ("prefill", []) => prefill(isa, n, DEFAULT_CHUNK),
        ("prefill", [c]) => prefill(isa, n, parse_count(c, "CHUNK", MAX_CHUNK)?),
        _ => Err(format!(
            "unknown workload or extra arguments: {what} {rest:?}"
        )),
    }
}

/// `portable`, `best`, or a supported path's `Debug` name, case-insensitive.
fn parse_isa(name: &str) -> Result<Isa, String> {
    match name.to_ascii_lowercase().as_str() {
        "portable" => Ok(Isa::Portable),
        "best" => Ok(Isa::detect()),
        lower => Isa::all_supported()
            .find(|i| format!("{i:?}").to_ascii_lowercase() == lower)
            .ok_or_else(|| {
                format!(
                    "ISA {name:?} is unknown or not supported by this CPU (supported: {:?})",
                    Isa::all_supported().collect::<Vec<_>>()
                )
            }),
    }
}

fn parse_count(s: &str, what: &str, most: usize) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if (1..=most).contains(&v) => Ok(v),
        _ => Err(format!(
            "{what} must be an integer from 1 to {most}, got {s:?}"
        )),
    }
}

/// How the bf16 weights are laid out for decode.
#[derive(Debug, Clone, Copy)]
enum Layout {
    /// 16-row panels (what `kda` loads checkpoints into by default, and `kda bench` times).
    Panels,
    /// The checkpoint's row-major layout, used in place (`--layout rows`).
    Rows,
}

/// `n` decode steps of one Kimi Linear layer for one sequence.
fn decode(isa: Isa, n: usize, layout: Layout) -> Result<(), String> {
    let cfg = Preset::KimiLinear.config();
    let owned = cheap_layer(cfg);
    let opts = ForwardOptions {
        isa: Some(isa),
        ..ForwardOptions::recurrent()
    };
    let base = owned.weights().map_err(|e| e.to_string())?;
    let panels;
    let weights = match layout {
        Layout::Panels => {
            panels = Panels::new(&base).map_err(|e| e.to_string())?;
            panels.weights(&base).map_err(|e| e.to_string())?
        }
        Layout::Rows => base,
    };
    let layer = KdaLayer::new(&cfg, weights, opts).map_err(|e| e.to_string())?;
    let len = |r: Result<usize, kda_core::KdaError>| r.map_err(|e| e.to_string());
    let mut state = vec![0.0f32; len(cfg.state_len())?];
    let conv = len(cfg.conv_state_len())?;
    let (mut cq, mut ck, mut cv) = (vec![0.0f32; conv], vec![0.0f32; conv], vec![0.0f32; conv]);
    let mut ws = vec![0.0f32; len(layer.decode_workspace_len(1, 1))?];
    let x = Rng::new(11).normals(cfg.hidden, 1.0);
    let mut out = vec![0.0f32; cfg.hidden];
    for _ in 0..n {
        let caches = CachesMut {
            recurrent: &mut state,
            conv_q: &mut cq,
            conv_k: &mut ck,
            conv_v: &mut cv,
        };
        layer
            .decode_step(&x, &mut out, caches, &mut ws, &Serial)
            .map_err(|e| e.to_string())?;
    }
    println!("workload decode: {n} step(s), Kimi Linear layer, bf16 weights ({layout:?} layout), batch 1");
    println!("unit token");
    println!("flops_per_unit {:.0}", flops_per_token(&owned));
    println!("bytes_per_unit {:.0}", decode_bytes_per_step(&owned, 1));
    report_checksum(checksum(&out))
}

/// A bf16 layer with the weight scales of [`OwnedLayer::random`] (uniform instead of normal
/// draws, from a xorshift generator): `OwnedLayer::random` costs about 8·10⁹ emulated
/// instructions at the Kimi Linear size, 30 s per run under QEMU, while this costs a tenth of
/// that. The counts of the kernels do not depend on the values.
fn cheap_layer(cfg: KdaConfig) -> OwnedLayer {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    // Uniform in (−a, a): variance a²/3, so a = √3·σ matches a normal draw of scale σ.
    let mut draws = move |n: usize, sigma: f32| -> Vec<bf16> {
        let a = 3f32.sqrt() * sigma;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let u = (x >> 40) as f32 / (1u64 << 24) as f32;
                bf16::from_f32(a * (2.0 * u - 1.0))
            })
            .collect()
    };
    let mut mat = |rows: usize, cols: usize| OwnedMat {
        data: OwnedData::Bf16(draws(rows * cols, 1.0 / (cols as f32).sqrt())),
        rows,
        cols,
    };
    let (hd, d, h) = (cfg.hidden, cfg.proj_dim(), cfg.heads);
    let mut gate = |form: GateProj| match form {
        GateProj::FullRank => OwnedGate::FullRank(mat(d, hd)),
        GateProj::LowRank { rank } => OwnedGate::LowRank(mat(rank, hd), mat(d, rank)),
    };
    let (decay_proj, output_gate) = (gate(cfg.decay_proj), gate(cfg.output_gate));
    let (qkv, b_proj, o_proj) = ([mat(d, hd), mat(d, hd), mat(d, hd)], mat(h, hd), mat(hd, d));
    let w = cfg.conv_width;
    let conv = [0, 1, 2].map(|_| OwnedData::Bf16(draws(d * w, 0.5)));
    let o_norm = draws(cfg.head_dim, 0.1)
        .iter()
        .map(|v| bf16::from_f32(1.0 + v.to_f32()))
        .collect();
    OwnedLayer {
        cfg,
        qkv,
        conv,
        // A = e^{A_log} in [1, 16] as the random layer; dt_bias for dt ≈ 0.01 (softplus⁻¹).
        a_log: Some(OwnedData::F32(
            (0..h).map(|i| (1.0 + (i % 16) as f32).ln()).collect(),
        )),
        dt_bias: Some(OwnedData::F32(vec![-4.6; d])),
        decay_proj,
        b_proj,
        output_gate,
        o_norm: OwnedData::Bf16(o_norm),
        o_proj,
    }
}

/// The chunked core of one head over `n` chunks of `c` tokens. The inputs are drawn for
/// [`PREFILL_INPUT_CHUNKS`] chunks whatever `n` is: drawing them (Box–Muller normals) costs
/// more instructions than the kernel, so it must not grow with `n`.
fn prefill(isa: Isa, n: usize, c: usize) -> Result<(), String> {
    if n > PREFILL_INPUT_CHUNKS {
        return Err(format!(
            "prefill runs at most {PREFILL_INPUT_CHUNKS} chunks, got N = {n}"
        ));
    }
    let drawn = PREFILL_INPUT_CHUNKS * c;
    let mut rng = Rng::new(5);
    let mut unit_rows = |rows: usize| {
        let mut m = rng.normals(rows * HEAD, 1.0);
        for row in m.chunks_mut(HEAD) {
            let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
            row.iter_mut().for_each(|v| *v /= norm);
        }
        m
    };
    let (q, k) = (unit_rows(drawn), unit_rows(drawn));
    let mut v = rng.normals(drawn * HEAD, 1.0);
    // Log-decays in (−5, 0) (the bounded gate's range) and write strengths in (0, 1).
    let g: Vec<f32> = (0..drawn * HEAD).map(|_| -5.0 * rng.uniform()).collect();
    let beta: Vec<f32> = (0..drawn).map(|_| rng.uniform()).collect();
    let t = n * c;
    let mut state = vec![0.0f32; HEAD * HEAD];
    let mut scratch = vec![0.0f32; chunked_scratch_len(c, HEAD, HEAD)];
    let rows = HeadRows {
        q: &q[..t * HEAD],
        k: &k[..t * HEAD],
        g: &g[..t * HEAD],
        beta: &beta[..t],
        v_o: &mut v[..t * HEAD],
        state: &mut state,
        scale: 1.0 / (HEAD as f32).sqrt(),
    };
    chunked_head(isa, rows, Chunks::of(c), &mut scratch).map_err(|e| e.to_string())?;
    let (kf, cf) = (HEAD as f64, c as f64);
    // Multiply-adds of one chunk (ops/chunked/): the two S₀ products and the state update
    // (3·C·K·V), A_kk and A_qk (C²·K), the forward substitution and A_qk·Δ (C²·V).
    let macs = 3.0 * cf * kf * kf + cf * cf * kf + cf * cf * kf;
    // Bytes in and out of one chunk: q, k, g in, v in and out ([C, K] f32 each), β, and the
    // state read and written (when it does not stay in cache between chunks).
    let bytes = 4.0 * (5.0 * cf * kf + cf + 2.0 * kf * kf);
    println!("workload prefill: {n} chunk(s) of {c} tokens, one head, K = V = {HEAD}");
    println!("unit chunk");
    println!("flops_per_unit {:.0}", 2.0 * macs);
    println!("bytes_per_unit {bytes:.0}");
    report_checksum(checksum(&v) + checksum(&state))
}

/// Prints the checksum (so the work is not optimised away); a non-finite one is an error.
fn report_checksum(sum: f64) -> Result<(), String> {
    println!("checksum {sum:e}");
    if sum.is_finite() {
        Ok(())
    } else {
        Err(format!("the outputs are not finite (checksum {sum})"))
    }
}

fn checksum(v: &[f32]) -> f64 {
    v.iter().map(|&x| f64::from(x)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_checked() {
        assert!(parse_isa("portable").is_ok());
        assert!(parse_isa("best").is_ok());
        assert!(parse_isa("no-such-isa").is_err());
        assert_eq!(parse_count("3", "N", 10), Ok(3));
        assert!(parse_count("0", "N", 10).is_err());
        assert!(parse_count("11", "N", 10).is_err());
        assert!(parse_count("x", "N", 10).is_err());
        assert!(run(vec!["portable".into(), "train".into(), "1".into()]).is_err());
    }

    #[test]
    fn prefill_runs_on_every_path() {
        for isa in Isa::all_supported() {
            assert_eq!(prefill(isa, 2, 16), Ok(()));
        }
        assert!(prefill(Isa::Portable, PREFILL_INPUT_CHUNKS + 1, 16).is_err());
    }
}
