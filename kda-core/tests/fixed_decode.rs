//! The integer-only decode path over 1000 decode steps, with the lower-bound gate and with the
//! softplus gate: output error against the f32 path with the same int8 weights (the target is
//! rel-RMS ≤ 1e-2) and against f32 weights; no drift; cache hand-over from a float prefill; the
//! errors it reports. Run with `--nocapture` for the figures.

mod common;

use common::{rel_rms, Layer, Quantised};
use kda_core::fixed::{self, from_q, slice_to_q, ACT_FRAC, STATE_FRAC};
use kda_core::{
    Batch, CachesMut, DecayGate, FixedCachesMut, ForwardOptions, GateProj, InitialCaches,
    KdaConfig, KdaError, KdaLayer, KdaWeights, Serial,
};

const STEPS: usize = 1000;

/// The embedded example's layer shape (hidden 64, 2 heads × 16) with the given gate.
fn example(gate: DecayGate) -> KdaConfig {
    let mut c = KdaConfig::kimi_k3(64, 2, 16);
    c.decay_gate = gate;
    c.decay_proj = GateProj::LowRank { rank: 16 };
    c.output_gate = GateProj::FullRank;
    c
}

/// A wider Kimi-Linear-style layer (low-rank output gate).
fn wider(gate: DecayGate) -> KdaConfig {
    let mut c = KdaConfig::kimi_linear(128, 4, 32);
    c.decay_gate = gate;
    c
}

/// Input tokens on the Q15.16 grid, uniform in [−2, 2).
fn inputs(cfg: &KdaConfig, seed: u64) -> Vec<i32> {
    let mut r = common::Rng(seed);
    (0..STEPS * cfg.hidden)
        .map(|_| ((r.next_u64() >> 46) as i32) - (1 << 17))
        .collect()
}

fn float_decode(cfg: &KdaConfig, w: &KdaWeights<'_>, xq: &[i32]) -> Vec<f32> {
    let hd = cfg.hidden;
    let mut st = vec![0.0; cfg.state_len().unwrap()];
    let mut cv = [0, 1, 2].map(|_| vec![0.0; cfg.conv_state_len().unwrap()]);
    let mut ws = vec![0.0; kda_core::decode_workspace_len(cfg, 1).unwrap()];
    let mut out = vec![0.0; xq.len()];
    let layer = KdaLayer::new(cfg, *w, ForwardOptions::recurrent()).unwrap();
    for t in 0..xq.len() / hd {
        let x: Vec<f32> = xq[t * hd..(t + 1) * hd]
            .iter()
            .map(|&v| from_q(v, ACT_FRAC))
            .collect();
        let [a, b, c] = &mut cv;
        let caches = CachesMut {
            recurrent: &mut st,
            conv_q: a,
            conv_k: b,
            conv_v: c,
        };
        let out = &mut out[t * hd..(t + 1) * hd];
        layer
            .decode_step(&x, out, caches, &mut ws, &Serial)
            .unwrap();
    }
    out
}

struct FixedState {
    st: Vec<i32>,
    conv: [Vec<i32>; 3],
}

impl FixedState {
    fn zero(cfg: &KdaConfig) -> Self {
        FixedState {
            st: vec![0; cfg.state_len().unwrap()],
            conv: [0, 1, 2].map(|_| vec![0; cfg.conv_state_len().unwrap()]),
        }
    }
}

fn fixed_decode(cfg: &KdaConfig, w: &KdaWeights<'_>, xq: &[i32], s: &mut FixedState) -> Vec<f32> {
    let hd = cfg.hidden;
    let mut params = vec![0; fixed::params_len(cfg).unwrap()];
    let fw = fixed::prepare(cfg, w, &mut params).unwrap();
    let mut ws = vec![0; kda_core::fixed_workspace_len(cfg).unwrap()];
    let mut oq = vec![0; hd];
    let mut out = Vec::with_capacity(xq.len());
    for x in xq.chunks_exact(hd) {
        let [a, b, c] = &mut s.conv;
        let caches = FixedCachesMut {
            recurrent: &mut s.st,
            conv_q: a,
            conv_k: b,
            conv_v: c,
        };
        kda_core::decode_step_fixed(cfg, &fw, x, caches, &mut oq, &mut ws).unwrap();
        out.extend(oq.iter().map(|&v| from_q(v, ACT_FRAC)));
    }
    out
}

#[test]
fn thousand_decode_steps_both_gates() {
    println!(
        "{:<34} {:>14} {:>14} {:>14} {:>16}",
        "config", "fixed vs i8", "fixed vs f32", "i8 vs f32", "fixed vs i8 last 100"
    );
    for (name, cfg) in [
        (
            "example 64/2x16, lower bound",
            example(DecayGate::LowerBound(-5.0)),
        ),
        ("example 64/2x16, softplus", example(DecayGate::Softplus)),
        (
            "wider 128/4x32, lower bound",
            wider(DecayGate::LowerBound(-5.0)),
        ),
        ("wider 128/4x32, softplus", wider(DecayGate::Softplus)),
    ] {
        let layer = Layer::synthetic(cfg, 7);
        let w = layer.weights();
        let mut qb = Quantised::for_cfg(&cfg, true);
        let wq = kda_core::quantize_layer(&cfg, &w, &mut qb.q, &mut qb.s, true).unwrap();
        let xq = inputs(&cfg, 11);
        let f32_out = float_decode(&cfg, &w, &xq);
        let i8_out = float_decode(&cfg, &wq, &xq);
        let fixed_out = fixed_decode(&cfg, &wq, &xq, &mut FixedState::zero(&cfg));
        let tail = (STEPS - 100) * cfg.hidden;
        let e = [
            rel_rms(&fixed_out, &i8_out),
            rel_rms(&fixed_out, &f32_out),
            rel_rms(&i8_out, &f32_out),
            rel_rms(&fixed_out[tail..], &i8_out[tail..]),
        ];
        println!(
            "{name:<34} {:>14.2e} {:>14.2e} {:>14.2e} {:>16.2e}",
            e[0], e[1], e[2], e[3]
        );
        assert!(e[0] <= 1e-2, "{name}: fixed vs f32 path {}", e[0]);
        // Measured ≤ 3e-4: an order of magnitude of margin, and no drift at the end.
        assert!(e[0] <= 3e-3 && e[3] <= 3e-3, "{name}: {e:?}");
        // Bitwise reproducible.
        let again = fixed_decode(&cfg, &wq, &xq, &mut FixedState::zero(&cfg));
        assert!(again
            .iter()
            .zip(&fixed_out)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}

#[test]
fn float_prefill_hands_over_to_the_integer_path() {
    let cfg = example(DecayGate::LowerBound(-5.0));
    let layer = Layer::synthetic(cfg, 3);
    let w = layer.weights();
    let mut qb = Quantised::for_cfg(&cfg, true);
    let wq = kda_core::quantize_layer(&cfg, &w, &mut qb.q, &mut qb.s, true).unwrap();
    let xq = inputs(&cfg, 5);
    let hd = cfg.hidden;
    let (tp, td) = (32, 64);
    let x: Vec<f32> = xq[..(tp + td) * hd]
        .iter()
        .map(|&v| from_q(v, ACT_FRAC))
        .collect();

    // Reference: the float path over the prompt and the continuation.
    let mut st = vec![0.0; cfg.state_len().unwrap()];
    let mut cv = [0, 1, 2].map(|_| vec![0.0; cfg.conv_state_len().unwrap()]);
    let mut ws = vec![0.0; kda_core::forward_workspace_len(&cfg, tp + td).unwrap()];
    let mut want = vec![0.0; x.len()];
    let fwd = KdaLayer::new(&cfg, wq, ForwardOptions::default()).unwrap();
    {
        let [a, b, c] = &mut cv;
        let caches = CachesMut {
            recurrent: &mut st,
            conv_q: a,
            conv_k: b,
            conv_v: c,
        };
        let batch = Batch {
            x: &x,
            cu_seqlens: &[0, tp + td],
            out: &mut want,
        };
        fwd.forward(batch, caches, InitialCaches::Zero, &mut ws, &Serial)
            .unwrap();
    }
    // Float prefill of the prompt, caches converted, integer decode of the rest.
    st.fill(0.0);
    let mut prompt_out = vec![0.0; tp * hd];
    {
        let [a, b, c] = &mut cv;
        let caches = CachesMut {
            recurrent: &mut st,
            conv_q: a,
            conv_k: b,
            conv_v: c,
        };
        let batch = Batch {
            x: &x[..tp * hd],
            cu_seqlens: &[0, tp],
            out: &mut prompt_out,
        };
        fwd.forward(batch, caches, InitialCaches::Zero, &mut ws, &Serial)
            .unwrap();
    }
    let mut fs = FixedState::zero(&cfg);
    slice_to_q(&st, STATE_FRAC, &mut fs.st).unwrap();
    for (src, dst) in cv.iter().zip(fs.conv.iter_mut()) {
        slice_to_q(src, ACT_FRAC, dst).unwrap();
    }
    let got = fixed_decode(&cfg, &wq, &xq[tp * hd..(tp + td) * hd], &mut fs);
    let e = rel_rms(&got, &want[tp * hd..]);
    println!("float prefill → integer decode, {td} steps: rel-RMS {e:.2e}");
    assert!(e < 3e-3, "{e}");
}

#[test]
fn integer_path_rejects_what_it_cannot_run() {
    let cfg = example(DecayGate::LowerBound(-5.0));
    let layer = Layer::synthetic(cfg, 1);
    let w = layer.weights();
    let mut params = vec![0; fixed::params_len(&cfg).unwrap()];
    // f32 matrices: the integer path needs int8.
    assert!(matches!(
        fixed::prepare(&cfg, &w, &mut params),
        Err(KdaError::Weights { .. })
    ));
    let mut qb = Quantised::for_cfg(&cfg, false);
    let wq = kda_core::quantize_layer(&cfg, &w, &mut qb.q, &mut qb.s, false).unwrap();
    assert!(matches!(
        fixed::prepare(&cfg, &wq, &mut params[..10]),
        Err(KdaError::TooSmall { .. })
    ));
    let fw = fixed::prepare(&cfg, &wq, &mut params).unwrap();
    let mut s = FixedState::zero(&cfg);
    let mut ws = vec![0; kda_core::fixed_workspace_len(&cfg).unwrap()];
    let x = vec![0; cfg.hidden];
    let mut out = vec![0; cfg.hidden];
    let mut call = |cfg: &KdaConfig, x: &[i32], ws: &mut [i32]| {
        let [a, b, c] = &mut s.conv;
        let caches = FixedCachesMut {
            recurrent: &mut s.st,
            conv_q: a,
            conv_k: b,
            conv_v: c,
        };
        kda_core::decode_step_fixed(cfg, &fw, x, caches, &mut out, ws)
    };
    assert!(call(&cfg, &x, &mut ws).is_ok());
    let other = example(DecayGate::Softplus);
    assert!(matches!(
        call(&other, &x, &mut ws),
        Err(KdaError::Config { .. })
    ));
    assert!(matches!(
        call(&cfg, &x[..5], &mut ws),
        Err(KdaError::Length { .. })
    ));
    let n = ws.len() - 1;
    assert!(matches!(
        call(&cfg, &x, &mut ws[..n]),
        Err(KdaError::TooSmall { .. })
    ));
}
