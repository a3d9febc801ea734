//! Seeded property tests of identities the layer must satisfy exactly (bitwise): decode ==
//! forward, split-and-hand-over == whole, packed == separate, block size irrelevant, and the
//! K-first/V-first round trip.

use kda_conformance::random_caches;
use kda_conformance::{CpuHarness, Harness};
use kda_core::{
    k_first_to_v_first, v_first_to_k_first, DecayGate, GateProj, InitialCaches, KdaConfig,
};
use kda_host::rng::Rng;
use kda_host::{OwnedLayer, SequenceCaches, WeightDtype};
use proptest::prelude::*;

fn config() -> impl Strategy<Value = (KdaConfig, bool)> {
    (
        1usize..20, // hidden
        1usize..4,  // heads
        prop::sample::select(vec![1usize, 2, 4, 8, 16]),
        1usize..6,     // conv width
        any::<bool>(), // lower bound?
        any::<bool>(), // full-rank output gate?
        1usize..6,     // ranks
        any::<bool>(), // bf16 weights?
    )
        .prop_map(|(hidden, heads, k, w, lb, full, rank, bf16)| {
            (
                KdaConfig {
                    hidden,
                    heads,
                    head_dim: k,
                    conv_width: w,
                    decay_gate: if lb {
                        DecayGate::LowerBound(-5.0)
                    } else {
                        DecayGate::Softplus
                    },
                    decay_proj: GateProj::LowRank { rank },
                    output_gate: if full {
                        GateProj::FullRank
                    } else {
                        GateProj::LowRank { rank: rank + 1 }
                    },
                    rms_eps: 1e-5,
                    l2_eps: 1e-6,
                    scale: None,
                },
                bf16,
            )
        })
}

fn layer(cfg: KdaConfig, bf16: bool, seed: u64) -> OwnedLayer {
    let dtype = if bf16 {
        WeightDtype::Bf16
    } else {
        WeightDtype::F32
    };
    OwnedLayer::random(cfg, dtype, seed).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn decode_steps_equal_one_forward((cfg, bf16) in config(), t_len in 0usize..24, seed in any::<u64>()) {
        let l = layer(cfg, bf16, seed);
        let mut rng = Rng::new(seed ^ 1);
        let x = rng.normals(t_len * cfg.hidden, 1.0);
        let c0 = random_caches(&cfg, 1, &mut rng);
        let mut a = c0.clone();
        let whole = CpuHarness::recurrent(7).forward(&l, &x, &[0, t_len], &mut a, InitialCaches::Given).unwrap();
        let mut b = c0;
        let mut steps = Vec::new();
        for t in 0..t_len {
            steps.extend(CpuHarness::recurrent(1).decode(&l, &x[t * cfg.hidden..(t + 1) * cfg.hidden], &mut b).unwrap());
        }
        prop_assert_eq!(whole, steps);
        prop_assert_eq!(a, b);
    }

    #[test]
    fn split_and_hand_over_equals_whole((cfg, bf16) in config(), t_len in 1usize..40, cut in 0usize..40, seed in any::<u64>()) {
        let cut = cut % (t_len + 1);
        let l = layer(cfg, bf16, seed);
        let mut rng = Rng::new(seed ^ 2);
        let x = rng.normals(t_len * cfg.hidden, 1.0);
        let mut a = SequenceCaches::new(&cfg, 1).unwrap();
        let whole = CpuHarness::recurrent(64).forward(&l, &x, &[0, t_len], &mut a, InitialCaches::Zero).unwrap();
        let mut b = SequenceCaches::new(&cfg, 1).unwrap();
        let (x1, x2) = x.split_at(cut * cfg.hidden);
        let mut parts = CpuHarness::recurrent(5).forward(&l, x1, &[0, cut], &mut b, InitialCaches::Zero).unwrap();
        parts.extend(CpuHarness::recurrent(64).forward(&l, x2, &[0, t_len - cut], &mut b, InitialCaches::Given).unwrap());
        prop_assert_eq!(whole, parts);
        prop_assert_eq!(a, b);
    }

    #[test]
    fn packed_batch_equals_separate_runs((cfg, bf16) in config(), lens in prop::collection::vec(0usize..9, 1..5), seed in any::<u64>()) {
        let l = layer(cfg, bf16, seed);
        let mut rng = Rng::new(seed ^ 3);
        let mut cu = vec![0];
        for n in &lens { cu.push(cu.last().unwrap() + n); }
        let t_len = *cu.last().unwrap();
        let x = rng.normals(t_len * cfg.hidden, 1.0);
        let c0 = random_caches(&cfg, lens.len(), &mut rng);
        let mut packed_caches = c0.clone();
        let packed = CpuHarness::recurrent(4).forward(&l, &x, &cu, &mut packed_caches, InitialCaches::Given).unwrap();
        let (s, c) = (cfg.state_len().unwrap(), cfg.conv_state_len().unwrap());
        for n in 0..lens.len() {
            let mut one = SequenceCaches::new(&cfg, 1).unwrap();
            one.recurrent.copy_from_slice(&c0.recurrent[n * s..(n + 1) * s]);
            one.conv_q.copy_from_slice(&c0.conv_q[n * c..(n + 1) * c]);
            one.conv_k.copy_from_slice(&c0.conv_k[n * c..(n + 1) * c]);
            one.conv_v.copy_from_slice(&c0.conv_v[n * c..(n + 1) * c]);
            let xs = &x[cu[n] * cfg.hidden..cu[n + 1] * cfg.hidden];
            let y = CpuHarness::recurrent(64).forward(&l, xs, &[0, lens[n]], &mut one, InitialCaches::Given).unwrap();
            prop_assert_eq!(&y[..], &packed[cu[n] * cfg.hidden..cu[n + 1] * cfg.hidden]);
            prop_assert_eq!(&one.recurrent[..], &packed_caches.recurrent[n * s..(n + 1) * s]);
            prop_assert_eq!(&one.conv_v[..], &packed_caches.conv_v[n * c..(n + 1) * c]);
        }
    }

    #[test]
    fn k_first_v_first_round_trip_is_exact(k in 1usize..9, v in 1usize..9, blocks in 0usize..5, seed in any::<u64>()) {
        let src = Rng::new(seed).normals(blocks * k * v, 1.0);
        let mut vf = vec![0.0; src.len()];
        let mut back = vec![0.0; src.len()];
        k_first_to_v_first(&src, &mut vf, k, v).unwrap();
        v_first_to_k_first(&vf, &mut back, k, v).unwrap();
        prop_assert_eq!(&src, &back);
        for b in 0..blocks {
            for d in 0..k {
                for e in 0..v {
                    prop_assert_eq!(src[b * k * v + d * v + e], vf[b * k * v + e * k + d]);
                }
            }
        }
    }
}

/// The V-first state, used with the transposed recurrence (`p = S_vf·k`, `S_vf += δ kᵀ`,
/// `o = S_vf·q`), gives the same outputs as the K-first layer, so converting a fla/vLLM cache
/// with `v_first_to_k_first` is all a caller needs.
#[test]
fn v_first_math_agrees_after_conversion() {
    let (k, v) = (4usize, 4usize);
    let mut rng = Rng::new(9);
    let s_kf = rng.normals(k * v, 1.0);
    let (q, kk, g) = (
        rng.normals(k, 0.5),
        rng.normals(k, 0.5),
        rng.normals(k, 0.1),
    );
    let g: Vec<f32> = g.iter().map(|x| -x.abs()).collect();
    let vv = rng.normals(v, 1.0);
    let mut s_vf = vec![0.0; k * v];
    k_first_to_v_first(&s_kf, &mut s_vf, k, v).unwrap();
    // Transposed step on the V-first state, in f64.
    let mut sv: Vec<f64> = s_vf.iter().map(|&x| x as f64).collect();
    for e in 0..v {
        for d in 0..k {
            sv[e * k + d] *= (g[d] as f64).exp();
        }
    }
    let beta = 0.6f64;
    let delta: Vec<f64> = (0..v)
        .map(|e| beta * (vv[e] as f64 - (0..k).map(|d| sv[e * k + d] * kk[d] as f64).sum::<f64>()))
        .collect();
    for e in 0..v {
        for d in 0..k {
            sv[e * k + d] += delta[e] * kk[d] as f64;
        }
    }
    let o_vf: Vec<f64> = (0..v)
        .map(|e| (0..k).map(|d| sv[e * k + d] * q[d] as f64).sum())
        .collect();
    let mut s = s_kf.clone();
    let mut vin = vv.clone();
    let mut o = vec![0.0; v];
    kda_core::ops::recurrent::delta_rule_step(
        kda_core::ops::HeadRows {
            q: &q,
            k: &kk,
            g: &g,
            beta: &[beta as f32],
            v_o: &mut vin,
            state: &mut s,
            scale: 1.0,
        },
        &mut o,
    )
    .unwrap();
    for e in 0..v {
        assert!((o[e] as f64 - o_vf[e]).abs() < 1e-5);
    }
    let mut s_back = vec![0.0; k * v];
    let svf32: Vec<f32> = sv.iter().map(|&x| x as f32).collect();
    v_first_to_k_first(&svf32, &mut s_back, k, v).unwrap();
    for i in 0..k * v {
        assert!((s_back[i] - s[i]).abs() < 1e-5);
    }
}
