//! Int8 weights ([`Data::I8`]) on every path of the core: recurrent, chunked and auto forward,
//! every kernel ISA this CPU has, the decode step and `ops::linear`. Each must agree with the
//! f32 path run on the dequantised weights (`q · scale` rounded to f32) to f32 rounding.

mod common;

use common::{rel_rms, Layer, Quantised};
use kda_core::ops::linear;
use kda_core::{
    Batch, CachesMut, Data, DecayGate, ForwardOptions, GateProj, InitialCaches, Isa, KdaConfig,
    KdaLayer, MatRef, Mode, Serial,
};

fn configs() -> [KdaConfig; 2] {
    let mut a = KdaConfig::kimi_k3(48, 3, 16);
    a.decay_proj = GateProj::LowRank { rank: 16 };
    let mut b = KdaConfig::kimi_linear(40, 2, 8);
    b.decay_gate = DecayGate::Softplus;
    [a, b]
}

/// The layer with every int8 tensor replaced by its dequantised f32 values.
fn dequantised(layer: &Layer, wq: &kda_core::KdaWeights<'_>) -> Layer {
    let mut t = layer.t.clone();
    let deq = |d: Data<'_>| {
        (0..d.len())
            .map(|i| d.get(i).unwrap())
            .collect::<Vec<f32>>()
    };
    t.insert("q_proj.weight".into(), deq(wq.q_proj.data()));
    t.insert("k_proj.weight".into(), deq(wq.k_proj.data()));
    t.insert("v_proj.weight".into(), deq(wq.v_proj.data()));
    t.insert("b_proj.weight".into(), deq(wq.b_proj.data()));
    t.insert("o_proj.weight".into(), deq(wq.o_proj.data()));
    t.insert("q_conv1d.weight".into(), deq(wq.q_conv));
    t.insert("k_conv1d.weight".into(), deq(wq.k_conv));
    t.insert("v_conv1d.weight".into(), deq(wq.v_conv));
    for (g, names) in [
        (
            wq.decay_proj,
            ["f_proj.weight", "f_a_proj.weight", "f_b_proj.weight"],
        ),
        (
            wq.output_gate,
            ["g_proj.weight", "g_a_proj.weight", "g_b_proj.weight"],
        ),
    ] {
        match g {
            kda_core::GateWeights::FullRank(m) => {
                t.insert(names[0].into(), deq(m.data()));
            }
            kda_core::GateWeights::LowRank { down, up } => {
                t.insert(names[1].into(), deq(down.data()));
                t.insert(names[2].into(), deq(up.data()));
            }
        }
    }
    Layer { cfg: layer.cfg, t }
}

#[test]
fn int8_weights_match_dequantised_f32_on_every_path() {
    for cfg in configs() {
        let layer = Layer::synthetic(cfg, 42);
        let w = layer.weights();
        let mut qb = Quantised::for_cfg(&cfg, true);
        let wq = kda_core::quantize_layer(&cfg, &w, &mut qb.q, &mut qb.s, true).unwrap();
        assert!(matches!(wq.q_proj.data(), Data::I8 { .. }));
        let deq = dequantised(&layer, &wq);
        let wd = deq.weights();
        let mut r = common::Rng(9);
        let t = 37;
        let x: Vec<f32> = (0..t * cfg.hidden).map(|_| r.uniform() * 2.0).collect();
        let cu = [0, 5, 6, t];
        let modes = [Mode::Recurrent, Mode::Chunked, Mode::Auto];
        for isa in Isa::all_supported() {
            for mode in modes {
                let opts = ForwardOptions {
                    mode,
                    chunk_size: 16,
                    isa: Some(isa),
                    ..ForwardOptions::default()
                };
                let mut outs = Vec::new();
                for ww in [wq, wd] {
                    let kda = KdaLayer::new(&cfg, ww, opts).unwrap();
                    let mut st = vec![0.0; 3 * cfg.state_len().unwrap()];
                    let mut cv = [0, 1, 2].map(|_| vec![0.0; 3 * cfg.conv_state_len().unwrap()]);
                    let mut ws = vec![0.0; kda_core::workspace_len(&cfg, &opts, t, 1).unwrap()];
                    let mut out = vec![0.0; x.len()];
                    let [a, b, c] = &mut cv;
                    let caches = CachesMut {
                        recurrent: &mut st,
                        conv_q: a,
                        conv_k: b,
                        conv_v: c,
                    };
                    let batch = Batch {
                        x: &x,
                        cu_seqlens: &cu,
                        out: &mut out,
                    };
                    kda.forward(batch, caches, InitialCaches::Zero, &mut ws, &Serial)
                        .unwrap();
                    // Then one decode step for each of the three sequences.
                    let xd = &x[..3 * cfg.hidden];
                    let mut od = vec![0.0; xd.len()];
                    let [a, b, c] = &mut cv;
                    let caches = CachesMut {
                        recurrent: &mut st,
                        conv_q: a,
                        conv_k: b,
                        conv_v: c,
                    };
                    kda.decode_step(xd, &mut od, caches, &mut ws, &Serial)
                        .unwrap();
                    out.extend(od);
                    outs.push(out);
                }
                let e = rel_rms(&outs[0], &outs[1]);
                assert!(e < 2e-6, "{cfg:?} {isa:?} {mode:?}: {e}");
            }
        }
    }
}

#[test]
fn linear_with_int8_rows() {
    let (rows, n_in, n_out) = (3, 70, 9);
    let mut r = common::Rng(5);
    let x: Vec<f32> = (0..rows * n_in).map(|_| r.uniform()).collect();
    let wf: Vec<f32> = (0..n_out * n_in).map(|_| r.normal()).collect();
    let (mut q, mut s) = (vec![0i8; wf.len()], vec![0.0f32; n_out]);
    kda_core::quantize_rows(Data::F32(&wf), n_out, &mut q, &mut s).unwrap();
    let d = Data::I8 {
        data: &q,
        scales: &s,
    };
    let m = MatRef::new("w", d, n_out, n_in).unwrap();
    let mut out = vec![0.0; rows * n_out];
    linear(&x, &m, &mut out).unwrap();
    for t in 0..rows {
        for o in 0..n_out {
            let want: f64 = (0..n_in)
                .map(|i| x[t * n_in + i] as f64 * q[o * n_in + i] as f64 * s[o] as f64)
                .sum();
            assert!((out[t * n_out + o] as f64 - want).abs() < 1e-5, "{t} {o}");
        }
    }
    // A malformed int8 view is rejected by the shape check, never read.
    assert!(MatRef::new(
        "w",
        Data::I8 {
            data: &q,
            scales: &s[..4]
        },
        n_out,
        n_in
    )
    .is_err());
}
