//! The C entry points called from Rust: the same layer through `kda_layer_init` /
//! `kda_forward` / `kda_decode_step` and through kda-core directly gives the same bits.
#![allow(clippy::unwrap_used)]

mod common;

use kda_capi::*;
use kda_core::{Batch, CachesMut, Data, GateWeights, InitialCaches, MatRef, Serial};

use common::f32_tensor as t;

#[test]
fn forward_and_decode_match_the_core() {
    let (hd, h, k) = (12, 2, 4);
    let cfg_c = kda_config_kimi_linear(hd, h, k);
    let cfg = kda_core::KdaConfig::kimi_linear(hd, h, k);
    let d = h * k;
    let vals: Vec<f32> = (0..4096)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 200.0)
        .collect();
    let w = |n: usize, off: usize| &vals[off..off + n];
    let (qp, kp, vp) = (w(d * hd, 0), w(d * hd, 100), w(d * hd, 200));
    let conv = w(d * 4, 300);
    let a_log = w(h, 400);
    let (fa, fb, b, ga, gb) = (
        w(k * hd, 500),
        w(d * k, 600),
        w(h * hd, 700),
        w(k * hd, 800),
        w(d * k, 900),
    );
    let (o_norm, o_proj) = (w(k, 1000), w(hd * d, 1100));
    let weights_c = KdaWeights {
        q_proj: t(qp),
        k_proj: t(kp),
        v_proj: t(vp),
        q_conv: t(conv),
        k_conv: t(conv),
        v_conv: t(conv),
        a_log: t(a_log),
        dt_bias: t(&[]),
        decay_proj: t(fa),
        decay_up: t(fb),
        b_proj: t(b),
        gate_proj: t(ga),
        gate_up: t(gb),
        o_norm: t(o_norm),
        o_proj: t(o_proj),
    };
    let m = |v: &'static [f32], r, c| MatRef::new("w", Data::F32(v), r, c).unwrap();
    let leak = |v: &[f32]| -> &'static [f32] { Vec::leak(v.to_vec()) };
    let weights = kda_core::KdaWeights {
        q_proj: m(leak(qp), d, hd),
        k_proj: m(leak(kp), d, hd),
        v_proj: m(leak(vp), d, hd),
        q_conv: Data::F32(conv),
        k_conv: Data::F32(conv),
        v_conv: Data::F32(conv),
        a_log: Some(Data::F32(a_log)),
        dt_bias: None,
        decay_proj: GateWeights::LowRank {
            down: m(leak(fa), k, hd),
            up: m(leak(fb), d, k),
        },
        b_proj: m(leak(b), h, hd),
        output_gate: GateWeights::LowRank {
            down: m(leak(ga), k, hd),
            up: m(leak(gb), d, k),
        },
        o_norm: Data::F32(o_norm),
        o_proj: m(leak(o_proj), hd, d),
    };
    let layer = kda_core::KdaLayer::new(&cfg, weights, Default::default()).unwrap();

    let mut handle = KdaLayer {
        opaque: [0; KDA_LAYER_WORDS],
    };
    // SAFETY: every pointer refers to live buffers of the stated lengths.
    unsafe {
        assert_eq!(
            kda_layer_init(&mut handle, &cfg_c, &weights_c, std::ptr::null()),
            KdaStatus::Ok
        );
    }
    let tokens = 19;
    let x: Vec<f32> = (0..tokens * hd).map(|i| (i as f32 * 0.37).sin()).collect();
    let cu = [0usize, 12, 19];
    let (sl, cl) = (cfg.state_len().unwrap(), cfg.conv_state_len().unwrap());
    let ws_len = layer.workspace_len(12, 1).unwrap();
    let run_core = || {
        let (mut s, mut c) = (vec![0f32; 2 * sl], vec![vec![0f32; 2 * cl]; 3]);
        let (mut out, mut ws) = (vec![0f32; x.len()], vec![0f32; ws_len]);
        let [cq, ck, cv] = &mut c[..] else { panic!() };
        let mut caches = CachesMut {
            recurrent: &mut s,
            conv_q: cq,
            conv_k: ck,
            conv_v: cv,
        };
        let batch = Batch {
            x: &x,
            cu_seqlens: &cu,
            out: &mut out,
        };
        layer
            .forward(
                batch,
                caches.reborrow(),
                InitialCaches::Zero,
                &mut ws,
                &Serial,
            )
            .unwrap();
        let mut dec = vec![0f32; 2 * hd];
        layer
            .decode_step(&x[..2 * hd], &mut dec, caches, &mut ws, &Serial)
            .unwrap();
        (out, dec, s)
    };
    let run_c = || {
        let (mut s, mut c) = (vec![0f32; 2 * sl], vec![vec![0f32; 2 * cl]; 3]);
        let (mut out, mut ws) = (vec![0f32; x.len()], vec![0f32; ws_len]);
        let caches = KdaCaches {
            recurrent: s.as_mut_ptr(),
            recurrent_len: s.len(),
            conv_q: c[0].as_mut_ptr(),
            conv_q_len: 2 * cl,
            conv_k: c[1].as_mut_ptr(),
            conv_k_len: 2 * cl,
            conv_v: c[2].as_mut_ptr(),
            conv_v_len: 2 * cl,
        };
        let batch = KdaBatch {
            x: x.as_ptr(),
            x_len: x.len(),
            cu_seqlens: cu.as_ptr(),
            cu_seqlens_len: cu.len(),
            out: out.as_mut_ptr(),
            out_len: out.len(),
        };
        let mut dec = vec![0f32; 2 * hd];
        let tok = KdaTokens {
            x: x.as_ptr(),
            x_len: 2 * hd,
            out: dec.as_mut_ptr(),
            out_len: dec.len(),
        };
        // SAFETY: every pointer refers to live, distinct buffers of the stated lengths.
        unsafe {
            let st = kda_forward(
                &handle,
                &batch,
                &caches,
                KDA_INIT_ZERO,
                ws.as_mut_ptr(),
                ws_len,
            );
            assert_eq!(st, KdaStatus::Ok);
            let st = kda_decode_step(&handle, &tok, &caches, ws.as_mut_ptr(), ws_len);
            assert_eq!(st, KdaStatus::Ok);
        }
        (out, dec, s)
    };
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let (a, b) = (run_core(), run_c());
    assert_eq!(bits(&a.0), bits(&b.0), "prefill");
    assert_eq!(bits(&a.1), bits(&b.1), "decode");
    assert_eq!(bits(&a.2), bits(&b.2), "state");
    assert!(a.0.iter().all(|v| v.is_finite()));
}
